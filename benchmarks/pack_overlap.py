"""How much packed groups gain from sharing one GPU: each group alone, then all of them at once.

    python3 benchmarks/pack_overlap.py --groups 15,16,17 0,1,2,3,4,5,6,7,8,9,30 21,21b:5 --seconds 20 \
        --out OUT/overlap [--mps] [--cuda-graphs]

Each group is a list of run IDs of `examples/dufter/run.py full` (":S" stacks S seeds, default 1; "@F" from the
recipe's F-th seed, default 0), built, compiled and warmed up in a process of its own, as `--gpu-pack` runs its
groups (`packed_training.PackedGroup`, compiled, bf16, real batches of epoch 1 in fairseq's order; with --cuda-graphs
each batch shape's update replayed as a CUDA graph, as `--gpu-pack` does). Then the parent has the groups train
for --seconds: each alone, then all at the same time. It prints every group's run-updates/s in both phases and
their ratio, and the sum of the ratios: 1 means that the groups merely took turns on the GPU, more means that one
group's work filled another's gaps (a host-bound group's idle GPU, a small group's idle SMs).

With --mps the groups' processes are clients of a CUDA MPS server that this script starts (with its own pipe and log
folders under --out, so no other process on the machine connects to it) and stops: their kernels can then run at the
same time, where without it the GPU switches between processes. Not a test.
"""
import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def build_group(spec, args, cuda_graphs):
    """A group "IDS[:SEEDS][@FIRST]" of the recipe's runs (SEEDS of its seeds from the FIRST-th, default 1 and 0) ->
    (the PackedGroup as `--gpu-pack` builds it, compiled on a GPU; its runs' batches of epoch 1). Runs are saved
    under args.out/runs/GROUP; args.data and args.knn_table as the recipe's."""
    sys.path.insert(0, str(HERE))
    import pack_speed
    from fairseq_xmlm import packed_training

    spec_seeds, _, first = spec.partition("@")
    ids, _, seeds = spec_seeds.partition(":")
    commands = pack_speed.recipe_commands(ids.split(","), int(seeds or 1), Path(args.data),
                                          Path(args.out) / "runs" / spec.replace(",", "-"), 10 ** 6, args.knn_table,
                                          first_seed=int(first or 0))
    runs = [packed_training.parse_run(c).build() for c in commands]
    schedules = [packed_training.epoch_batches(run, 1) for run in runs]
    cuda = torch.cuda.is_available()  # the CPU only to try a script out: eager, and slow
    group = packed_training.PackedGroup(runs, torch.device("cuda" if cuda else "cpu"), compile=cuda,
                                        cuda_graphs=cuda_graphs)
    return group, schedules


def child(spec, args):
    """One group: build, warm up, print `ready`; then on `go SECONDS` train that long and print the result."""
    import pack_profile

    group, schedules = build_group(spec, args, args.cuda_graphs)
    cuda = group.device.type == "cuda"
    synchronise = torch.cuda.synchronize if cuda else (lambda: None)
    step = pack_profile.cycling_steps(group, schedules)
    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    synchronise()
    device = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"ready {len(group.runs)} {time.perf_counter() - started:.1f} {device}", flush=True)
    for line in sys.stdin:
        if not line.startswith("go"):
            break
        seconds, count = float(line.split()[1]), 0
        synchronise()
        started = time.perf_counter()
        while time.perf_counter() - started < seconds:
            step()
            count += 1
        synchronise()
        wall = time.perf_counter() - started
        print(f"done {count * len(group.runs) / wall:.2f} {1e3 * wall / count:.2f}", flush=True)


def start_mps(out):
    """An MPS control daemon of our own (private pipe and log folders), for this script's processes only."""
    env = dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(out / "mps_pipe"), CUDA_MPS_LOG_DIRECTORY=str(out / "mps_log"))
    for folder in ("mps_pipe", "mps_log"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    subprocess.run(["nvidia-cuda-mps-control", "-d"], env=env, check=True)
    return env


def stop_mps(env):
    subprocess.run(["nvidia-cuda-mps-control"], input=b"quit\n", env=env, check=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", nargs="+", default=["15,16,17", "0,1,2,3,4,5,6,7,8,9,30", "21,21b:5"])
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--warmup", type=int, default=80, help="steps before timing (an epoch is 69 batches)")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of each timed phase")
    parser.add_argument("--mps", action="store_true", help="run the groups as clients of an MPS server")
    parser.add_argument("--cuda-graphs", action="store_true", help="replay each group's updates as CUDA graphs")
    parser.add_argument("--out", required=True)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child, args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = start_mps(out) if args.mps else dict(os.environ)
    children = []
    try:
        for number, spec in enumerate(args.groups):
            command = [sys.executable, __file__, "--child", spec] + sum(
                ([f"--{k.replace('_', '-')}", str(v)] for k, v in vars(args).items()
                 if k in ("data", "knn_table", "warmup", "out")), []) + (["--cuda-graphs"] if args.cuda_graphs else [])
            children.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                             stderr=open(out / f"group{number}.log", "w"), env=env))
        sizes = {}
        for spec, process in zip(args.groups, children):
            ready = process.stdout.readline().split()
            if not ready or ready[0] != "ready":
                raise SystemExit(f"pack_overlap: group {spec} failed to start; see {out}/group*.log")
            sizes[spec], device = int(ready[1]), " ".join(ready[3:])
            print(f"[pack_overlap] group {spec}: {ready[1]} runs, warm-up {ready[2]} s", flush=True)

        process_of = dict(zip(args.groups, children))

        def phase(members):
            for spec in members:
                process_of[spec].stdin.write(f"go {args.seconds}\n")
                process_of[spec].stdin.flush()
            return {spec: [float(x) for x in process_of[spec].stdout.readline().split()[1:]] for spec in members}

        alone = {}
        for spec in args.groups:
            alone.update(phase([spec]))
        together = phase(args.groups)
    finally:
        for process in children:
            if process.stdin:
                process.stdin.close()
            process.wait(timeout=120)
        if args.mps:
            stop_mps(env)
    rows = []
    for spec in args.groups:
        ratio = together[spec][0] / alone[spec][0]
        rows.append({"group": spec, "runs": sizes[spec], "alone_run_updates_per_s": alone[spec][0],
                     "alone_ms_per_step": alone[spec][1], "together_run_updates_per_s": together[spec][0],
                     "together_ms_per_step": together[spec][1], "together_over_alone": round(ratio, 3)})
        print(f"[pack_overlap] {spec} ({sizes[spec]} runs): alone {alone[spec][0]:.1f} run-updates/s "
              f"({alone[spec][1]:.2f} ms/step), together {together[spec][0]:.1f} ({together[spec][1]:.2f} ms/step): "
              f"{ratio:.3f}", flush=True)
    total = sum(row["together_over_alone"] for row in rows)
    print(f"[pack_overlap] sum of together/alone{' under MPS' if args.mps else ''}: {total:.3f} "
          f"(1 = the groups took turns)", flush=True)
    (out / "pack_overlap.json").write_text(json.dumps(
        {"device": device, "mps": args.mps, "cuda_graphs": args.cuda_graphs, "seconds": args.seconds, "rows": rows,
         "sum": total,
         "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
