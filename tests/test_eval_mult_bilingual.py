"""xmlm-eval-mult on a tiny real bilingual_mlm checkpoint (Bible en-fr, Sep-Emb + Sep-L1): parallel-verse retrieval,
dictionary translation, per-language perplexity, and bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TIMEOUT, fairseq_train, expect_cli_error
from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.evaluation import eval_mult
from fairseq_xmlm.evaluation.multilinguality import precision_at_1
from fairseq_xmlm.evaluation.scores import word_symbols

LAYERS = ["--layers", "0", "2"]
TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--tokens-per-sample", "64"]


@pytest.fixture(scope="module")
def checkpoint(bible_en_fr_data, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("bilingual_ckpt")
    fairseq_train(bible_en_fr_data, save_dir, "--task", "bilingual_mlm", "--langs", "en,fr", *TINY, "--sep-emb",
                  "--sep-layers", "1-1", "--valid-subset", "valid_en", updates=4, batch_size=8)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def muse_file(checkpoint, bible_en_fr_data, tmp_path_factory):
    """A small en->fr dictionary of words that are single pieces on both sides, plus one pair that is not."""
    _, task, _ = load_checkpoint(checkpoint, data=bible_en_fr_data)
    english, french = word_symbols(task, 0), word_symbols(task, 1)
    pairs = [("the", "le"), ("the", "la"), ("and", "et"), ("he", "il"), ("in", "dans"), ("Jesus", "Jésus"),
             ("you", "vous"), ("said", "dit")]
    usable = [(a, b) for a, b in pairs if a in english and b in french]
    assert len(usable) >= 5  # the test is about these: they must be one symbol each in this vocabulary
    path = tmp_path_factory.mktemp("dict") / "en-fr.txt"
    path.write_text("".join(f"{a} {b}\n" for a, b in usable) + "Tetrarchy tétrarchie\n", encoding="utf-8")
    return path, len(usable)


@pytest.fixture(scope="module")
def evaluated(checkpoint, bible_en_fr_data, muse_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "eval.json"
    result = eval_mult.run([str(checkpoint), "--data", str(bible_en_fr_data), *LAYERS, "--dict", str(muse_file[0]),
                            "--json", str(out), "--max-train-sentences", "100"])
    return result, json.loads(out.read_text())


def test_json_schema_and_value_ranges(evaluated, checkpoint, muse_file, bible_en_fr_data):
    result, written = evaluated
    assert written == json.loads(json.dumps(result))
    assert set(written) == {"checkpoint", "task", "products", "mu", "mu_parts", "layers", "ppl", "ppl_per_lang",
                            "n_sentences", "n_words", "langs", "split", "dict"}
    assert written["task"] == "bilingual_mlm" and written["langs"] == ["en", "fr"] and written["split"] == "valid"
    n_verses = len((bible_en_fr_data / "verses.valid.txt").read_text().splitlines())
    assert written["n_sentences"] == n_verses > 20  # every Jonah verse, paired
    assert written["n_words"] == muse_file[1] and written["dict"]["pairs"] == muse_file[1] + 1
    assert set(written["layers"]) == {"0", "2"}
    for scores in written["layers"].values():
        assert scores["align_f1"] is None  # parallel verses have no gold word alignment
        assert 0.0 <= scores["retrieval"] <= 1.0 and 0.0 <= scores["translation"] <= 1.0
    assert written["mu_parts"] == ["tau0", "rho0", "tau2", "rho2"]
    assert written["mu"] == pytest.approx(sum(
        s["retrieval"] + s["translation"] for s in written["layers"].values()) / 4)


def test_perplexity_per_language_and_its_mean(evaluated):
    written = evaluated[1]
    per_lang = written["ppl_per_lang"]
    assert set(per_lang) == {"en", "fr"}
    for split in ("train", "valid"):
        assert all(1 < per_lang[lang][split] < 5000 for lang in per_lang)
        assert per_lang["en"][split] != per_lang["fr"][split]  # each language's own text through its own lang id
        assert written["ppl"][split] == pytest.approx((per_lang["en"][split] + per_lang["fr"][split]) / 2)


def test_without_a_dictionary_tau_is_null_and_mu_is_rho(checkpoint, bible_en_fr_data):
    """The console script on the test split: one summary line, tau null, mu the mean of rho."""
    command = [str(Path(sys.executable).parent / "xmlm-eval-mult"), str(checkpoint), "--data", str(bible_en_fr_data),
               "--layers", "1", "--split", "test", "--max-sentences", "30", "--max-train-sentences", "30", "--json",
               str(checkpoint.parent / "nodict.json")]
    finished = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-2000:]
    lines = finished.stdout.strip().splitlines()
    assert len(lines) == 1 and "L1 F1=- rho=" in lines[0] and "tau=-" in lines[0]
    written = json.loads((checkpoint.parent / "nodict.json").read_text())
    assert written["split"] == "test" and written["n_sentences"] == 30 and written["dict"] is None
    assert written["layers"]["1"]["translation"] is None and written["n_words"] is None
    assert written["mu_parts"] == ["rho1"] and written["mu"] == written["layers"]["1"]["retrieval"]


def test_translation_p_at_1_against_a_many_to_many_dictionary():
    """Forward, only source 0 has translations (candidates 0 and 1) and its nearest, candidate 0, is one: 1/1.
    Backward, candidate 2 is in no pair and asks nothing; candidate 0 finds source 0 (hit), candidate 1 finds
    source 1 (miss): 1/2."""
    sources = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    candidates = torch.tensor([[1.0, -0.2], [0.8, 1.0], [-1.0, 0.0]])
    gold = torch.tensor([[True, True, False], [False, False, False]])
    assert precision_at_1(sources, candidates, gold=gold) == pytest.approx((1 / 1 + 1 / 2) / 2)
    gold[1, 0] = True  # source 1 now asks too and finds candidate 1 (miss); candidate 0 still finds source 0
    assert precision_at_1(sources, candidates, gold=gold) == pytest.approx((1 / 2 + 1 / 2) / 2)


def test_a_dictionary_without_usable_pairs_is_refused(checkpoint, bible_en_fr_data, tmp_path, capsys):
    reversed_dict = tmp_path / "fr-en.txt"
    reversed_dict.write_text("Tetrarchy tétrarchie\nvous you\n", encoding="utf-8")  # no en word of one piece first
    expect_cli_error(capsys, eval_mult.main,
                     [str(checkpoint), "--data", str(bible_en_fr_data), "--dict", str(reversed_dict),
                          "--max-sentences", "5"], "none of the 2 dictionary pairs")
    expect_cli_error(capsys, eval_mult.main,
                     [str(checkpoint), "--data", str(bible_en_fr_data), "--dict", str(tmp_path / "none.txt")],
                 "does not exist")
    expect_cli_error(capsys, eval_mult.main, [str(checkpoint), "--data", str(bible_en_fr_data), "--padding",
                                              "attended"], "--padding is for fake_english checkpoints")


def test_data_of_other_languages_is_refused(checkpoint, bible_dir, tmp_path, capsys):
    from fairseq_xmlm.data.preparation import prepare_pair

    other = tmp_path / "en_de"
    prepare_pair(bible_dir, ["en", "de"], "joint", 300, other, train_books="Jonah", valid_books="Ruth",
                 test_books="Jude")
    expect_cli_error(capsys, eval_mult.main, [str(checkpoint), "--data", str(other)], "holds en, de but")


def test_conneau_table_rows_report_the_same_retrieval(evaluated, checkpoint, bible_en_fr_data):
    """The Table 1 driver scores every layer with eval-mult's retrieval (here on the same valid verses)."""
    from fairseq_xmlm.experiments.conneau.evaluate import retrieval_by_layer

    model, task, _ = load_checkpoint(checkpoint, data=bible_en_fr_data)
    by_layer = retrieval_by_layer(model, task, split="valid")
    assert list(by_layer) == ["0", "1", "2"]
    assert {layer: by_layer[layer] for layer in ("0", "2")} == {
        layer: scores["retrieval"] for layer, scores in evaluated[1]["layers"].items()}
