"""Where the GPU waits inside an update: the gaps between kernels of a `profile_step.py --trace` timeline, update by
update.

    python3 benchmarks/trace_gaps.py DIR/<run>.trace.json.gz [--kernels 30]

profile_step.py's idle time is the profiled window's wall less its kernels, over every profiled update: it counts
the waits around the synchronisation that opens the window and the profiler's own stop. This reads the timeline
instead and keeps the updates in the window's middle (the GPU-side `train_step-N` annotations but the first and the
last): their wall from the first one's first kernel to the last one's last; for each, its span on the GPU from its
first kernel to its last, the kernels' busy time, their number, and the gaps between consecutive kernels, copies and
memsets, by length and by the host call that launched the kernel after the gap (cudaGraphLaunch: a kernel of a CUDA
graph, waiting on the one before it inside the graph). Prints the per-update mean, and the range of the host's time
in those updates' train_step: where it is shorter than the GPU's span, the host can run ahead. With --kernels N, also
the N kernels launched most often, with their calls and time an update: what fusing would save in launch gaps. Not a
test.
"""
import argparse
import gzip
import json
import sys

GPU_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
LENGTHS = ((2, "< 2 us"), (5, "2-5 us"), (20, "5-20 us"), (100, "20-100 us"), (float("inf"), ">= 100 us"))


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)["traceEvents"]


def updates(events, side="gpu_user_annotation"):
    """The train_step annotations of the GPU (or with side "user_annotation", of the host), in time order, less the
    window's first and last update."""
    steps = sorted((e for e in events if e.get("cat") == side and e["name"].startswith("train_step")),
                   key=lambda e: e["ts"])
    return steps[1:-1]


def gaps_of(work, start, end):
    """(the GPU work items starting inside [start, end], their busy us, [(gap us, the work item after it)])."""
    inside = [w for w in work if start <= w["ts"] <= end]
    if not inside:
        return inside, 0.0, []
    busy, gaps, until = 0.0, [], inside[0]["ts"]
    for item in inside:
        if item["ts"] > until:
            gaps.append((item["ts"] - until, item))
        busy += max(0.0, item["ts"] + item["dur"] - max(until, item["ts"]))  # overlap counted once
        until = max(until, item["ts"] + item["dur"])
    return inside, busy, gaps


def summarise(events):
    work = sorted((e for e in events if e.get("cat") in GPU_WORK and e.get("ph") == "X"), key=lambda e: e["ts"])
    launches = {e["args"]["correlation"]: e["name"] for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    steps = updates(events)
    totals = {"span": 0.0, "busy": 0.0, "kernels": 0, "gaps": 0.0}
    calls = {}  # kernel name: [calls, us]
    by_length, by_launch = {label: [0, 0.0] for _, label in LENGTHS}, {}
    for step in steps:
        inside, busy, gaps = gaps_of(work, step["ts"], step["ts"] + step["dur"])
        for item in inside:
            row = calls.setdefault(item["name"], [0, 0.0])
            row[0] += 1
            row[1] += item["dur"]
        totals["span"] += step["dur"]
        totals["busy"] += busy
        totals["kernels"] += len(inside)
        for gap, after in gaps:
            totals["gaps"] += gap
            label = next(label for limit, label in LENGTHS if gap < limit)
            by_length[label][0] += 1
            by_length[label][1] += gap
            launch = launches.get(after.get("args", {}).get("correlation"), "unknown")
            by_launch[launch] = by_launch.get(launch, 0.0) + gap
    n = max(1, len(steps))
    host = [e["dur"] / 1e3 for e in updates(events, "user_annotation")] or [0.0]
    wall = (steps[-1]["ts"] + steps[-1]["dur"] - steps[0]["ts"]) if steps else 0.0
    return {"updates": len(steps), "wall_ms": wall / n / 1e3, "span_ms": totals["span"] / n / 1e3,
            "busy_ms": totals["busy"] / n / 1e3, "kernels": totals["kernels"] / n,
            "host_train_step_ms": {"min": min(host), "max": max(host)}, "gap_ms": totals["gaps"] / n / 1e3,
            "gaps_by_length": {label: {"count": c / n, "ms": us / n / 1e3} for label, (c, us) in by_length.items()},
            "gap_ms_by_launch": {k: us / n / 1e3 for k, us in sorted(by_launch.items(), key=lambda kv: -kv[1])},
            "calls": {name: {"count": c / n, "ms": us / n / 1e3}
                      for name, (c, us) in sorted(calls.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))}}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", help="a .trace.json(.gz) of profile_step.py --trace")
    parser.add_argument("--kernels", type=int, default=0, help="also list this many of the most often launched")
    args = parser.parse_args(argv)
    try:
        events = load(args.trace)
    except (OSError, ValueError, KeyError) as error:
        print(f"error: {args.trace}: not a readable profiler trace ({error})", file=sys.stderr)
        return 2
    summary = summarise(events)
    if not summary["updates"]:
        print(f"error: {args.trace}: fewer than 3 train_step annotations on the GPU", file=sys.stderr)
        return 2
    host = summary["host_train_step_ms"]
    print(f"{summary['updates']} updates: {summary['wall_ms']:.2f} ms an update from the first's first kernel to the "
          f"last's last; within an update {summary['span_ms']:.2f} ms, {summary['busy_ms']:.2f} ms of it busy in "
          f"{summary['kernels']:.0f} kernels, copies and memsets, {summary['gap_ms']:.2f} ms of gaps; the host's "
          f"train_step took {host['min']:.2f}-{host['max']:.2f} ms")
    for label, row in summary["gaps_by_length"].items():
        print(f"  gaps {label:>10}: {row['count']:6.1f} an update, {row['ms']:.3f} ms")
    for launch, ms in summary["gap_ms_by_launch"].items():
        print(f"  before work launched by {launch}: {ms:.3f} ms")
    for name, row in list(summary["calls"].items())[:args.kernels]:
        print(f"  {row['count']:6.1f} calls, {row['ms']:.3f} ms an update: {name[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
