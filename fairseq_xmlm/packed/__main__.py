"""Train many Fake-English fairseq-train runs at once on one GPU, as stacked models (the Dufter recipe's --gpu-pack).

    python -m fairseq_xmlm.packed COMMANDS_FILE [--max-group 40] [--precision bf16|fp32] [--time-limit S]
        [--compile] [--cuda-graphs] [--gpu-lock PATH] [--warm-up-lock PATH] [--lockstep] [--tf32] [--summary PATH]

COMMANDS_FILE holds one fairseq-train command line per line (shell-quoted, `fairseq-train` or `python -m
fairseq_cli.train` first), each with `--save-dir` and `--log-file`. Every command is parsed and built by fairseq
(`runs`); runs with the same model shape, optimiser settings and schedule, and mostly of one seed (`plan.grouped`),
are trained together as one stacked model, up to --max-group runs at a time, one group after another or, with
--lockstep, all at once, each on a CUDA stream of its own (`loop.train_groups`). With --cuda-graphs each batch
shape's whole update is captured once and replayed; --gpu-lock makes the processes take turns on the GPU, which
such a group keeps busy by itself, and --warm-up-lock makes the processes of one model shape warm up (compile) one
after another (`locks`). `processes.train_side_by_side` runs a sweep's groups in such processes, several at once.

A group is saved when it finishes; rerunning the same commands skips runs whose checkpoint and log exist. SIGTERM,
Ctrl-C or --time-limit suspend the group at the next step: it saves its whole state and the process exits 75
(SUSPENDED), and rerunning the same commands resumes it to the result an uninterrupted run gives.
"""
import signal
import sys
import time

import torch

from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.io import write_json
from fairseq_xmlm.packed.group import check_cuda_graphs
from fairseq_xmlm.packed.locks import take_gpu, take_warm_up
from fairseq_xmlm.packed.loop import resume_path, train_groups
from fairseq_xmlm.packed.plan import grouped
from fairseq_xmlm.packed.runs import parse_runs, read_commands
from fairseq_xmlm.precision import allow_tf32

SUSPENDED = 75  # exit status of a process that saved its groups' state to resume (EX_TEMPFAIL)


def train_packed(commands, max_group=40, precision="bf16", device=None, stop=None, compile=False, cuda_graphs=False,
                 gpu_lock=None, lockstep=False, warm_up_lock=None):
    """Parse every command, group them, train each group; returns a summary per group, None for a group that
    `stop()` suspended (the groups after it do not start). With `lockstep` all groups train at once
    (`loop.train_groups`), else one after another. With `gpu_lock` (a path), groups train past their first epoch
    only while this process holds that lock (`locks.take_gpu`): processes whose groups keep the GPU busy (CUDA
    graphs) take turns, and the next one builds its runs and warms up (`train_groups`' take_turn) while the GPU is
    still busy with the last. With `warm_up_lock` (a path), the processes of one model shape warm up one at a time
    (`locks.take_warm_up`)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_cuda_graphs(cuda_graphs, device)  # before the runs are built
    stop = stop or (lambda: False)
    runs = parse_runs(commands)
    pending = [run for run in runs if not run.done()]
    for run in runs:
        if run.done():
            print(f"pack: {run.checkpoint_path} exists, skipped", file=sys.stderr)
    chunks = grouped(pending, max_group)
    labels = [f"pack group {number}/{len(chunks)} ({len(chunk)} runs, {chunk[0].cfg.model.encoder_layers} x "
              f"{chunk[0].cfg.model.encoder_embed_dim}d)" for number, chunk in enumerate(chunks, 1)]
    summary = []
    for team in ([list(range(len(chunks)))] if lockstep and chunks else [[i] for i in range(len(chunks))]):
        for i in team:
            print(f"{labels[i]}: building", file=sys.stderr, flush=True)
            for run in chunks[i]:
                run.build()
            print(f"{labels[i]}: training from {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
        label = " + ".join(labels[i] for i in team)
        facts = train_groups([chunks[i] for i in team], device, precision,
                             progress=[lambda text, label=labels[i]: print(f"{label} {text}", file=sys.stderr,
                                                                           flush=True) for i in team],
                             stop=stop, compile=compile, cuda_graphs=cuda_graphs,
                             take_turn=(lambda: take_gpu(gpu_lock, stop, label)) if gpu_lock else None,
                             take_warm_up=(lambda: take_warm_up(warm_up_lock, [chunks[i] for i in team], stop, label))
                             if warm_up_lock else None)
        for i in team:
            for run in chunks[i]:  # the next groups' models take the memory
                run.task = run.model = run.criterion = None
        if facts is None:
            for i in team:
                print(f"{labels[i]}: suspended, state in {resume_path(chunks[i])}; rerun to resume", file=sys.stderr,
                      flush=True)
            summary += [None] * len(team)
            break
        for i, group_facts in zip(team, facts):
            print(f"{labels[i]}: done in {group_facts['seconds']:.0f}s at {time.strftime('%H:%M:%S')}, "
                  f"{group_facts['updates'] * group_facts['runs'] / group_facts['seconds']:.0f} run-updates/s",
                  file=sys.stderr, flush=True)
        summary += facts
    return summary


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.packed", description=__doc__.split("\n")[0])
    parser.add_argument("commands", help="file with one fairseq-train command per line")
    parser.add_argument("--max-group", type=int, default=40, help="most runs stacked into one model")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--summary", help="write the per-group timings here (json)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the stacked layers and the optimizer step (worth it on a GPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay each batch shape's whole update as a CUDA graph (GPU only)")
    parser.add_argument("--gpu-lock", help="train a group past its first epoch only while holding this lock file "
                        "(a record lock): processes take turns on the GPU")
    parser.add_argument("--warm-up-lock", help="train a group's first epoch (compiling) only while holding this lock "
                        "file, one per model shape and GPU: processes of one shape compile one after another")
    parser.add_argument("--lockstep", action="store_true",
                        help="train all groups at once, one update of each a round (each on a CUDA stream of its own)")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="suspend after this many seconds (as on SIGTERM or Ctrl-C); 0: no limit")
    parser.add_argument("--tf32", action="store_true",
                        help="the validations' fp32 matrix products in TF32 on a GPU (the training's are bf16; with "
                             "--precision fp32, the training's too)")
    args = parser.parse_args(argv)
    if args.tf32:
        allow_tf32()
    if args.max_group < 1:
        raise XmlmError(f"--max-group must be at least 1, got {args.max_group}")
    started = time.perf_counter()
    signalled = []
    # SIGTERM or Ctrl-C: finish the step, save the state, exit SUSPENDED
    previous = {signum: signal.signal(signum, lambda *_: signalled.append(True))
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        summary = train_packed(read_commands(args.commands), args.max_group, args.precision, stop=lambda: bool(
            signalled or (args.time_limit and time.perf_counter() - started > args.time_limit)), compile=args.compile,
            cuda_graphs=args.cuda_graphs, gpu_lock=args.gpu_lock, lockstep=args.lockstep,
            warm_up_lock=args.warm_up_lock)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if summary and summary[-1] is None:
        sys.exit(SUSPENDED)
    total = time.perf_counter() - started
    print(f"pack: {sum(g['runs'] for g in summary)} runs in {len(summary)} groups, {total:.0f}s", file=sys.stderr)
    if args.summary:
        write_json(args.summary, {"groups": summary, "seconds": total})


if __name__ == "__main__":
    main()
