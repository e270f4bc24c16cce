"""benchmarks/trace_gaps.py on a hand-made profiler timeline (the real one needs a GPU): the window's first and last
updates left out, gaps by length and by the call that launched the work after them, overlapping kernels counted
once, and one error line for what is not a trace."""
import gzip
import importlib.util
import json
import os

spec = importlib.util.spec_from_file_location(
    "trace_gaps", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "trace_gaps.py"))
trace_gaps = importlib.util.module_from_spec(spec)
spec.loader.exec_module(trace_gaps)


def timeline():
    events = []
    for step in range(4):  # updates 0 and 3 open and close the window: left out
        start = 1000 * step
        events.append({"cat": "gpu_user_annotation", "ph": "X", "name": f"train_step-{step}", "ts": start,
                       "dur": 900})
        # kernels at 0-100, 101-300 (gap 1 us, a graph's), 250-400 (overlaps), 410-900 (gap 10 us, launched alone)
        for n, (begin, end, launch) in enumerate([(0, 100, "cudaLaunchKernel"), (101, 300, "cudaGraphLaunch"),
                                                  (250, 400, "cudaGraphLaunch"), (410, 900, "cudaLaunchKernel")]):
            correlation = 10 * step + n
            events.append({"cat": "kernel", "ph": "X", "name": "k", "ts": start + begin, "dur": end - begin,
                           "args": {"correlation": correlation}})
            events.append({"cat": "cuda_runtime", "ph": "X", "name": launch, "ts": start + begin - 50, "dur": 5,
                           "args": {"correlation": correlation}})
    return events


def test_gaps_of_the_middle_updates():
    summary = trace_gaps.summarise(timeline())
    assert summary["updates"] == 2
    assert summary["wall_ms"] == 1.9 / 2  # from update 1's start to update 2's end
    assert summary["kernels"] == 4
    assert summary["busy_ms"] == 0.889  # 900 us less the two gaps, the overlap counted once
    assert summary["gap_ms"] == 0.011
    assert summary["gaps_by_length"]["< 2 us"] == {"count": 1, "ms": 0.001}
    assert summary["gaps_by_length"]["5-20 us"] == {"count": 1, "ms": 0.01}
    assert summary["gap_ms_by_launch"] == {"cudaLaunchKernel": 0.01, "cudaGraphLaunch": 0.001}
    assert summary["calls"] == {"k": {"count": 4, "ms": 0.939}}  # each kernel's own time: 100 + 199 + 150 + 490 us


def test_main_prints_and_refuses_what_is_not_a_trace(tmp_path, capsys):
    path = tmp_path / "run.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": timeline()}, f)
    assert trace_gaps.main([str(path), "--kernels", "5"]) == 0
    out = capsys.readouterr().out
    assert "2 updates" in out and "4.0 calls, 0.939 ms an update: k" in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert trace_gaps.main([str(bad)]) == 2
    assert trace_gaps.main([str(tmp_path / "missing.json")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all(line.startswith("error: ") for line in errors)
