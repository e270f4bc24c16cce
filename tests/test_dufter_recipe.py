"""python -m fairseq_xmlm.experiments.dufter: the commands it plans, fairseq-train's or --gpu-pack's, and its
bad-input errors."""
import json
import shlex

import pytest
import torch

from conftest import expect_cli_error
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter import recipe, sweep
from fairseq_xmlm.experiments.dufter.__main__ import main
from fairseq_xmlm.experiments.dufter.runs import DEFAULT_SCHEDULE, PRESETS
from fairseq_xmlm.packed.runs import parse_run


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


def test_seed_list_trains_the_seeds_it_names(fake_english_data, tmp_path, capsys):
    common = ["full", "--ids", "1", "--data", str(fake_english_data), "--results", str(tmp_path), "--dry-run"]
    train = [c for c in planned(capsys, common + ["--seed-list", "7, 1"]) if "fairseq_cli.train" in c]
    assert len(train) == 2 and "--seed 7 " in train[0] and "--seed 1 " in train[1]
    for bad in ("1,x", "3,3", "-1", ","):
        expect_cli_error(capsys, main, common + ["--seed-list", bad], "--seed-list")
    expect_cli_error(capsys, main, common + ["--seed-list", "1", "--seeds", "2"], "give one")


def test_gpu_pack_makes_untrained_runs_beside_the_training_and_stops_them_when_it_fails(fake_english_data, tmp_path,
                                                                                         monkeypatch):
    """The untrained checkpoints (and evaluations) no longer wait for the training to start: both stages run at
    once; when the training fails, the other stage is stopped and the training's error is the one raised."""
    import threading
    import time

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
        monkeypatch.setattr(recipe, "has_gpu", lambda: gpu)
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
        monkeypatch.setattr(recipe, "has_gpu", lambda: gpu)
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
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dufter_table1.json", "runs", "table1.md",
                                                          "table2.md"]  # nothing trained
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


def train_commands(capsys, argv):
    return [c for c in planned(capsys, argv) if "fairseq_cli.train" in c]


def option(command, name):
    words = command.split()
    return words[words.index(name) + 1]


def test_padding_specials_schedule_attends_to_padding_everywhere_and_shifts_after_masking_where_it_shifts(
        fake_english_data, tmp_path, capsys):
    """paper-code-padding-specials: every command, the untrained ones too (their evaluation attends as the training
    would), has --attend-padding; --shift-special-after-masking only the trained --shift-special runs; paper-code
    neither."""
    common = ["full", "--ids", "0,2,5,18", "--seeds", "1", "--data", str(fake_english_data), "--results",
              str(tmp_path), "--dry-run"]
    commands = [c for c in planned(capsys, common + ["--schedule", "paper-code-padding-specials"])
                if "fairseq_cli.train" in c or "fairseq_xmlm.untrained" in c]
    assert len(commands) == 4 and all("--attend-padding" in c.split() for c in commands)
    assert [("--shift-special-after-masking" in c.split()) for c in commands] == [False, True, True, False]
    assert not any("--attend-padding" in c or "after-masking" in c
                   for c in planned(capsys, common + ["--schedule", "paper-code"]))


def test_micro_batches_schedule_accumulates_the_overparam_runs_only(fake_english_data, tmp_path, capsys):
    """paper-code-micro-batches: the BERT-base runs train micro-batches of 16, 8 to an update of 128 sentences (the
    same 137 updates an epoch), every other run batches of 128, all as paper-code-padding-specials otherwise; the
    packed plan takes such a command."""
    common = ["full", "--ids", "0,15,16", "--seeds", "1", "--data", str(fake_english_data), "--results",
              str(tmp_path), "--dry-run"]
    small, *base = train_commands(capsys, common + ["--schedule", "paper-code-micro-batches"])
    default = train_commands(capsys, common)
    assert (option(small, "--batch-size"), "--update-freq" in small) == ("128", False) and small == default[0]
    for micro, whole in zip(base, default[1:]):
        assert (option(micro, "--batch-size"), option(micro, "--update-freq")) == ("16", "8")
        assert option(micro, "--total-num-update") == option(whole, "--total-num-update") == "13700"
        assert micro.replace("--batch-size 16 --update-freq 8", "--batch-size 128") == whole
    run = parse_run(shlex.split(base[0]) + ["--log-file", str(tmp_path / "train.log")])  # as the sweep adds it
    assert (run.update_size, run.micro_batch) == (128, 16)
    assert recipe.batch_options(128, 0) == recipe.batch_options(128, 128) == ["--batch-size", 128]
    with pytest.raises(XmlmError, match="micro-batches of 48 do not divide batches of 128"):
        recipe.batch_options(128, 48)


def test_schedules_match_the_papers_updates_and_keep_the_2026_11_28_one(fake_english_data, tmp_path, capsys):
    """The default trains the paper's ~13,500 updates (batches of 128: 137 an epoch); 200 epochs and clause units
    come near it too; `--schedule 2026-11-28` is the 5-seed table's 69 x 100; each schedule's results apart."""
    from fairseq_xmlm.data.preparation import prepare_fake_english_clauses
    from fairseq_xmlm.experiments.dufter.__main__ import results_dir

    clauses = fake_english_data.with_name(fake_english_data.name + "_clauses")
    if not (clauses / "dict.txt").exists():
        prepare_fake_english_clauses(fake_english_data, clauses)
    common = ["full", "--ids", "0", "--seeds", "1", "--data", str(fake_english_data), "--results", str(tmp_path),
              "--dry-run"]
    expected = {None: (128, 100, 13700, "1.0"), "paper-code": (128, 100, 13700, "1.0"),
                "paper-code-padding-specials": (128, 100, 13700, "1.0"), "batch128-clip": (128, 100, 13700, "1.0"),
                "batch128": (128, 100, 13700, None), "2026-11-28": (256, 100, 6900, None),
                "epochs200": (256, 200, 13800, None), "clauses": (256, 100, 13700, None)}
    for schedule, (batch, epochs, updates, clip) in expected.items():
        command, = train_commands(capsys, common + ([] if schedule is None else ["--schedule", schedule]))
        assert (int(option(command, "--batch-size")), int(option(command, "--max-epoch")),
                int(option(command, "--total-num-update"))) == (batch, epochs, updates), schedule
        assert (option(command, "--clip-norm") if "--clip-norm" in command else None) == clip, schedule
        assert command.split()[3] == str(clauses if schedule == "clauses" else fake_english_data)
    # the no-random runs' MASK share: the paper's code (.9) by default, its text (.8) under every other schedule
    for schedule, share in ((None, "0.9"), ("batch128-clip", None), ("2026-11-28", None)):
        no_random, original = train_commands(capsys, common[:2] + ["4,0"] + common[3:]
                                             + ([] if schedule is None else ["--schedule", schedule]))
        assert "--no-random" in no_random.split() and "--no-random-mask-share" not in original
        if share:
            assert option(no_random, "--no-random-mask-share") == share
        else:
            assert "--no-random-mask-share" not in no_random, schedule
    assert results_dir("2026-11-28") == recipe.REPO / "results" / "dufter"
    assert results_dir("batch128") == recipe.REPO / "results" / "dufter" / "batch128"


def test_clip_norm_and_pack_precision_reach_both_paths(fake_english_data, tmp_path, capsys, monkeypatch):
    """--clip-norm goes into every fairseq-train command (the packed path parses and honours it:
    tests/test_packed_training.py) in place of the schedule's, --pack-precision to the packed processes."""
    from fairseq_xmlm.packed import processes

    common = ["full", "--ids", "0,4", "--seeds", "1", "--data", str(fake_english_data), "--results", str(tmp_path),
              "--dry-run"]
    assert all("--clip-norm" not in c for c in train_commands(capsys, common + ["--schedule", "batch128"]))
    assert all("--clip-norm" not in c for c in train_commands(capsys, common + ["--clip-norm", "0"]))
    for extra in ([], ["--gpu-pack"]):
        commands = train_commands(capsys, common + extra + ["--schedule", "batch128", "--clip-norm", "0.5"])
        assert len(commands) == 2 and all(c.count("--clip-norm") == 1 and option(c, "--clip-norm") == "0.5"
                                          for c in commands)
    seen = {}
    monkeypatch.setattr(processes, "run_jobs", lambda jobs, *args, **kwargs: [0.0] * len(jobs))
    monkeypatch.setattr(processes, "train_side_by_side",
                        lambda jobs, workdir, max_group, **options: seen.update(options, training=jobs))
    for precision in ("bf16", "fp32"):
        sweep.run_all_packed([("0", 0)], fake_english_data, tmp_path / "runs", tmp_path, PRESETS["full"],
                             tmp_path / "knn_table.pt", slots=2, max_group=40, dry_run=False, precision=precision,
                             train_args=lambda run_id: ["--clip-norm", "1.0"])
        assert seen["precision"] == precision and "--clip-norm 1.0" in " ".join(seen["training"][0].argv)
    expect_cli_error(capsys, main, common + ["--clip-norm", "-1"], "--clip-norm must be >= 0")


def test_lr_sets_the_small_runs_peak_and_overparam_keeps_its_own(fake_english_data, tmp_path, capsys):
    """--lr reaches the BERT-small runs' commands on both paths (one --lr each); overparam's BERT-base keeps 1e-4."""
    common = ["full", "--ids", "0,1,15", "--seeds", "1", "--data", str(fake_english_data), "--results",
              str(tmp_path), "--dry-run"]
    default = train_commands(capsys, common)
    assert [option(c, "--lr") for c in default] == ["2e-3", "2e-3", "1e-4"]
    for extra in ([], ["--gpu-pack"]):
        commands = train_commands(capsys, common + extra + ["--lr", "1e-3"])
        assert [(c.count("--lr "), option(c, "--lr")) for c in commands] == [(1, "0.001"), (1, "0.001"),
                                                                            (1, "1e-4")]
    expect_cli_error(capsys, main, common + ["--lr", "0"], "--lr must be > 0")


def test_report_writes_the_table_json_in_the_docs_schema_and_the_in_domain_table(fake_english_data, tmp_path,
                                                                                 capsys):
    from test_tables import fake_result, write_result

    runs = tmp_path / "runs"
    for seed, mu in ((0, 0.6), (42, 0.7)):
        write_result(runs, "0", seed, fake_result(mu, rho=(0.2 + mu / 10, 0.9)))
    write_result(runs, "4", 0, fake_result(0.5))
    (runs / "4" / "seed0" / "train.log").write_text(  # (a log of ID 0 would be drawn as a Fig. 6/7 curve)
        '2026-11-29 10:00:00 | INFO | train | {"epoch": 100, "train_loss": "3.2", "train_num_updates": "13700"}\n')
    (runs / "0" / "seed0" / "eval_indomain.json").write_text(json.dumps(fake_result(0.45)))
    main(["full", "--report", "--ids", "0,4,15", "--data", str(tmp_path / "no-data-needed"), "--results",
          str(tmp_path)])
    assert "| 0 | original | 1 | 0.45 | 0.70 |" in (tmp_path / "table1_indomain.md").read_text()
    table = json.loads((tmp_path / "dufter_table1.json").read_text())
    assert set(table) == {"setting", "updates", "seeds", "rows"}
    assert table["setting"].startswith(f"{DEFAULT_SCHEDULE}: ")
    assert table["updates"] == 13700 and table["seeds"] == [0, 42] and list(table["rows"]) == ["0", "4"]
    row = table["rows"]["0"]
    assert set(row) == {"mu", "mu_std", "n", "layers", "ppl_train", "ppl_dev", "stalled"}
    assert row["n"] == 2 and row["stalled"] == 0  # the schema, and how many seeds stalled
    assert row["mu"] == pytest.approx(0.65) and row["mu_std"] == pytest.approx(0.0707, abs=1e-4)
    assert row["layers"]["0"] == pytest.approx({"align_f1": 1.0, "retrieval": 0.265, "translation": 0.8})
    assert set(row["layers"]) == {"0", "8"} and row["layers"]["8"]["retrieval"] == pytest.approx(0.9)
    assert (row["ppl_train"], row["ppl_dev"]) == (9.0, 200.0) and table["rows"]["4"]["mu_std"] is None
    # a preset that trains otherwise than the schedule says (the quickstart's batches of 32) names its own setting
    main(["quickstart", "--report", "--ids", "0", "--data", str(tmp_path / "no-data-needed"), "--results",
          str(tmp_path)])
    setting = json.loads((tmp_path / "dufter_table1.json").read_text())["setting"]
    assert setting.startswith(f"{DEFAULT_SCHEDULE}: ")
    assert "; preset quickstart: 3 epochs of batches of 32 sentences" in setting


def test_indomain_dev_evaluates_each_run_on_the_bbe_old_testament_too(fake_english_data, tmp_path, capsys):
    evaluations = [c for c in planned(capsys, ["full", "--ids", "0,18", "--seeds", "1", "--data",
                                               str(fake_english_data), "--results", str(tmp_path), "--dry-run",
                                               "--indomain-dev"]) if "eval_mult" in c]
    indomain = fake_english_data.with_name(fake_english_data.name + "_indomain")
    assert len(evaluations) == 4
    assert [option(c, "--data") for c in evaluations if "eval_indomain.json" in c] == [str(indomain)] * 2


def test_epochs_overrides_the_presets_and_is_checked(fake_english_data, tmp_path, capsys):
    """--epochs sets every run's epochs (the learning-rate schedule's total with them); 0 is refused."""
    common = ["quickstart", "--ids", "0", "--data", str(fake_english_data), "--results", str(tmp_path), "--dry-run"]
    train = [c for c in planned(capsys, common + ["--epochs", "6"]) if "fairseq_cli.train" in c]
    default = [c for c in planned(capsys, common) if "fairseq_cli.train" in c]
    assert "--max-epoch 6 " in train[0] and f"--max-epoch {PRESETS['quickstart']['epochs']} " in default[0]
    assert option(default[0], "--lr") == "7e-4" and option(default[0], "--clip-norm") == "1.0"  # runs.PRESETS
    total = {c: int(c.split("--total-num-update ")[1].split()[0]) for c in (train[0], default[0])}
    assert total[train[0]] * PRESETS["quickstart"]["epochs"] == total[default[0]] * 6
    expect_cli_error(capsys, main, common + ["--epochs", "0"], "--epochs must be at least 1")
