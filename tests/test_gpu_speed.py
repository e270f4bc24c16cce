"""benchmarks/gpu_speed.py's child processes: a benchmark stopped by `timeout` takes its fairseq-train runs (and
whatever they started) down with it."""
import os
import signal
import subprocess
import sys
import time

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "benchmarks")

# The benchmark's stand-in: a run_child whose command starts a grandchild (as fairseq-train starts DDP ranks and
# data-loader workers) that would otherwise outlive everyone.
PARENT = """
import subprocess, sys
sys.path.insert(0, sys.argv[1])
import gpu_speed
grandchild = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
child = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', %r, sys.argv[1]]); time.sleep(60)"
         % grandchild)
with open(sys.argv[3], "w") as log:
    gpu_speed.run_child([sys.executable, "-c", child, sys.argv[2]], log)
"""


def test_sigterm_stops_the_run_and_everything_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    parent = subprocess.Popen([sys.executable, "-c", PARENT, BENCHMARKS, str(pid_file), str(tmp_path / "run.log")])
    deadline = time.time() + 60
    while not (pid_file.exists() and pid_file.read_text()):
        assert time.time() < deadline and parent.poll() is None, "the grandchild never started"
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(30) == 128 + signal.SIGTERM
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{grandchild}") and "Z" not in _state(grandchild):
        assert time.time() < deadline, "the grandchild outlived the benchmark"
        time.sleep(0.05)


def _state(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def test_a_run_past_its_time_limit_is_stopped_with_what_it_started_and_reported(tmp_path):
    sys.path.insert(0, BENCHMARKS)
    import gpu_speed

    pid_file = tmp_path / "grandchild.pid"
    grandchild = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(60)"
    child = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {grandchild!r}, sys.argv[1]]); " \
            "time.sleep(60)"
    started = time.monotonic()
    with open(tmp_path / "run.log", "w") as log:
        rc = gpu_speed.run_child([sys.executable, "-c", child, str(pid_file)], log, time_limit=5)
    assert rc == gpu_speed.RUN_TIMED_OUT and time.monotonic() - started < 30 and pid_file.exists()
    deadline = time.time() + 10
    while os.path.exists(f"/proc/{int(pid_file.read_text())}") and "Z" not in _state(int(pid_file.read_text())):
        assert time.time() < deadline, "the grandchild outlived its run"
        time.sleep(0.05)
