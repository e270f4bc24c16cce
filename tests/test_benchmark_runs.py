"""The benchmarks' fairseq-train runs on the CPU (benchmarks/_common.py, ddp_scaling.py): a benchmark stopped by
`timeout`, or a run past its time limit, takes its fairseq-train run (and whatever that started) down with it; the
multi-GPU runs' names and launch commands."""
import os
import signal
import subprocess
import sys
import time

from torch.distributed.run import get_args_parser

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCHMARKS)
import _common  # noqa: E402
import ddp_scaling  # noqa: E402

# fairseq-train's stand-in: it starts a grandchild (as fairseq-train starts DDP ranks and data-loader workers) that
# writes its pid to argv[1] and would otherwise outlive everyone.
GRANDCHILD = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
RUN = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {GRANDCHILD!r}, sys.argv[1]]); " \
      "time.sleep(60)"
# The benchmark's stand-in: run_child(RUN) in a process of its own, to be sent SIGTERM.
BENCHMARK = """
import sys
sys.path.insert(0, sys.argv[1])
import _common
with open(sys.argv[3], "w") as log:
    _common.run_child([sys.executable, "-c", sys.argv[4], sys.argv[2]], log)
"""


def test_sigterm_stops_the_run_and_everything_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    benchmark = subprocess.Popen([sys.executable, "-c", BENCHMARK, BENCHMARKS, str(pid_file), str(tmp_path / "run.log"),
                                  RUN])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() < deadline and benchmark.poll() is None, "the grandchild never started"
        time.sleep(0.05)
    benchmark.send_signal(signal.SIGTERM)
    assert benchmark.wait(30) == 128 + signal.SIGTERM
    assert_gone_soon(int(pid_file.read_text()))


def test_a_run_past_its_time_limit_is_stopped_with_what_it_started_and_reported(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    with open(tmp_path / "run.log", "w") as log:
        rc = _common.run_child([sys.executable, "-c", RUN, str(pid_file)], log, time_limit=5)
    assert rc == _common.RUN_TIMED_OUT and time.monotonic() - started < 30 and pid_file.exists()
    assert_gone_soon(int(pid_file.read_text()))


def test_a_run_that_hangs_after_training_is_stopped_soon_after_and_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(_common, "EXIT_GRACE_S", 1)
    script = tmp_path / "hangs.py"  # fairseq-train's stand-in: two logged intervals, the end, then no exit
    script.write_text("import json, time\n"
                      "for wps in (2.0, 4.0):\n"
                      "    print('x | INFO | train_inner | ' + json.dumps({'wps': str(wps), 'ups': '1.0'}))\n"
                      "print('x | INFO | fairseq_cli.train | done training in 1.0 seconds', flush=True)\n"
                      "time.sleep(60)\n")
    bench = _common.Bench(str(tmp_path))
    bench.run_seconds = 50
    monkeypatch.setattr(_common, "train_command",
                        lambda argv, updates, interval, launcher, module, seed: [sys.executable, str(script)])
    started = time.monotonic()
    result = bench.train("hangs", [], updates=2, interval=1)
    assert time.monotonic() - started < 20
    assert result["stopped_after_training"] and result["rc"] == 0 and result["wps"] == 4.0  # after the first interval


def assert_gone_soon(pid):
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid):
        assert time.time() < deadline, "the grandchild outlived its run"
        time.sleep(0.05)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_ddp_variants_name_each_run_by_its_arguments():
    assert ddp_scaling.ddp_variants("") == [("", [])]
    assert ddp_scaling.ddp_variants("--ddp-backend legacy_ddp; --gradient-as-bucket-view") == [
        ("+ddp-backend=legacy_ddp", ["--ddp-backend", "legacy_ddp"]),
        ("+gradient-as-bucket-view", ["--gradient-as-bucket-view"])]
    assert (_common.log_file_name("multi_ours_4gpu+ddp-backend=legacy_ddp")
            == "multi_ours_4gpu_ddp-backend_legacy_ddp.log")


def test_multigpu_runs_alternate_kinds_named_again_under_their_own_labels():
    legacy = ddp_scaling.ddp_variants("--ddp-backend legacy_ddp")
    runs = ddp_scaling.multigpu_runs(["ours", "stock", "before_ours", "ours"], [1, 4], legacy)
    assert [(kind, repeat, n, label) for kind, repeat, n, label, _ in runs] == [
        ("ours", 1, 1, "ours_1gpu"), ("ours", 1, 4, "ours_4gpu+ddp-backend=legacy_ddp"),
        ("stock", 1, 1, "stock_1gpu"), ("stock", 1, 4, "stock_4gpu"),
        ("before_ours", 1, 1, "before_ours_1gpu"), ("before_ours", 1, 4, "before_ours_4gpu+ddp-backend=legacy_ddp"),
        ("ours", 2, 1, "ours_1gpu_run2"), ("ours", 2, 4, "ours_4gpu+ddp-backend=legacy_ddp_run2")]
    assert runs[1][4] == ["--ddp-backend", "legacy_ddp"] and runs[3][4] == []  # stock keeps fairseq's default DDP


def test_torchrun_launches_fairseq_train_one_process_per_gpu_with_the_options_given():
    """BENCH_TORCHRUN's command, read back by torchrun's own parser (a misspelt option would fail here)."""
    command = _common.train_command(["data", "--fp16"], 200, 50,
                                    _common.torchrun_launcher(4, "--numa-binding exclusive"))
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(command[3:])
    assert (args.standalone, args.nproc_per_node, args.numa_binding, args.module) == (True, "4", "exclusive", True)
    assert args.training_script == "fairseq_cli.train" and args.training_script_args[:2] == ["data", "--fp16"]


def test_xmlm_train_variants_run_xmlm_trains_module_with_the_same_arguments():
    variants = _common.single_variants()
    name = "fp16_flat_master_cudagraphs_cudnn"
    assert variants[name + _common.XMLM_TRAIN] == variants[name]
    assert _common.entry_module(name) == "fairseq_cli.train"
    command = _common.train_command(variants[name], 200, 50,
                                    module=_common.entry_module(name + _common.XMLM_TRAIN))
    assert command[1:3] == ["-m", "fairseq_xmlm.train"]


def test_precision_curves_compare_with_fp32_and_reuse_finished_runs(tmp_path):
    """precision_curves.py: the tail's mean loss and mean |difference| to fp32, the seed-to-seed yardstick, and an
    earlier summary's finished runs (a failed one is trained again)."""
    import json

    import precision_curves

    curves = {"fp32": {10: 9.0, 20: 8.0, 30: 7.0}, "bf16_params": {10: 9.1, 20: 8.2, 30: 7.0},
              "bf16_params_seed2": {10: 9.0, 20: 8.5, 30: 7.5}}
    summary = precision_curves.summarise(curves, updates=30, tail=20)
    assert summary["fp32"]["tail_loss"] == 7.5
    assert abs(summary["bf16_params"]["abs_diff_to_fp32"] - 0.1) < 1e-9
    assert abs(summary["seed_to_seed_abs_diff"] - 0.4) < 1e-9
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"runs": {"fp32": {"rc": 0, "cmd": "a"}, "fp16": {"rc": 1, "cmd": "b"}},
                                "curves": {"fp32": {"10": 9.0}, "fp16": {}}}))
    assert precision_curves.finished_runs(path) == {"fp32": ({"rc": 0, "cmd": "a"}, {10: 9.0})}
    assert precision_curves.finished_runs(tmp_path / "none.json") == {}
