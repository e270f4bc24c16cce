"""How fast the GPUs of this machine all-reduce a gradient-sized fp16 buffer over NCCL (what DDP does each update).

    python3 benchmarks/allreduce_speed.py [--gpus 4] [--mb 25,164]

One process per GPU; each size is all-reduced 5 times to warm up, then 20 times timed. Prints the time per
all-reduce and NCCL's two bandwidth figures: algorithm bandwidth (bytes / time) and bus bandwidth (algorithm
bandwidth x 2 (N - 1) / N, what each link carries in a ring, comparable across GPU counts). Sizes are in MiB:
25 MiB is fairseq's default DDP bucket; the Conneau config's whole fp16 gradient (about 82M parameters with the
32k-vocabulary embedding) is about 156 MiB, so 164 MiB is a little more than it.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def measure(rank, world, sizes_mb, port):
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
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--mb", default="25,164", help="buffer sizes in MiB, comma-separated")
    parser.add_argument("--port", type=int, default=29533)
    args = parser.parse_args()
    if args.gpus < 2 or args.gpus > torch.cuda.device_count():
        raise SystemExit(f"allreduce_speed: needs 2..{torch.cuda.device_count()} GPUs, asked for {args.gpus}")
    mp.spawn(measure, args=(args.gpus, [float(mb) for mb in args.mb.split(",")], args.port), nprocs=args.gpus)


if __name__ == "__main__":
    main()
