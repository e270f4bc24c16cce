"""The stall probe: the same Dufter runs' first updates in fairseq-train and in the packed trainer, each run's loss
per epoch and the stalled ones counted against their run ID's median (real runs on the CPU, a few updates)."""
import json
import shutil

import pytest

from fairseq_xmlm.experiments.dufter import stall_probe
from conftest import expect_cli_error


def test_a_run_stalls_when_its_last_full_epoch_is_over_the_margin_above_its_ids_median():
    losses = {"fairseq": {("1", 0): [9.3, 7.9], ("1", 42): [9.3, 7.8], ("3", 0): [9.7, 7.9]},
              "graphs": {("1", 0): [9.3, 8.4], ("1", 42): [9.3, 7.85], ("3", 0): [9.7, 7.95]}}
    summary = stall_probe.summarise(losses, full_epochs=2)
    assert summary["stalled"] == {"fairseq": {"1": "0/2", "3": "0/1"}, "graphs": {"1": "1/2", "3": "0/1"}}
    assert summary["runs"]["graphs"]["1"]["0"] == {"loss_per_epoch": [9.3, 8.4], "stalled": True}


def test_a_run_that_left_the_plateau_and_went_back_has_stalled_whatever_the_median():
    # most runs go back to the plateau, as unclipped ones do: the median stands there too
    losses = {"fairseq": {("0", 0): [9.7, 7.9, 9.2], ("0", 42): [9.7, 8.0, 9.25], ("0", 43): [9.7, 8.0, 7.8]}}
    summary = stall_probe.summarise(losses, full_epochs=3)
    assert {seed: run["stalled"] for seed, run in summary["runs"]["fairseq"]["0"].items()} == {
        "0": True, "42": True, "43": False}
    # a partial last epoch (beyond full_epochs) decides nothing
    assert not stall_probe.summarise({"fairseq": {("0", 0): [9.7, 7.9, 7.8, 9.9]}}, 3)["runs"]["fairseq"]["0"]["0"][
        "stalled"]


def test_runs_on_the_unigram_plateau_have_stalled_where_most_of_an_id_stay_there():
    # 3 of 4 never leave the plateau (9.1 bits here): the median is the plateau, and only the plateau says so
    losses = {"graphs": {("0", 0): [9.7, 9.2, 9.15], ("0", 42): [9.7, 9.2, 9.2], ("0", 43): [9.7, 9.1, 9.1],
                         ("0", 100): [9.7, 8.3, 7.9]}}
    by_median = stall_probe.summarise(losses, full_epochs=3)
    assert by_median["stalled"]["graphs"]["0"] == "0/4"
    with_plateau = stall_probe.summarise(losses, full_epochs=3, plateau_bits=9.1)
    assert {seed: run["stalled"] for seed, run in with_plateau["runs"]["graphs"]["0"].items()} == {
        "0": True, "42": True, "43": True, "100": False}
    # after one or two epochs every run may still be near the plateau: the test waits for the third
    early = {"graphs": {key: values[:2] for key, values in losses["graphs"].items()}}
    assert stall_probe.summarise(early, full_epochs=2, plateau_bits=9.1)["stalled"]["graphs"]["0"] == "0/4"


def test_the_plateau_is_the_entropy_of_both_languages_tokens(tmp_path):
    # four English pieces, counts 4, 2, 1, 1: H = 1.75 bits; each has a Fake-English twin of the same count: + 1
    (tmp_path / "dict.txt").write_text("a 4\nb 2\nc 1\nd 1\n")
    assert stall_probe.unigram_bits(tmp_path) == pytest.approx(2.75)


def test_probe_seeds_are_the_papers_then_new_ones():
    assert stall_probe.probe_seeds(2) == [0, 42]
    assert stall_probe.probe_seeds(7) == [0, 42, 43, 100, 101, 1000, 1001]


def test_probe_trains_each_variant_once_and_counts_stalls(fake_english_data, tmp_path, monkeypatch):
    # a 4-update "epoch", so that a few real updates make one full epoch of each run
    monkeypatch.setattr(stall_probe.recipe, "updates_per_epoch", lambda *args: 4)
    argv = ["--ids", "1", "--seeds", "2", "--updates", "4", "--variants", "fairseq,eager", "--data",
            str(fake_english_data), "--results", str(tmp_path)]
    stall_probe.main(argv)
    summary = json.loads((tmp_path / "stall_probe.json").read_text())
    assert summary["seeds"] == [0, 42] and summary["full_epochs"] == 1 and summary["precision"] == "fp32"
    assert summary["unigram_bits"] == pytest.approx(stall_probe.unigram_bits(fake_english_data), abs=1e-4)
    for variant in ("fairseq", "eager"):
        runs = summary["runs"][variant]["1"]
        assert set(runs) == {"0", "42"}
        assert all(len(run["loss_per_epoch"]) == 1 and 5 < run["loss_per_epoch"][0] < 13 for run in runs.values())
        assert summary["stalled"][variant]["1"] in {"0/2", "1/2", "2/2"}
    commands = (tmp_path / "eager" / "commands.txt").read_text().splitlines()
    assert len(commands) == 2 and all("--lang-pos" in c and "--max-update 4" in c for c in commands)

    def no_training(*args):
        raise AssertionError("a variant with its results was trained again")

    monkeypatch.setattr(stall_probe, "train_variant", no_training)
    stall_probe.main(argv)
    # runs trained without --train-args are not read as if trained with them
    with pytest.raises(stall_probe.XmlmError, match="trained with --train-args ''"):
        stall_probe.main([*argv, "--train-args", "--warmup-updates 2"])
    # the graphs variant's runs, trained on a GPU and copied here, are summarised without one
    shutil.copytree(tmp_path / "eager", tmp_path / "graphs")
    monkeypatch.setattr(stall_probe, "has_gpu", lambda: False)
    stall_probe.main([*argv[:7], "fairseq,eager,graphs", *argv[8:]])
    assert set(json.loads((tmp_path / "stall_probe.json").read_text())["stalled"]) == {"fairseq", "eager", "graphs"}
    # a variant done with other runs is not read as if it held these
    with pytest.raises(stall_probe.XmlmError, match="remove .*fairseq.done"):
        stall_probe.main([*argv[:3], "3", *argv[4:]])


@pytest.mark.parametrize("argv, message", [
    (["--ids", "18"], "untrained runs cannot stall"),
    (["--ids", "1,30"], "no knn-replace runs"),
    (["--variants", "graphs"], "needs a GPU"),
    (["--variants", "jit"], "unknown variants"),
    (["--train-args", "--warmup-updates 9 --max-update 9"], "cannot set --max-update"),
    (["--updates", "10", "--variants", "eager"], "less than one epoch"),
])
def test_bad_options_are_one_error_line(fake_english_data, tmp_path, capsys, argv, message):
    from fairseq_xmlm.experiments.dufter.__main__ import main

    expect_cli_error(capsys, main, ["stall-probe", *argv, "--data", str(fake_english_data), "--results",
                                    str(tmp_path / "out")], message)
    assert not (tmp_path / "out" / "stall_probe.json").exists()


def test_train_args_may_be_one_option_alone():
    # argparse would read a lone "--shift-special-after-masking" as an unknown option of the probe's own
    assert stall_probe.parse_args(["--train-args", "--shift-special-after-masking", "--seeds", "2"]).train_args == \
        "--shift-special-after-masking"
    assert stall_probe.parse_args(["--train-args", "--lr 1e-3"]).train_args == "--lr 1e-3"


def test_train_args_follow_each_runs_command(fake_english_data, tmp_path):
    commands = stall_probe.probe_commands(["1"], [0, 42], fake_english_data, tmp_path, 420,
                                          ["--warmup-updates", "500"])
    for argv in commands.values():
        assert argv[-2:] == ["--warmup-updates", "500"] and argv.count("--warmup-updates") == 2
