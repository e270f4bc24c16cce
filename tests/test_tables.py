"""Dufter's Table 1/2 writer (experiments.dufter.report) on hand-made eval JSONs, and the run / paper data it
lays out (experiments.dufter.runs)."""
import json

import pytest

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter.report import aggregate, mean_std, table_json, write_tables
from fairseq_xmlm.experiments.dufter.runs import PAPER_TABLE1, PAPER_TABLE2, RUNS, TABLE1_IDS, TABLE2_IDS


def fake_result(mu, f1=1.0, rho=(0.2, 0.9), tau=(0.8, 0.7), ppl=(9.0, 200.0), layers=("0", "8")):
    return {
        "checkpoint": "x.pt", "mu": mu, "n_sentences": 10, "n_words": 5,
        "layers": {layer: {"align_f1": f1, "retrieval": r, "translation": t}
                   for layer, r, t in zip(layers, rho, tau)},
        "ppl": {"train": ppl[0], "valid": ppl[1]},
    }


def write_result(runs_dir, run_id, seed, result):
    path = runs_dir / run_id / f"seed{seed}" / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(result))


def test_every_table_id_has_a_run_and_a_paper_row():
    assert set(TABLE1_IDS) <= set(RUNS) and set(TABLE2_IDS) <= set(RUNS)
    assert set(TABLE1_IDS) == set(PAPER_TABLE1)
    assert PAPER_TABLE1["0"]["mu"] == (0.70, None)
    assert PAPER_TABLE1["8"]["rho_hi"] == (0.11, 0.11)
    assert PAPER_TABLE1["18"]["ppl_dev"] == (4128, 42.7)
    assert PAPER_TABLE2["21b"]["tau_hi"] == (0.02, None)
    assert RUNS["21"].epoch_factor == 2 and "--no-parallel" in RUNS["21"].flags
    assert RUNS["18"].untrained and RUNS["30"].needs_knn
    assert "xmlm_bert_base" in RUNS["17"].flags and "--lang-pos" in RUNS["17"].flags


def test_mean_and_sample_std_over_seeds():
    assert mean_std([1.0]) == (1.0, None)
    mean, std = mean_std([0.6, 0.7, 0.8])
    assert mean == pytest.approx(0.7) and std == pytest.approx(0.1)
    summary = aggregate([fake_result(0.6), fake_result(0.8, ppl=(11.0, 220.0))])
    assert summary["n"] == 2
    assert summary["mu"][0] == pytest.approx(0.7)
    assert summary["ppl_train"] == pytest.approx((10.0, 2 ** 0.5))
    assert summary["rho_hi"] == pytest.approx((0.9, 0.0))


def test_tables_in_the_paper_layout(tmp_path):
    runs = tmp_path / "runs"
    write_result(runs, "0", 1, fake_result(0.6))
    write_result(runs, "0", 2, fake_result(0.8))
    write_result(runs, "21b", 1, fake_result(0.05, rho=(0.1, 0.12)))
    table1, table2 = write_tables(runs, tmp_path / "out")
    text1 = table1.read_text()
    assert "| ID | Description | n | μ | μ (paper) | L0 F1 | L0 ρ | L0 τ | L8 F1 | L8 ρ | L8 τ" in text1
    assert "| 0 | original | 2 | 0.70 ± 0.14 | 0.70 | 1.00 ± 0.00 | 0.20 ± 0.00 |" in text1
    assert "| 1 | lang-pos | 0 | – | 0.30 |" in text1  # not run yet: an empty row beside the paper's
    assert "| 17 | lang-pos;shift-special;no-random;overparam | 5 | 0.00 | 0.00 | 0.05 ± 0.02 |" in text1
    text2 = table2.read_text()
    assert "| 21b | lang-pos;no-parallel | 1 | 0.05 | 0.07 |" in text2  # one seed: no std
    assert "| 21 | no-parallel | 5 | 0.25 | 0.25 | 0.98 | 0.06 | 0.28 |" in text2
    assert not list((tmp_path / "out").glob(".*"))  # no temp file left behind


def test_a_result_without_the_table_layers_is_refused(tmp_path):
    runs = tmp_path / "runs"
    write_result(runs, "0", 1, fake_result(0.6, layers=("0", "2")))
    with pytest.raises(XmlmError, match="lacks '8'"):
        write_tables(runs, tmp_path / "out")
    assert not (tmp_path / "out" / "table1.md").exists()
    write_tables(runs, tmp_path / "out", layers=("0", "2"))
    assert "| 0 | original | 1 | 0.60 | 0.70 |" in (tmp_path / "out" / "table1.md").read_text()


def test_a_broken_result_file_is_named(tmp_path):
    path = tmp_path / "runs" / "4" / "seed1" / "eval.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    with pytest.raises(XmlmError, match="seed1/eval.json: not a valid eval JSON"):
        write_tables(tmp_path / "runs", tmp_path / "out")


def test_a_seed_that_stalled_is_named_below_the_table(tmp_path):
    """Stalled: a training perplexity over 10x the median of every trained run of the table, also in a row where
    most seeds stalled (its own median is a stalled seed); untrained runs set no median."""
    runs = tmp_path / "runs"
    for seed, ppl in ((1, 11.0), (2, 12.0), (3, 564.0)):
        write_result(runs, "0", seed, dict(fake_result(0.6), checkpoint=f"runs/0/seed{seed}/ck.pt", ppl={
            "train": ppl, "valid": 200.0}))
    for seed, ppl in ((1, 553.0), (2, 276.0), (3, 10.9)):  # two of three stalled
        write_result(runs, "1", seed, dict(fake_result(0.1), checkpoint=f"runs/1/seed{seed}/ck.pt", ppl={
            "train": ppl, "valid": 900.0}))
    write_result(runs, "2", 1, fake_result(0.5, ppl=(10.0, 200.0)))
    for seed in (1, 2, 3):
        write_result(runs, "18", seed, fake_result(0.0, ppl=(3692.0, 3680.0)))
    text = write_tables(runs, tmp_path / "out")[0].read_text()
    assert "| 0 | original | 3 | 0.60 ± 0.00 |" in text  # still in the mean
    notes = [line for line in text.splitlines() if line.startswith("- ID")]
    assert notes == ["- ID 0: runs/0/seed3/ck.pt (train perplexity 564, row mean 196)",
                     "- ID 1: runs/1/seed1/ck.pt (train perplexity 553, row mean 280)",
                     "- ID 1: runs/1/seed2/ck.pt (train perplexity 276, row mean 280)"]
    table = table_json(runs, "test")
    assert (table["rows"]["1"]["stalled"], table["rows"]["1"]["n"], table["rows"]["18"]["stalled"]) == (2, 3, 0)
