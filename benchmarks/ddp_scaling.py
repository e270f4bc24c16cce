"""How does training scale over the GPUs of one machine (fairseq's DDP over NCCL), and how fast do they all-reduce?

    python3 benchmarks/ddp_scaling.py --out DIR [--gpus 1,2,4] [--parts runs,allreduce] [--mb 25,164]

runs: the Conneau config (8 layers, 768, 12 heads, 3072 FFN, 256 tokens, batch 96 per GPU) on synthetic data on 1,
2, ... GPUs (--gpus): our variants (BENCH_MULTIGPU_KINDS; default our fastest, under xmlm-train; BENCH_BEFORE adds
an earlier tree's) and stock, each kind as often as named there, launched by fairseq's spawn or by torchrun
(BENCH_TORCHRUN="--numa-binding exclusive"); scaling efficiency = tokens/s(N) / (N x tokens/s(1)). Logs in
DIR/logs/, figures in DIR/summary.json, as `step_speed.py`'s.

allreduce: one process per GPU (the most of --gpus) all-reduces fp16 buffers of each size in --mb (MiB) over NCCL,
5 times to warm up, then 20 times timed; prints the time per all-reduce and NCCL's two bandwidth figures: algorithm
bandwidth (bytes / time) and bus bandwidth (algorithm bandwidth x 2 (N - 1) / N, what each link carries in a ring,
comparable across GPU counts). 25 MiB is fairseq's default DDP bucket; the Conneau config's whole fp16 gradient
(about 82M parameters with the 32k-vocabulary embedding) is about 156 MiB, so 164 MiB is a little more than it.
NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in both parts.
"""
import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from _common import (CONNEAU, PYTHON, SYNTH_DIR, XMLM_TRAIN, Bench, before_variants, ddp_arguments, entry_module,
                     log, ours_args, single_variants, stock_args, torchrun_launcher, updates_for, write_synthetic)

def ddp_variants(text):
    """BENCH_DDP_VARIANTS: ";"-separated sets of extra arguments for our multi-GPU runs, one run per set, e.g.
    "--ddp-backend legacy_ddp;" (legacy_ddp, then the default pytorch_ddp) -> [(suffix, argv), ...]; a run's name
    carries its arguments ("_4gpu+ddp-backend=legacy_ddp"), the default's nothing."""
    variants = []
    for chunk in text.split(";"):
        argv = chunk.split()
        suffix = "".join(f"+{a.lstrip('-')}" if a.startswith("--") else f"={a}" for a in argv)
        variants.append((suffix, argv))
    return variants


def multigpu_runs(names, gpus, variants):
    """The runs in order, as (kind, repeat, GPUs, label, extra arguments): each kind on each GPU count, our kinds on
    more than one GPU once per DDP variant. A kind named again (to alternate runs within one benchmark) is its
    repeat 2, 3, ..., labelled "_run2", "_run3", ...; its scaling is taken over its own 1-GPU run."""
    runs, seen = [], {}
    for kind in names:
        repeat = seen[kind] = seen.get(kind, 0) + 1
        for n in gpus:
            for suffix, extra in (variants if n > 1 and kind != "stock" else [("", [])]):
                label = f"{kind}_{n}gpu{suffix}" + (f"_run{repeat}" if repeat > 1 else "")
                runs.append((kind, repeat, n, label, extra))
    return runs


# our fastest kind against stock: 90.4-93.2 % scaling on 4 GPUs at 1.66-1.73x stock (2026-11-27, 4x H200, c863eb6)
MULTIGPU_KINDS = "fp16_flat_master_cudagraphs_cudnn" + XMLM_TRAIN + ",stock"


def time_runs(b, synth, gpus):
    """BENCH_MULTIGPU_KINDS (default `MULTIGPU_KINDS`), run in that order: "stock" and any of our
    `single_variants` (e.g. fp16_flat_master_cudagraphs_cudnn); with BENCH_BEFORE=DIR also "before_<variant>", the
    fairseq_xmlm package in DIR. A kind may be named more than once (`multigpu_runs`). Each of our kinds runs on more
    than one GPU once per set of BENCH_DDP_VARIANTS (`ddp_variants`; default one run with fairseq's default,
    pytorch_ddp). BENCH_TORCHRUN="OPTIONS" launches every run, one GPU included, with `torchrun OPTIONS`
    (`torchrun_launcher`), e.g. "--numa-binding exclusive"."""
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    torchrun = os.environ.get("BENCH_TORCHRUN")
    known = {"stock": stock_args(synth, CONNEAU) + ["--fp16"],
             **{name: ours_args(synth, CONNEAU) + extra
                for name, extra in {**single_variants(), **before_variants()}.items()}}
    names = os.environ.get("BENCH_MULTIGPU_KINDS", MULTIGPU_KINDS).split(",")
    if not set(names) <= set(known):
        raise SystemExit(f"ddp_scaling: BENCH_MULTIGPU_KINDS may hold {', '.join(known)}; got {names}")
    runs = multigpu_runs(names, gpus, ddp_variants(os.environ.get("BENCH_DDP_VARIANTS", "")))
    for kind, _, n, label, extra in runs:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, range(n))), NCCL_NVLS_ENABLE="0")
        argv = known[kind] + ddp_arguments(n) + extra
        launcher = torchrun_launcher(n, torchrun) if torchrun is not None else PYTHON
        b.train(f"multi_{label}", argv, updates_for(known[kind], u), 50, CONNEAU, env=env, gpus=n, launcher=launcher,
                module=entry_module(kind))
    one_gpu = {(kind, repeat): label for kind, repeat, n, label, _ in runs if n == 1}
    for kind, repeat, n, label, _ in runs:
        if n == 1 or (kind, repeat) not in one_gpu:  # --gpus without 1: no scaling
            continue
        key = f"scaling {label} (tokens/s over {n} x 1gpu)"
        b.ratio(key, f"multi_{label}", f"multi_{one_gpu[kind, repeat]}")
        if key in b.results.get("ratios", {}):  # absent when a run failed
            b.results["ratios"][key] /= n
            b.save()
    for kind, _, n, label, _ in runs:
        if kind != "stock":  # against stock's first run on as many GPUs
            b.ratio(f"{label} / stock {n}gpu", f"multi_{label}", f"multi_stock_{n}gpu")


def all_reduce(rank, world, sizes_mb, port):
    """One rank's timed all-reduces of each size (rank 0 prints)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), NCCL_NVLS_ENABLE="0")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank))
    for mb in sizes_mb:
        buffer = torch.ones(int(mb * 2**20) // 2, dtype=torch.float16, device="cuda")
        for _ in range(5):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(20):
            dist.all_reduce(buffer)
        torch.cuda.synchronize()
        seconds = (time.perf_counter() - started) / 20
        if rank == 0:
            algbw = buffer.numel() * 2 / seconds / 1e9
            print(f"[allreduce] {world} GPUs, {mb} MiB fp16: {seconds * 1e3:.2f} ms, algorithm bandwidth "
                  f"{algbw:.0f} GB/s, bus bandwidth {algbw * 2 * (world - 1) / world:.0f} GB/s", flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts for the runs; the all-reduce uses the most")
    parser.add_argument("--parts", default="runs", help="runs, allreduce, or both (comma-separated)")
    parser.add_argument("--mb", default="25,164", help="all-reduce buffer sizes in MiB, comma-separated")
    parser.add_argument("--port", type=int, default=29533, help="the all-reduce's rendezvous port")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    if max(gpus) > torch.cuda.device_count():
        raise SystemExit(f"ddp_scaling: --gpus {args.gpus}, but {torch.cuda.device_count()} GPUs are visible")
    parts = args.parts.split(",")
    if "allreduce" in parts:
        if max(gpus) < 2:
            raise SystemExit("ddp_scaling: the all-reduce needs 2 GPUs or more")
        mp.spawn(all_reduce, args=(max(gpus), [float(mb) for mb in args.mb.split(",")], args.port), nprocs=max(gpus))
    if "runs" in parts:
        b = Bench(args.out)
        log(f"card {b.results['card']} x {b.results['gpus']}, torch {torch.__version__}")
        time_runs(b, write_synthetic(SYNTH_DIR), gpus)
        print(json.dumps(b.results, indent=1))


if __name__ == "__main__":
    main()
