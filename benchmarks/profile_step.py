"""Where one fairseq training step spends its time on the GPU: wall per update against kernel time per update.

    python3 benchmarks/profile_step.py --out DIR/prof [--runs conneau_stock,conneau_ours,...] [--gpus 4]
        [--train-args="--ddp-backend legacy_ddp"]

Each run is `fairseq_cli.train` (in a child process) with step_speed.py's arguments for that run, on its
synthetic data; updates `--skip`+1 ... `--skip`+`--steps` run under torch.profiler. Prints the synchronised wall
per update, the summed kernel time per update by kind of kernel (matrix products, attention, layer norm, ...), and
the rest (the GPU waiting on the host); writes DIR/<run>.json with those figures and the top kernels,
DIR/<run>.txt with the profiler's operator tables (by GPU time, then by host time) and DIR/<run>.log with fairseq's
output; with `--trace`, also DIR/<run>.trace.json.gz, the profiled updates' timeline (chrome://tracing, Perfetto).

With `--gpus N` (N > 1) the run is fairseq's DDP over N GPUs, one process per GPU started by torchrun; every rank
profiles itself (DIR/<run>_<N>gpu_rank<r>.json), rank 0 prints. The all-reduce kernels run on NCCL's own stream
beside the backward's: the report gives their time and the part of it no compute kernel overlaps, which is what
the extra GPUs add to an update.
"""
import argparse
import gzip
import json
import os
import shutil
import sys
import time

import torch

import _common
from _kernels import idle_by_phase, kernel_kind, kernel_times, stream_times

class StepProfiler:
    """Wraps Trainer.train_step: profiles `steps` updates after `skip`, then writes the report."""

    def __init__(self, out, name, skip, steps, rank=0, trace=False):
        self.out, self.name, self.skip, self.steps, self.rank, self.trace = out, name, skip, steps, rank, trace
        self.calls = 0
        self.profiler = None

    def wrap(self, train_step):
        def profiled(trainer, *args, **kwargs):
            if self.calls == self.skip:
                torch.cuda.synchronize()
                self.profiler = torch.profiler.profile(
                    activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])
                self.profiler.__enter__()
                self.started = time.perf_counter()
            result = train_step(trainer, *args, **kwargs)
            self.calls += 1
            if self.calls == self.skip + self.steps:
                torch.cuda.synchronize()
                wall = time.perf_counter() - self.started
                self.profiler.__exit__(None, None, None)
                self.report(wall)
            return result

        return profiled

    def report(self, wall):
        events = self.profiler.events()
        per_update = {name: us / 1e3 / self.steps for name, us in kernel_times(events).items()}
        kinds = {}
        for name, ms in per_update.items():
            kinds[kernel_kind(name)] = kinds.get(kernel_kind(name), 0.0) + ms
        step_ms = 1e3 * wall / self.steps
        busy_ms, nccl_ms, exposed_ms = (us / 1e3 / self.steps for us in stream_times(events))
        idle = {phase: us / 1e3 / self.steps for phase, us in idle_by_phase(events).items()}
        summary = {
            "name": self.name, "card": torch.cuda.get_device_name(0), "steps": self.steps,
            "wall_ms_per_update": round(step_ms, 2), "compute_kernel_ms_per_update": round(busy_ms, 2),
            "gpu_waiting_ms_per_update": round(step_ms - busy_ms, 2),
            "all_reduce_ms_per_update": round(nccl_ms, 2),
            "all_reduce_not_overlapped_ms_per_update": round(exposed_ms, 2),
            "kernel_ms_per_update_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
            "gpu_idle_ms_per_update_by_host_phase": {k: round(v, 3) for k, v in
                                                     sorted(idle.items(), key=lambda kv: -kv[1])},
            "top_kernels_ms_per_update": {k: round(v, 3) for k, v in
                                          sorted(per_update.items(), key=lambda kv: -kv[1])[:30]},
            "argv": sys.argv[1:],
        }
        os.makedirs(self.out, exist_ok=True)
        with open(os.path.join(self.out, f"{self.name}.json"), "w") as f:
            json.dump(summary, f, indent=1)
        # GPU work first; then the host's, where data loading and fairseq's own annotations show
        averages = self.profiler.key_averages()
        with open(os.path.join(self.out, f"{self.name}.txt"), "w") as f:
            f.write(averages.table(sort_by="self_cuda_time_total", row_limit=60))
            f.write("\n" + averages.table(sort_by="cpu_time_total", row_limit=60))
        if self.trace:
            trace_path = os.path.join(self.out, f"{self.name}.trace.json")
            self.profiler.export_chrome_trace(trace_path)
            with open(trace_path, "rb") as raw, gzip.open(trace_path + ".gz", "wb") as packed:
                shutil.copyfileobj(raw, packed)
            os.remove(trace_path)
        if self.rank:
            return
        print(f"[profile] {self.name}: {step_ms:.2f} ms/update wall (profiled), {busy_ms:.2f} ms of compute kernels, "
              f"{step_ms - busy_ms:.2f} ms without", flush=True)
        if nccl_ms:
            print(f"[profile]   all-reduce kernels {nccl_ms:.2f} ms/update, {exposed_ms:.2f} ms of it beside no "
                  f"compute kernel", flush=True)
        for kind, ms in summary["kernel_ms_per_update_by_kind"].items():
            print(f"[profile]   {ms:7.2f} ms  {kind}", flush=True)
        for phase, ms in summary["gpu_idle_ms_per_update_by_host_phase"].items():
            print(f"[profile]   {ms:7.2f} ms  GPU idle while the host is in {phase}", flush=True)


def run_arguments(name):
    """fairseq-train arguments of a named run, as step_speed.py builds them."""
    g, synth = _common, _common.SYNTH_DIR
    ours = g.ours_args(synth, g.CONNEAU)
    runs = {
        "conneau_stock": g.stock_args(synth, g.CONNEAU) + ["--fp16"],
        "conneau_ours": ours + g.FAST,
        "conneau_ours_compile": ours + g.FAST + ["--compile"],
        "conneau_ours_cudagraphs": ours + g.FAST + ["--compile", "--compile-mode", "reduce-overhead"],
    }
    # conneau_ours_flat_master, ..._cudnn, ..._compile, ..._cudagraphs, ..._cudagraphs_cudnn
    runs.update({f"conneau_ours_{variant[len('fp16_'):]}": ours + extra
                 for variant, extra in g.single_variants().items() if variant.startswith("fp16_flat_master")})
    # conneau_ours_bf16_params_cudagraphs_cudnn_xmlm_train: xmlm-train's update without host reads
    runs.update({f"conneau_ours_{variant}": ours + extra
                 for variant, extra in g.single_variants().items() if variant.startswith("bf16_params")})
    if name not in runs:
        raise SystemExit(f"profile_step: unknown run {name!r}; known: {', '.join(runs)}")
    return runs[name]


def profile_one(args):
    """One rank's fairseq-train (torchrun sets WORLD_SIZE and RANK for a multi-GPU run; fairseq reads them)."""
    from fairseq import trainer
    from fairseq_cli import train

    world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
    name = args.one if world == 1 else f"{args.one}_{world}gpu_rank{rank}"
    profiler = StepProfiler(args.out, name, args.skip, args.steps, rank, args.trace)
    if _common.entry_module(args.one) == "fairseq_xmlm.train":  # xmlm-train: its trainer has a train_step of its own
        from fairseq_xmlm import train as xmlm_train
        owner, entry = xmlm_train.XmlmTrainer, xmlm_train.cli_main
    else:
        owner, entry = trainer.Trainer, train.cli_main
    owner.train_step = profiler.wrap(owner.train_step)
    sys.argv = ["fairseq-train", *run_arguments(args.one), *_common.ddp_arguments(world), *args.train_args.split(),
                "--max-update", str(args.skip + args.steps), "--no-save", "--disable-validation", "--seed", "1"]
    entry()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", default="conneau_stock,conneau_ours,conneau_ours_compile")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: profile this run
    parser.add_argument("--skip", type=int, default=60, help="updates before profiling (warm-up, compilation)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--trace", action="store_true", help="also write each profile's timeline (.trace.json.gz)")
    parser.add_argument("--gpus", type=int, default=1, help="fairseq DDP over this many GPUs (torchrun)")
    parser.add_argument("--train-args", default="", help="more fairseq-train arguments for every run, after the "
                        "run's own (write --train-args=\"--ddp-backend legacy_ddp\", with the =)")
    args = parser.parse_args()
    if args.one:
        return profile_one(args)
    for name in args.runs.split(","):
        run_arguments(name)  # unknown names fail before anything runs
    os.makedirs(args.out, exist_ok=True)
    _common.write_synthetic(_common.SYNTH_DIR)  # before torchrun's ranks start reading it
    launcher = _common.PYTHON if args.gpus == 1 else _common.torchrun_launcher(args.gpus, "")
    # NVLink multicast off (NCCL_NVLS_ENABLE=0), as every multi-GPU benchmark here ran; fairseq-train takes every
    # visible GPU, so show it --gpus
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", CUDA_VISIBLE_DEVICES=",".join(map(str, range(args.gpus))))
    for name in args.runs.split(","):
        child = [*launcher, __file__, "--out", args.out, "--one", name, "--skip", str(args.skip), "--steps",
                 str(args.steps), f"--train-args={args.train_args}", *(["--trace"] if args.trace else [])]
        log_path = os.path.join(args.out, f"{name}.log" if args.gpus == 1 else f"{name}_{args.gpus}gpu.log")
        with open(log_path, "w") as log:
            rc = _common.run_child(child, log, env)
        with open(log_path, encoding="utf-8", errors="replace") as log:
            print("".join(line for line in log if line.startswith("[profile]")), end="", flush=True)
        if rc:
            print(f"[profile] {name}: fairseq-train exited with {rc}; see {log_path}", flush=True)


if __name__ == "__main__":
    main()
