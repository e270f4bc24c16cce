"""Dufter & Schütze's Table 3 on the Bible: the recipe end to end on the CPU (tiny preset, real en/de/hi Bible text,
restart included), bilingual_mlm's per-language modifications, and the multilingual knn-replace table."""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
import torch

from fairseq_xmlm.analysis import knn_builder
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter_real import recipe as table3_recipe
from fairseq_xmlm.experiments.dufter_real.__main__ import main as table3_main
from conftest import expect_cli_error

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ["0-base", "3-base", "8-base", "30-base"]


def run_recipe(bible_dir, root, *extra):
    command = [sys.executable, "-m", "fairseq_xmlm.experiments.dufter_real", "tiny", "--slots", "2",
               "--corpus-dir", str(bible_dir), "--data-dir", str(root / "data"), "--checkpoint-root",
               str(root / "checkpoints"), "--results", str(root / "results"), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


@pytest.fixture(scope="module")
def table3(bible_dir, tmp_path_factory):
    """The tiny table, made in two sittings: the first ends after 3 of original's 6 updates and its result is
    deleted (as if interrupted before the evaluation); the second trains the rest and resumes original."""
    root = tmp_path_factory.mktemp("dufter_table3")
    run_recipe(bible_dir, root, "--settings", "0-base", "--train-args", "--max-update 3")
    (root / "results" / "0-base" / "seed1.json").unlink()
    log = run_recipe(bible_dir, root)
    return root, log


def test_table3_end_to_end_in_the_issues_schema(table3):
    root, log = table3
    summary = json.loads((root / "results" / "dufter_table3.json").read_text())
    assert set(summary) == {"updates", "seeds", "rows"}
    assert summary["updates"] == 6 and summary["seeds"] == [1]
    assert list(summary["rows"]) == SETTINGS
    for row in summary["rows"].values():
        assert set(row) == {"en", "de", "hi", "majority", "retrieval", "n"} and row["n"] == 1
        assert set(row["majority"]) == {"en", "de", "hi"} and set(row["retrieval"]) == {"de", "hi"}
        values = [row["en"], row["de"], row["hi"], *row["majority"].values(), *row["retrieval"].values()]
        assert all(isinstance(v, float) and 0 <= v <= 1 for v in values)
    result = json.loads((root / "results" / "3-base" / "seed1.json").read_text())
    assert set(result["curve"]) == {"en", "de", "hi"} and list(result["curve"]["de"]) == ["3", "6"]
    assert set(result["retrieval"]["hi"]) == {"0", "1", "2"}  # embeddings and the tiny model's two layers
    table = (root / "results" / "table3.md").read_text()
    assert "| 3-base | inv-order[de] |" in table and "| 8-base | lang-pos;shift-special;no-random |" in table
    assert (root / "results" / "curves.png").stat().st_size > 0
    knn = json.loads((root / "data.knn.json").read_text())
    assert 0 <= knn["fasttext_hits_verse_id_first"] <= 1 and 0 < knn["chance"] < 1
    # original resumed from its first sitting's checkpoint
    assert any("@ 3 updates" in path.read_text() for path in (root / "results" / "logs").glob("*.log"))


def test_runs_clip_the_gradient_unless_train_args_say_otherwise(table3, tmp_path):
    root, _ = table3
    # fairseq-train logs its whole configuration: every run of the table trained with the norm clipped at 1.0
    for setting in SETTINGS:
        assert "'clip_norm': 1.0" in (root / "checkpoints" / setting / "seed1" / "train.log").read_text()
    # --train-args come after the preset's options, so that "--clip-norm 0" is the value fairseq-train keeps
    argv = table3_recipe.train_command(table3_recipe.Run("0-base", 1), ("en", "de", "hi"), "gpu", tmp_path,
                                       tmp_path, "verse_ids", ["--clip-norm", "0"])
    values = [argv[i + 1] for i, option in enumerate(argv) if option == "--clip-norm"]
    assert values == ["1.0", "0"]


def test_table3_third_sitting_redoes_nothing(table3, bible_dir):
    root, _ = table3
    before = {path: path.stat().st_mtime_ns for path in (root / "results").glob("*/seed1.json")}
    log = run_recipe(bible_dir, root)
    assert "training 0 run(s)" in log
    assert before == {path: path.stat().st_mtime_ns for path in (root / "results").glob("*/seed1.json")}


def task_of(data, **flags):
    from fairseq_xmlm.tasks.bilingual_mlm import BilingualMLMConfig, BilingualMLMTask

    cfg = BilingualMLMConfig(data=str(data), langs="en,de,hi", tokens_per_sample=64, seed=1, **flags)
    return BilingualMLMTask.setup_task(cfg)


def test_inv_order_reverses_one_language_in_training_and_evaluation(table3):
    root, _ = table3
    plain, inverted = task_of(root / "data"), task_of(root / "data", inv_order_langs="de")
    assert [inverted.reverses(lang) for lang in range(3)] == [False, True, False]
    verse = plain.load_split_sentences("valid", 1)[0]
    assert inverted.sentence_input(verse, 1)[1:-1].tolist() == verse.flip(0).tolist()
    assert inverted.sentence_input(verse, 0).tolist() == plain.sentence_input(verse, 0).tolist()
    inverted.load_dataset("valid_de")
    plain.load_dataset("valid_de")
    first_stream = inverted.datasets["valid_de"][0]["tokens"]
    eos = plain.dictionary.eos()
    ends = (first_stream == eos).nonzero().squeeze(1).tolist()
    sentences = plain.load_split_sentences("valid", 1)
    assert first_stream[1:ends[0]].tolist() == sentences[0].flip(0).tolist()
    with pytest.raises(XmlmError, match="not among --langs"):
        task_of(root / "data", inv_order_langs="fr")


def test_shift_special_gives_every_other_language_its_own_specials(table3):
    root, _ = table3
    task = task_of(root / "data", shift_special=True, lang_pos=True)
    assert task.lang_pos
    specials = [task.specials[lang] for lang in range(3)]
    assert specials[0] == (task.dictionary.bos(), task.dictionary.eos(), task.dictionary.index("<mask>"))
    assert len({i for triple in specials for i in triple}) == 9
    assert task.dictionary[specials[2][2]] == "<mask>@hi" and task.mask_symbol(1) == specials[1][2]
    assert all(i in task.special_ids for triple in specials for i in triple)
    verse = task.load_split_sentences("valid", 2)[0]
    hindi = task.sentence_input(verse, 2)
    assert hindi[0] == specials[2][0] and hindi[-1] == specials[2][1]
    task.load_dataset("valid_hi")
    assert task.datasets["valid_hi"][0]["tokens"][0] == specials[2][0]
    assert task.dictionary.eos() not in task.datasets["valid_hi"][0]["tokens"].tolist()


def test_knn_replace_with_shift_special_is_refused(table3):
    root, _ = table3
    task = task_of(root / "data", shift_special=True, knn_replace=10,
                   knn_table=str(table3_recipe.knn_table_path(root / "data", "verse_ids")))
    with pytest.raises(XmlmError, match="shift-special"):
        task.build_masker()


def test_multilingual_table_holds_k_neighbours_per_other_language(table3):
    root, _ = table3
    from fairseq_xmlm.vocabulary import dictionary_fingerprint

    task = task_of(root / "data", knn_replace=10,
                   knn_table=str(table3_recipe.knn_table_path(root / "data", "verse_ids")))
    saved = torch.load(table3_recipe.knn_table_path(root / "data", "verse_ids"), weights_only=True)
    assert saved["k"] == 10 and saved["k_per_language"] == 5 and saved["langs"] == ["en", "de", "hi"]
    assert saved["dict_md5"] == dictionary_fingerprint(task.dictionary)
    table = saved["neighbours"]
    prefix = {"en": "en:", "de": "de:", "hi": "hi:"}
    for lang, others in (("en", ("de", "hi")), ("de", ("en", "hi")), ("hi", ("en", "de"))):
        rows = [i for i in range(len(task.dictionary)) if task.dictionary[i].startswith(prefix[lang])
                and table[i, 0] >= 0]
        assert len(rows) > 50
        for block, other in enumerate(others):
            columns = table[rows, block * 5:(block + 1) * 5]
            assert all(task.dictionary[i].startswith(prefix[other]) for i in columns.flatten().tolist())
    task.build_masker()  # the task accepts the table


def test_dice_neighbours_against_brute_force():
    rng = np.random.default_rng(0)
    a = (rng.random((7, 30)) < 0.3).astype(np.float32)
    b = (rng.random((9, 30)) < 0.3).astype(np.float32)
    b[:, 0] = 1  # no empty row
    a[:, 0] = 1
    found = knn_builder.dice_neighbours(scipy.sparse.csr_matrix(a), scipy.sparse.csr_matrix(b), 3, chunk_rows=2)
    for i in range(7):
        dice = [2 * (a[i] * b[j]).sum() / (a[i].sum() + b[j].sum()) for j in range(9)]
        assert sorted(dice, reverse=True)[:3] == pytest.approx([dice[j] for j in found[i].tolist()])


def test_verse_incidence_and_table_layout():
    sentences = [torch.tensor([5, 6, 5]), torch.tensor([6, 7]), torch.tensor([9])]
    incidence = knn_builder.verse_incidence(sentences, torch.tensor([5, 6, 7]))
    assert incidence.toarray().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 0]]
    languages = [(torch.tensor([4, 5]), torch.tensor([True, True])),
                 (torch.tensor([6, 7]), torch.tensor([True, False])), (torch.tensor([8]), torch.tensor([True]))]

    def neighbours(a, b):  # every row: the other language's rows in reverse order
        owned = int(languages[a][1].sum())
        return torch.arange(len(languages[b][0])).flip(0)[:1].expand(owned, 1)

    table = knn_builder.multilingual_table(languages, 10, 1, neighbours)
    assert table.shape == (10, 2)
    assert table[4].tolist() == [7, 8] and table[6].tolist() == [5, 8] and table[8].tolist() == [5, 7]
    assert table[7].tolist() == [-1, -1]  # not owned by its language


def test_neighbour_agreement_counts_hits_per_language_block():
    ours = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [-1, -1, -1, -1]])
    reference = torch.tensor([[2, 9, 9, 9], [9, 9, 8, 9], [1, 1, 1, 1]])
    assert knn_builder.neighbour_agreement(ours, reference, 2) == pytest.approx(2 / 4)


def test_bad_input_is_one_error_line(capsys, tmp_path):
    expect_cli_error(capsys, table3_main, ["tiny", "--langs", "en", "--results", str(tmp_path)], "two or more")
    expect_cli_error(capsys, table3_main, ["tiny", "--settings", "0-base,99-base", "--results", str(tmp_path)],
                     "unknown setting")
    expect_cli_error(capsys, table3_main, ["tiny", "--seeds", "1,x", "--results", str(tmp_path)], "--seeds")
    expect_cli_error(capsys, table3_main, ["--report", "--results", str(tmp_path)], "no results")
