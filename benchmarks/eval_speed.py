"""How long `xmlm-eval-mult` takes for one checkpoint (target: BERT-small, 10k dev sentences, <= 60 s on 2 CPU
cores). Not a test: prints the wall and CPU time of each step and of the whole run, and the machine's load average
before and after (the wall time only means something when nothing else ran: load well below the core count).

    python benchmarks/eval_speed.py CHECKPOINT --data DATA_BIN [--threads 2] [xmlm-eval-mult options ...]
"""
import argparse
import os
import sys

import torch

from fairseq_xmlm.evaluation import eval_mult


def load_text():
    return "load average (1/5/15 min) " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (the target machine has 2 cores)")
    args, eval_argv = parser.parse_known_args()
    torch.set_num_threads(args.threads)
    print(f"eval-speed: before: {load_text()}", file=sys.stderr)
    started = eval_mult.clock()
    eval_mult.main(eval_argv)  # per-step times go to stderr
    print(f"eval-speed: {eval_mult.took(started)} total with {args.threads} threads; after: {load_text()}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
