"""`python -m fairseq_xmlm.experiments.dufter causes` and the data it derives: clause units, the in-domain dev set,
the corpus exported for stock fairseq."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import TIMEOUT, expect_cli_error
from fairseq_xmlm.data.preparation import (CLAUSE_MIN_WORDS, clause_units, prepare_fake_english_clauses,
                                           prepare_fake_english_indomain)
from fairseq_xmlm.experiments.dufter import causes
from fairseq_xmlm.experiments.dufter.__main__ import main
from fairseq_xmlm.vocabulary import load_data_dictionary, load_split_sentences

PAPER_CODE = "paper-code"  # the causes' settings name their schedule, whatever the default is


def derived(data, suffix):
    return data.with_name(data.name + suffix)


@pytest.fixture(scope="module")
def clause_data(fake_english_data):
    out = derived(fake_english_data, "_clauses")
    if not (out / "dict.txt").exists():  # the recipe's and these tests' clause data-bin is one
        prepare_fake_english_clauses(fake_english_data, out)
    return out


def test_clause_units_cut_after_punctuation_once_long_enough():
    starts = np.array([True] * 10 + [False] * 10)  # ids 0-9 start a word, 10-19 continue one
    ends = {0}  # id 0 is the comma, a word of its own (Moses splits it off)
    sentence = [1, 2, 0, 3, 11, 4, 5, 0, 6, 7, 0, 8]  # words: 1 2 , 3+11 4 5 , 6 7 , 8
    assert clause_units(sentence, ends, starts, 3) == [[1, 2, 0], [3, 11, 4, 5, 0], [6, 7, 0, 8]]
    assert clause_units(sentence, ends, starts, 4) == [[1, 2, 0, 3, 11, 4, 5, 0], [6, 7, 0, 8]]
    assert clause_units(sentence, ends, starts, 5) == [sentence]  # the 4-word tail joins the unit before it


def test_clause_data_has_the_papers_sentence_count_and_the_same_words(fake_english_data, clause_data):
    english = load_data_dictionary(fake_english_data)
    sentences = load_split_sentences(fake_english_data, "train", "en", english)
    units = load_split_sentences(clause_data, "train", "en", english)
    assert 16_000 < len(units) < 19_000 and len(sentences) < 9_000  # the paper: 17k sentences
    assert torch.equal(torch.cat(units), torch.cat(sentences))  # every piece, in order, nothing else
    starts = np.array([english[i].startswith("▁") for i in range(len(english))])
    words = [int(starts[unit.numpy()].sum()) for unit in units]
    assert min(words) >= CLAUSE_MIN_WORDS or sum(w < CLAUSE_MIN_WORDS for w in words) < 0.05 * len(words)
    assert 10 <= np.median(words) <= 14  # the paper: median 12
    assert (clause_data / "dict.txt").read_bytes() == (fake_english_data / "dict.txt").read_bytes()
    assert "clause" in json.loads((clause_data / "meta.json").read_text())["sources"]["train"]


def test_indomain_dev_set_is_bbe_old_testament_in_the_training_bpe(fake_english_data, bible_dir, tmp_path):
    out = tmp_path / "indomain"
    assert prepare_fake_english_indomain(fake_english_data, bible_dir, out, size=500) == 500
    english = load_data_dictionary(fake_english_data)
    indomain = torch.cat(load_split_sentences(out, "valid", "en", english))
    kjv = torch.cat(load_split_sentences(fake_english_data, "valid", "en", english)[:500])
    assert torch.equal(torch.cat(load_split_sentences(out, "train", "en", english)),
                       torch.cat(load_split_sentences(fake_english_data, "train", "en", english)))
    # BBE's own BPE cuts BBE into whole words and KJV into fragments, with <unk>s
    assert float((indomain == english.unk()).float().mean()) < 0.5 * float((kjv == english.unk()).float().mean())
    def pieces_per_word(ids):
        return len(ids) / sum(english[int(i)].startswith("▁") for i in ids)

    assert pieces_per_word(indomain) < 0.9 * pieces_per_word(kjv)  # 1.19 against 1.45 (2048 pieces)
    assert "in-domain" in json.loads((out / "meta.json").read_text())["sources"]["valid"]


def test_export_stock_is_accepted_by_stock_fairseq_preprocess(fake_english_data, tmp_path):
    """Stock fairseq-preprocess (no plugin) binarizes the export with its one doubled dictionary, no <unk> added:
    item k + N is item k in Fake-English."""
    from fairseq.data import Dictionary, data_utils

    main(["export-stock", "--data", str(fake_english_data), "--out", str(tmp_path / "text")])
    text = tmp_path / "text"
    result = subprocess.run([sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--srcdict",
                             str(text / "dict.txt"), "--trainpref", str(text / "train.txt"), "--validpref",
                             str(text / "valid.txt"), "--destdir", str(tmp_path / "bin"), "--workers", "1"],
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert re.search(r"train\.txt: \d+ sents, \d+ tokens, 0\.0% replaced", result.stderr), result.stderr[-2000:]
    dictionary = Dictionary.load(str(tmp_path / "bin" / "dict.txt"))
    train = data_utils.load_indexed_dataset(str(tmp_path / "bin" / "train"), dictionary, "mmap")
    english = load_data_dictionary(fake_english_data)
    sentences = load_split_sentences(fake_english_data, "train", "en", english)
    assert len(train) == 2 * len(sentences)
    for k in (0, len(sentences) - 1):
        words = dictionary.string(train[k]).split()
        assert words == english.string(sentences[k]).split()
        assert dictionary.string(train[k + len(sentences)]).split() == ["::" + word for word in words]


def test_every_cause_trains_its_runs_against_the_baseline(fake_english_data, tmp_path, capsys, monkeypatch):
    """The plan of `causes --preset small`: the baseline trains every run any cause compares; each setting differs
    from it in its cause alone (the no-random share only on the --no-random runs); the in-domain dev set evaluates
    the default's runs, which train once; fp32 is set against the default, not the baseline."""
    ids = causes.PRESETS_OF_CAUSES["small"]["ids"]
    plan = causes.needed(list(causes.CAUSES), ids)
    assert plan[causes.BASELINE] == ["0", "1", "2", "4", "7"] and plan["no-random-.9"] == ["4", "7"]
    assert "indomain-dev" not in plan and plan["batch128-clip"] == ["0", "1", "2", "4", "7"]  # evaluated
    assert causes.needed(["indomain-dev"], ("4",)) == {"batch128-clip": ["4"]}
    assert plan[PAPER_CODE] == ["4", "7", "1", "2"] and plan["paper-code-fp32"] == ["1"]
    assert plan["paper-code-specials"] == ["2"] and plan["paper-code-attend-padding"] == ["1"]  # not 5, 6 here
    code = causes.needed(["shift-special-code", "attend-padding-code"], causes.PRESETS_OF_CAUSES["code"]["ids"])
    assert code == {PAPER_CODE: ["2", "5", "1", "6"], "paper-code-specials": ["2", "5"],
                    "paper-code-attend-padding": ["1", "5", "6"]}
    assert causes.needed(["fp32"], ids) == {PAPER_CODE: ["1"], "paper-code-fp32": ["1"]}
    capsys.readouterr()
    monkeypatch.setattr(causes.recipe, "has_gpu", lambda: True)  # the packed plan
    packed = causes.train_packed
    precisions = {}

    def train_packed(jobs, results, dry_run):
        for precision, (training, _) in jobs.items():
            precisions[precision] = sorted({" ".join(job.argv).split("/causes/")[1].split("/")[0] for job in training})
        packed(jobs, results, dry_run)

    monkeypatch.setattr(causes, "train_packed", train_packed)
    main(["causes", "--preset", "small", "--data", str(fake_english_data), "--results", str(tmp_path), "--dry-run"])
    trained = [line for line in capsys.readouterr().err.splitlines() if "fairseq_cli.train" in line]
    assert len(trained) == 2 * sum(map(len, plan.values()))  # two seeds
    by_setting = {}
    for line in trained:
        setting = line.split("/causes/")[1].split("/")[0]
        by_setting.setdefault(setting, []).append(line)
    for setting in ("clip", "clip-fp32"):
        assert all("--clip-norm 1.0" in line and "--batch-size 256" in line for line in by_setting[setting])
    assert all("--clip-norm 1.0" in line and "--batch-size 128" in line and "--no-random-mask-share" not in line
               for line in by_setting["batch128-clip"])
    assert all("--clip-norm 1.0" in line and "--batch-size 128" in line
               and ("--no-random-mask-share 0.9" in line) == ("--no-random" in line.split())
               for line in by_setting[PAPER_CODE])
    assert ([line.replace("paper-code-fp32", PAPER_CODE) for line in by_setting["paper-code-fp32"]]
            == [line for line in by_setting[PAPER_CODE] if "--lang-pos" in line.split()])
    assert precisions["fp32"] == ["clip-fp32", "paper-code-fp32"] and "paper-code-fp32" not in precisions["bf16"]
    assert all("--attend-padding" in line for line in by_setting["attend-padding"])
    assert [line.replace("paper-code-attend-padding", PAPER_CODE).replace(" --attend-padding", "")
            for line in by_setting["paper-code-attend-padding"]] == [
        line for line in by_setting[PAPER_CODE] if "/runs/1/" in line]
    shift_special_runs = [line for line in by_setting[PAPER_CODE] if "/runs/2/" in line]
    assert len(shift_special_runs) == 2 and [line.replace("paper-code-specials", PAPER_CODE).replace(
        " --shift-special-after-masking", "") for line in by_setting["paper-code-specials"]] == shift_special_runs
    assert all("--no-random-mask-share 0.9" in line and "--no-random" in line for line in by_setting["no-random-.9"])
    assert all("--batch-size 128" in line and "--clip-norm" not in line for line in by_setting["batch128"])
    assert all("_clauses" in line for line in by_setting["clauses"])
    baseline = by_setting[causes.BASELINE]
    assert all("--batch-size 256" in line and "--max-epoch 100" in line and "--clip-norm" not in line
               and "--attend-padding" not in line and "mask-share" not in line for line in baseline)
    expect_cli_error(capsys, main, ["causes", "--causes", "speed", "--dry-run"], "unknown causes ['speed']")


def test_tiny_preset_runs_end_to_end_on_the_cpu_and_resumes(fake_english_data, clause_data, bible_dir, tmp_path,
                                                            capsys):
    """`causes --preset tiny`, a cause of each kind (a schedule on other data, a flag of some runs, the in-domain
    evaluation): trained, evaluated, summarised; a second call trains and evaluates nothing."""
    argv = ["causes", "--preset", "tiny", "--causes", "clauses,no-random-.9,indomain-dev", "--data",
            str(fake_english_data), "--bible-dir", str(bible_dir), "--results", str(tmp_path)]
    main(argv)
    summary = json.loads((tmp_path / "causes.json").read_text())
    assert summary["preset"] == "tiny" and summary["seeds"] == [0]
    assert list(summary["causes"]) == ["clauses", "no-random-.9", "indomain-dev"]
    for name, cause in summary["causes"].items():
        row = cause["runs"]["4"]
        assert set(row["before"]) == set(row["after"]) == set(summary["columns"]) | {"n", "stalled"}, name
        assert cause["updates"] == {"before": 2, "after": 2}
    runs = tmp_path / "causes"
    assert "'no_random_mask_share': 0.9" in (runs / "no-random-.9/runs/4/seed0/train.log").read_text()  # its cfg
    assert "_clauses" in (runs / "clauses/runs/4/seed0/train.log").read_text()
    assert (runs / "batch128-clip/runs/4/seed0/eval_indomain.json").exists()
    indomain = summary["causes"]["indomain-dev"]["runs"]["4"]
    assert indomain["before"]["ppl_dev"] != indomain["after"]["ppl_dev"]  # another dev set
    table = (tmp_path / "causes.md").read_text()
    assert table.count("| 4 no-random |") == 3 and " → " in table
    assert (tmp_path / "causes.png").stat().st_size > 10_000  # the same rows as a figure
    capsys.readouterr()
    main(argv)
    again = capsys.readouterr().err
    assert "fairseq_cli.train" not in again and "eval_mult" not in again


def test_stalled_seeds_are_counted_against_the_median_of_the_whole_table(tmp_path):
    """A seed that ends over STALL_FACTOR x the median training perplexity of every run counts as stalled, on its
    side of the comparison; its μ stays in the mean."""
    from test_tables import fake_result

    def write(setting, run_id, seed, mu, ppl):
        path = causes.runs_of(tmp_path, setting) / run_id / f"seed{seed}" / "eval.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(fake_result(mu) | {"ppl": {"train": ppl, "valid": 10 * ppl}}))

    for run_id in causes.MOST[:-1]:  # the BERT-small runs: trained well before and after, except below
        for seed in (0, 42):
            write(causes.BASELINE, run_id, seed, 0.5, 11.0)
            if run_id != "0":
                write("batch128", run_id, seed, 0.6, 10.0)
    write("batch128", "0", 0, 0.01, 553.0)  # unigram perplexity
    write("batch128", "0", 42, 0.6, 12.0)
    row = causes.summarise(["batch128"], causes.MOST, tmp_path)["batch128"]["runs"]["0"]
    assert (row["before"]["stalled"], row["after"]["stalled"]) == (0, 1)
    assert row["after"]["mu"] == pytest.approx(0.305) and row["after"]["n"] == 2
    assert "| batch128 | 0 original | 2/2 | 0/1 |" in causes.markdown(
        causes.summarise(["batch128"], causes.MOST, tmp_path), "small", [0, 42])


def test_report_summarises_the_causes_present_and_trains_nothing(tmp_path, capsys):
    """`causes --report` writes causes.json/md from the eval JSONs present (no data, no training), leaving out the
    causes none of whose runs has a result; with none at all, one error line."""
    from test_tables import fake_result

    for setting in (causes.BASELINE, "no-random-.9"):
        for run_id in ("4", "7"):
            path = causes.runs_of(tmp_path, setting) / run_id / "seed0" / "eval.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps(fake_result(0.4 if setting == causes.BASELINE else 0.5)))
    main(["causes", "--report", "--results", str(tmp_path), "--data", str(tmp_path / "no-data-needed")])
    summary = json.loads((tmp_path / "causes.json").read_text())
    assert list(summary["causes"]) == ["no-random-.9"]
    assert summary["causes"]["no-random-.9"]["runs"]["7"]["after"]["mu"] == pytest.approx(0.5)
    assert "| no-random-.9 | 4 no-random | 1/1 | 0/0 | 0.40 → 0.50 |" in (tmp_path / "causes.md").read_text()
    assert "fairseq_cli.train" not in capsys.readouterr().err
    expect_cli_error(capsys, main, ["causes", "--report", "--results", str(tmp_path / "empty")],
                     "no cause has results under")
