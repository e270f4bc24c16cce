"""python -m fairseq_xmlm.experiments.dufter: the commands it plans, fairseq-train's or --gpu-pack's, and its
bad-input errors."""
import json

import pytest
import torch

from conftest import expect_cli_error
from fairseq_xmlm.experiments.dufter import recipe, sweep
from fairseq_xmlm.experiments.dufter.__main__ import main
from fairseq_xmlm.experiments.dufter.runs import PRESETS


def planned(capsys, argv):
    capsys.readouterr()
    main(argv)
    return [line[2:] for line in capsys.readouterr().err.splitlines() if line.startswith("+ ")]


def test_gpu_pack_plans_packed_training(fake_english_data, tmp_path, capsys):
    common = ["full", "--ids", "0,18", "--seeds", "2", "--data", str(fake_english_data), "--results", str(tmp_path),
              "--dry-run"]
    per_run = planned(capsys, common)
    packed = planned(capsys, common + ["--gpu-pack"])
    train = [c for c in packed if "fairseq_cli.train" in c]
    assert len(train) == 2 and all("--log-file" in c and "--criterion xmlm_masked_lm" in c for c in train)
    assert "--seed 0" in train[0] and "--seed 42" in train[1]
    assert sum("fairseq_xmlm.untrained" in c for c in packed) == 2
    assert sum("eval_mult" in c for c in packed) == 4 == sum("eval_mult" in c for c in per_run)
    # the fairseq-train commands of the per-run mode are the packed ones without the log file
    assert [c for c in per_run if "fairseq_cli.train" in c] == [c.split(" --log-file")[0] for c in train]


def test_gpu_pack_makes_untrained_runs_beside_the_training_and_stops_them_when_it_fails(fake_english_data, tmp_path,
                                                                                         monkeypatch):
    """The untrained checkpoints (and evaluations) no longer wait for the training to start: both stages run at
    once; when the training fails, the other stage is stopped and the training's error is the one raised."""
    import threading
    import time

    from fairseq_xmlm.errors import XmlmError
    from fairseq_xmlm.packed import processes

    both_running = threading.Barrier(2, timeout=30)  # broken (an error) unless both stages run at the same time
    seen = {}

    def side_stage(jobs, slots, log_dir, devices=None, stop=None):
        seen["side"] = (len(jobs), slots)
        both_running.wait()
        while seen.get("fail") and not stop():  # a failing training stops this stage
            time.sleep(0.01)
        if stop():
            raise XmlmError("stopped")
        return [0.0] * len(jobs)

    def training(jobs, workdir, max_group, **options):
        seen["training"] = len(jobs)
        both_running.wait()
        if seen.get("fail"):
            raise XmlmError("a group failed")

    monkeypatch.setattr(processes, "run_jobs", side_stage)
    monkeypatch.setattr(processes, "train_side_by_side", training)
    pending = [(run_id, seed) for run_id in ("0", "18") for seed in (0, 42)]
    sweep.run_all_packed(pending, fake_english_data, tmp_path / "runs", tmp_path, PRESETS["full"],
                         tmp_path / "knn_table.pt", slots=8, max_group=40, dry_run=False)
    assert seen == {"side": (2, 2), "training": 2}  # 2 untrained runs in a quarter of the slots, 2 trained runs
    timing = json.loads((tmp_path / "packed_timing.json").read_text())[-1]
    assert timing["total_s"] >= max(timing["untrained_and_ready_s"], timing["training_and_evaluation_s"])
    seen["fail"], both_running = True, threading.Barrier(2, timeout=30)
    with pytest.raises(XmlmError, match="a group failed"):
        sweep.run_all_packed(pending, fake_english_data, tmp_path / "runs", tmp_path, PRESETS["full"],
                             tmp_path / "knn_table.pt", slots=8, max_group=40, dry_run=False)


def test_gpu_pack_eval_cpu_gives_bert_small_runs_an_evaluation_on_the_cpu(fake_english_data, tmp_path, monkeypatch):
    """--pack-eval-cpu: a BERT-small run's evaluation gets a CPU variant (niced, two threads) for while other groups
    train, and an untrained BERT-small run's is on the CPU while runs train; an overparam (BERT-base) run's stays on
    the GPU only."""
    from fairseq_xmlm.packed import processes

    seen = {}

    def side(jobs, *args, **kwargs):
        seen["side"] = jobs
        return [0.0] * len(jobs)

    monkeypatch.setattr(processes, "run_jobs", side)
    monkeypatch.setattr(processes, "train_side_by_side",
                        lambda jobs, workdir, max_group, **options: seen.update(options, training=jobs))
    for gpu in (False, True):
        monkeypatch.setattr(recipe, "has_cuda", lambda: gpu)
        sweep.run_all_packed([("0", 0), ("15", 0), ("18", 0)], fake_english_data, tmp_path / "runs", tmp_path,
                             PRESETS["full"], tmp_path / "knn_table.pt", slots=8, max_group=40, dry_run=False,
                             eval_cpu=True)
        small, base = seen["training"]
        assert "--arch xmlm_bert_small" in " ".join(small.argv) and "--arch xmlm_bert_base" in " ".join(base.argv)
        assert base.then_beside == [] and len(base.then) == 1
        on_gpu, = small.then
        assert ("--tf32" in on_gpu) == gpu == seen["tf32"]  # the validations' products as the GPU evaluations'
        on_gpu = [word for word in on_gpu if word != "--tf32"]
        assert small.then_beside == [["nice", "-n", "19", "env", "OMP_NUM_THREADS=2", *on_gpu, "--device", "cpu"]]
        # the untrained BERT-small run (ID 18), evaluated while the others train: on the CPU too
        untrained_evaluation, = seen["side"][-1].then
        assert untrained_evaluation[:5] == ["nice", "-n", "19", "env", "OMP_NUM_THREADS=2"]
        assert untrained_evaluation[-2:] == ["--device", "cpu"] and "--tf32" not in untrained_evaluation


def test_evaluations_on_a_gpu_use_tf32_products_and_those_on_the_cpu_do_not(tmp_path, monkeypatch):
    for gpu in (False, True):
        monkeypatch.setattr(recipe, "has_cuda", lambda: gpu)
        default, on_cpu = (recipe.evaluate_command("0", tmp_path, tmp_path, PRESETS["full"], on_cpu=flag)
                           for flag in (False, True))
        assert ("--tf32" in default) == gpu and "--tf32" not in on_cpu and on_cpu[-2:] == ["--device", "cpu"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
def test_gpu_pack_refuses_to_run_without_a_gpu(fake_english_data, tmp_path, capsys):
    expect_cli_error(capsys, main, ["full", "--ids", "0", "--gpu-pack", "--data", str(fake_english_data),
                                    "--results", str(tmp_path)], "--gpu-pack trains on a GPU")
    assert not list(tmp_path.iterdir())  # nothing started, nothing written


def test_gpu_pack_refuses_train_args(fake_english_data, tmp_path, capsys):
    expect_cli_error(capsys, main, ["full", "--ids", "0", "--gpu-pack", "--train-args=--fp16", "--data",
                                    str(fake_english_data), "--results", str(tmp_path), "--dry-run"],
                     "--train-args apply to fairseq-train runs")


def test_report_writes_tables_from_the_results_present_and_trains_nothing(fake_english_data, tmp_path, capsys):
    from test_tables import fake_result, write_result

    write_result(tmp_path / "runs", "0", 0, fake_result(0.6))
    main(["full", "--report", "--ids", "0,1", "--data", str(tmp_path / "no-data-needed"),
                   "--results", str(tmp_path)])
    assert "| 0 | original | 1 | 0.60 | 0.70 |" in (tmp_path / "table1.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs", "table1.md", "table2.md"]  # nothing trained
    assert "fairseq_cli.train" not in capsys.readouterr().err


def test_status_counts_each_state_per_run_id(tmp_path, capsys):
    from test_tables import fake_result, write_result

    runs = tmp_path / "runs"
    write_result(runs, "0", 0, fake_result(0.6))  # evaluated
    (runs / "0" / "seed42" / "checkpoints").mkdir(parents=True)  # trained, not evaluated
    (runs / "0" / "seed42" / "checkpoints" / "checkpoint_last.pt").write_bytes(b"")
    (runs / "0" / "seed42" / "train.log").write_text("")
    (runs / "0" / "seed43").mkdir()  # its packed group suspended
    (runs / "0" / "seed43" / "train.log.partial").write_text("")
    main(["full", "--status", "--ids", "0,1", "--results", str(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[-8:] == ["evaluated", "1", "trained", "1", "started", "1", "pending", "2"]
    assert lines[1].split()[-8:] == ["evaluated", "0", "trained", "0", "started", "0", "pending", "5"]


def test_report_draws_the_figures_of_the_checkpoints_present(fake_english_checkpoint, fake_english_data, tmp_path):
    """Fig. 4 from run 0's checkpoint, Fig. 5/8 from run 1's (here the same tiny real model); no training log of
    a curve run, so no Fig. 6/7."""
    from test_tables import fake_result, write_result

    runs = tmp_path / "runs"
    for run_id in ("0", "1"):
        write_result(runs, run_id, 0, fake_result(0.6))
        (runs / run_id / "seed0" / "checkpoints").mkdir()
        (runs / run_id / "seed0" / "checkpoints" / "checkpoint_last.pt").symlink_to(fake_english_checkpoint)
    main(["full", "--report", "--ids", "0,1", "--data", str(fake_english_data), "--results", str(tmp_path)])
    figures = sorted(p.name for p in tmp_path.glob("*.png"))
    assert figures == ["fig4_token_pca.png", "fig5_position_similarity.png"]
    assert all((tmp_path / name).stat().st_size > 10_000 for name in figures)
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind
