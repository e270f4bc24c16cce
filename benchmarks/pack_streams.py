"""Whether packed groups gain from training at the same time in one process, each on a CUDA stream of its own.

    python3 benchmarks/pack_streams.py --groups 15,16,17 0,1,2,3,4,5,6,7,8,9,30 --seconds 15 --out OUT/streams

Each group is a list of run IDs of `examples/dufter/run.py full` (":S" stacks S seeds, default 1; "@F" from the
recipe's F-th seed, default 0), built as `--gpu-pack` builds it (`packed_training.PackedGroup`, compiled, bf16,
CUDA graphs, real batches of epoch 1 in fairseq's order) on a stream of its own, and warmed up (every batch shape
captured). Then, for --seconds each:
- alone: each group by itself;
- lockstep: rounds of one update of every group, each on its stream (what a process training several groups of
  the same length at once would do); a round's time against the sum of the groups' alone step times says what the
  overlap gains; with more than two groups, also the first group with each other one, or the --subsets given
  (indices into --groups); the same rounds with every group on the default stream (their updates one after another)
  are the control;
- free: every group as fast as it can go, none waiting for another; the sum of together/alone ratios says the same
  as `pack_overlap.py`'s (1 = the groups merely took turns).
Each group keeps at most two updates queued on its stream, and captures its graphs on it (`PackedGroup._capture`:
before the twentieth session they shared one capture stream and computed wrong results at once). GPU only; not a
test: it times the groups, and `lockstep_equal.py` checks their results.
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


class Lane:
    """One group on its own stream: `launch()` queues its next update, after waiting until at most one is queued."""

    def __init__(self, group, schedules):
        import pack_profile

        self.runs = len(group.runs)
        self.stream = torch.cuda.Stream()
        self.step = pack_profile.cycling_steps(group, schedules)
        self.queued = []  # events of the updates launched and maybe not finished

    def ready(self):
        self.queued = [event for event in self.queued if not event.query()]
        return len(self.queued) < 2

    def launch(self):
        while not self.ready():
            self.queued[0].synchronize()
        with torch.cuda.stream(self.stream):
            self.step()
            event = torch.cuda.Event()
            event.record()
        self.queued.append(event)


def timed(lanes, seconds, policy):
    """Updates per lane in `seconds` under `policy` ("lockstep" or "free") -> (updates per lane, wall seconds)."""
    torch.cuda.synchronize()
    counts, started = [0] * len(lanes), time.perf_counter()
    while time.perf_counter() - started < seconds:
        for i, lane in enumerate(lanes):
            # one lane, or lockstep: launch() waits for the GPU itself, no polling of events
            if policy == "lockstep" or len(lanes) == 1 or lane.ready():
                lane.launch()
                counts[i] += 1
    torch.cuda.synchronize()
    return counts, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", nargs="+", default=["15,16,17", "0,1,2,3,4,5,6,7,8,9,30"])
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--warmup", type=int, default=80, help="updates per group before timing (an epoch is 69)")
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each timed phase")
    parser.add_argument("--subsets", nargs="*", default=None,
                        help="lockstep also these subsets of the groups, each as comma-separated indices into --groups "
                        "(default: the first group with each other one)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    count = len(args.groups)
    if args.subsets is not None:
        chosen = [[int(i) for i in subset.split(",")] for subset in args.subsets]
        if any(not 0 <= i < count for subset in chosen for i in subset):
            raise SystemExit(f"pack_streams: --subsets indices must lie in 0..{count - 1}")
    else:
        chosen = [[0, i] for i in range(1, count)] if count > 2 else []
    if not torch.cuda.is_available():
        raise SystemExit("pack_streams: needs a GPU")
    sys.path.insert(0, str(HERE))
    import pack_overlap

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # the groups share the compiled optimizer step (each model shape has its own layer function since the nineteenth
    # session): room for more versions than dynamo's default 8 (raising it changed nothing measurable when the layer
    # function was shared too, docs/benchmarks.md, eighteenth session)
    torch._dynamo.config.recompile_limit = 64
    lanes = []
    for spec in args.groups:
        started = time.perf_counter()
        lane = Lane(*pack_overlap.build_group(spec, args, cuda_graphs=True))
        for _ in range(args.warmup):
            lane.launch()
        torch.cuda.synchronize()
        print(f"[pack_streams] group {spec}: {lane.runs} runs, built and warmed up in "
              f"{time.perf_counter() - started:.1f} s; peak GPU memory so far "
              f"{torch.cuda.max_memory_allocated() / 1e9:.1f} GB", flush=True)
        lanes.append(lane)
    result = {"device": torch.cuda.get_device_name(), "argv": sys.argv[1:], "groups": args.groups}
    alone_ms = []
    for spec, lane in zip(args.groups, lanes):
        (count,), wall = timed([lane], args.seconds, "free")
        alone_ms.append(1e3 * wall / count)
        print(f"[pack_streams] {spec} alone: {alone_ms[-1]:.2f} ms/update, "
              f"{count * lane.runs / wall:.1f} run-updates/s", flush=True)
    result["alone_ms_per_update"] = alone_ms
    subsets = [list(range(len(lanes)))] + chosen
    result["lockstep"] = []
    own_streams = [lane.stream for lane in lanes]
    for members in subsets:
        names = " + ".join(args.groups[i] for i in members)
        apart_ms = sum(alone_ms[i] for i in members)
        for streams in ("own streams", "one stream"):
            for i, lane in enumerate(lanes):  # one stream: the same rounds, the groups' updates one after another
                lane.stream = own_streams[i] if streams == "own streams" else torch.cuda.default_stream()
            counts, wall = timed([lanes[i] for i in members], args.seconds, "lockstep")
            round_ms = 1e3 * wall / counts[0]
            result["lockstep"].append({"groups": names, "streams": streams, "ms_per_round": round_ms,
                                       "sum_alone_ms": apart_ms})
            print(f"[pack_streams] lockstep {names}, {streams}: {round_ms:.2f} ms per round of one update each, "
                  f"against {apart_ms:.2f} ms alone one after another: {apart_ms / round_ms:.3f}x", flush=True)
    counts, wall = timed(lanes, args.seconds, "free")
    ratios = [count / wall * ms / 1e3 for count, ms in zip(counts, alone_ms)]
    result.update(free_ms_per_update=[1e3 * wall / count for count in counts], free_over_alone=ratios)
    for spec, count, ratio in zip(args.groups, counts, ratios):
        print(f"[pack_streams] {spec} free, together: {1e3 * wall / count:.2f} ms/update, {ratio:.3f} of alone",
              flush=True)
    print(f"[pack_streams] sum of together/alone: {sum(ratios):.3f} (1 = the groups took turns)", flush=True)
    (out / "pack_streams.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
