"""How long `xmlm-eval-mult` takes for one checkpoint (target: BERT-small, 10k dev sentences, <= 60 s on 2 CPU
cores). Not a test: prints the wall time of each step and the total.

    python benchmarks/eval_speed.py CHECKPOINT --data DATA_BIN [--threads 2] [xmlm-eval-mult options ...]
"""
import argparse
import sys
import time

import torch

from fairseq_xmlm.evaluation import eval_mult


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the target machine has 2 cores)")
    args, eval_argv = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    eval_mult.main(eval_argv)  # per-step times go to stderr
    print(f"eval-speed: {time.perf_counter() - started:.1f}s total with {args.threads} threads", file=sys.stderr)


if __name__ == "__main__":
    main()
