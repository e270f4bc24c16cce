"""Run many commands side by side on one machine's GPUs, each in its own process (`packed.processes.run_jobs`):

    python -m fairseq_xmlm.gpu_pack --slots 12 --log-dir logs/ commands.txt

One shell-quoted command per line of the file; each one's stdout and stderr go to `log_dir/<index>.log`; commands
that fail are named in one error at the end (the others still finish); SIGTERM is passed on to the running ones.
"""
import sys
import time

from fairseq_xmlm.errors import ArgumentParser, cli_errors
from fairseq_xmlm.packed.processes import Job, default_slots, run_jobs
from fairseq_xmlm.packed.runs import read_commands


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.gpu_pack",
                            description="Run many commands side by side on one GPU.")
    parser.add_argument("commands", help="file with one shell-quoted command per line")
    parser.add_argument("--slots", type=int, default=0, help="runs at a time (0: CPU cores / (1 + --workers))")
    parser.add_argument("--workers", type=int, default=1, help="data-loader workers each run uses (for --slots 0)")
    parser.add_argument("--log-dir", default="gpu-pack-logs", help="one log per run: <index>.log")
    args = parser.parse_args(argv)
    commands = read_commands(args.commands)
    slots = args.slots or default_slots(args.workers)
    started = time.perf_counter()
    run_jobs([Job(argv) for argv in commands], slots, args.log_dir)
    print(f"gpu-pack: {len(commands)} runs in {time.perf_counter() - started:.0f}s with {slots} slots",
          file=sys.stderr)


if __name__ == "__main__":
    main()
