"""Pack many small training runs onto one GPU: N `fairseq-train` processes at a time, each run in its own process.

A BERT-small on the Bible keeps an H100 busy for a few percent of each step; the rest is Python (fairseq's
train loop, the data loader). Several processes side by side fill the gaps: the GPU time-slices between them and
each one's CPU work overlaps the others' kernels. A recipe builds its list of commands (argv lists) and calls
`run_packed(commands, slots, log_dir)`; the CLI does the same for a file of commands, one shell-quoted per line:

    python -m fairseq_xmlm.gpu_pack --slots 12 --log-dir logs/ commands.txt

Each run's stdout+stderr goes to `log_dir/<index>.log`; runs that fail are named in one error at the end (the
others still finish). Slots beyond the CPU count only queue behind each other, so `default_slots()` is the number
of cores divided by the CPU threads one run needs (its main process plus its data-loader workers). On a machine
with several GPUs `run_packed(devices=...)` gives each run one of them; `then=` starts a run's follow-ups (its
evaluation) as soon as it succeeds; SIGTERM is passed on to the running ones.
"""
import argparse
import os
import shlex
import signal
import subprocess
import sys
import threading
import time

from fairseq_xmlm.errors import XmlmError, cli_errors


def default_slots(workers_per_run):
    """How many runs fit side by side: CPU cores / (1 main process + its data-loader workers), at least 1."""
    return max(1, (os.cpu_count() or 1) // (1 + workers_per_run))


def run_packed(commands, slots, log_dir, env=None, poll_s=0.2, costs=None, capacity=None, devices=None, then=None,
               fills=None, fills_per_gpu=1, stop=None, then_beside=None, end_slots=None):
    """Run every argv list of `commands`, at most `slots` at a time; returns the wall time per run (seconds).

    `then[i]` (optional) lists commands to run as soon as command i has succeeded (an evaluation of what it
    trained): they go ahead of the queue, cost nothing, and their times follow the others' in the result.
    `then_beside[i]` (optional), where not empty, replaces `then[i]` when, as command i ends, others of `commands`
    are still running or queued: an evaluation on the CPU, leaving the GPU to the training still going. These queue
    behind the commands not yet started (docs/benchmarks.md, twenty-sixth session).

    `end_slots` (default `slots`): how many follow-ups run at a time once none of `commands` is left to run or
    start, when nothing else may need the cores or the GPU any more.

    With `costs` (one number per command, e.g. its estimated GPU memory) and `capacity`, a run starts only while
    the costs of the running ones plus its own fit in `capacity` (a run alone always starts); commands start in
    their order, a later one that fits going ahead of an earlier one that does not.
    With `fills` (one bool per command: the runs that keep a GPU busy on their own), at most `fills_per_gpu` of
    those share a GPU: 1 where side by side they would only take turns; 2 where they take turns anyway (CUDA
    graphs under one lock) and only the next one's warm-up should go on beside the one training.
    With `devices` (GPU indices) each run sees one GPU (CUDA_VISIBLE_DEVICES), the least loaded one it fits on, and
    `capacity` holds per GPU; without, every run sees the GPUs of the environment.
    Raises XmlmError naming the logs of the runs that exited non-zero, after all runs have ended. On SIGTERM it
    passes the signal on to the running ones (a packed_training process then saves its state to resume), waits
    for them, and raises XmlmError; so it does once `stop()` (optional) turns true, e.g. when run in a thread,
    where SIGTERM cannot be caught.
    """
    if slots < 1:
        raise XmlmError(f"--slots must be at least 1, got {slots}")
    os.makedirs(log_dir, exist_ok=True)
    commands = list(commands)
    costs = list(costs or [0] * len(commands))
    fills = list(fills or [False] * len(commands))
    then = then or [[]] * len(commands)
    then_beside = then_beside or [[]] * len(commands)
    given = len(commands)  # the commands after these are follow-ups
    pending = list(range(len(commands)))
    running = {}  # index -> (process, log file, start time, device)
    wall, failed = {}, []
    child_env = dict(os.environ if env is None else env)
    child_env.setdefault("OMP_NUM_THREADS", "1")  # N processes x all cores of intra-op threads would thrash
    terminated = []
    # only the main thread may set a handler; elsewhere SIGTERM keeps its default (the children are left running)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: terminated.append(True)) if in_main else None
    try:
        while (pending or running) and not terminated and not (stop and stop()):
            at_end = end_slots and not any(i < given for i in [*pending, *running])
            while pending and len(running) < (end_slots if at_end else slots):
                placement = _place(pending, running, costs, capacity, devices or [None], fills, fills_per_gpu)
                if placement is None:
                    break
                index, device = placement
                pending.remove(index)
                log = open(os.path.join(log_dir, f"{index}.log"), "w")
                own_env = child_env if device is None else {**child_env, "CUDA_VISIBLE_DEVICES": str(device)}
                running[index] = (subprocess.Popen(commands[index], stdout=log, stderr=subprocess.STDOUT,
                                                   env=own_env), log, time.perf_counter(), device)
                where = "" if device is None else f" on GPU {device}"
                print(f"gpu-pack: started run {index}{where} ({len(running)} running, {len(pending)} queued) "
                      f"at {time.strftime('%H:%M:%S')}", file=sys.stderr)
            for index, (process, log, started, _) in list(running.items()):
                if process.poll() is None:
                    continue
                log.close()
                wall[index] = time.perf_counter() - started
                del running[index]
                print(f"gpu-pack: run {index} ended (exit {process.returncode}) after {wall[index]:.0f}s at "
                      f"{time.strftime('%H:%M:%S')}", file=sys.stderr)
                if process.returncode != 0:
                    failed.append(index)
                elif index < len(then) and then[index]:
                    beside = then_beside[index] and any(i < given for i in [*pending, *running])
                    follow_ups = then_beside[index] if beside else then[index]
                    follow = list(range(len(commands), len(commands) + len(follow_ups)))
                    commands += follow_ups
                    costs += [0] * len(follow)
                    fills += [False] * len(follow)
                    if beside:  # behind the commands yet to start, which would otherwise wait out a wave of them
                        pending += follow
                    else:
                        pending[:0] = follow
            time.sleep(poll_s)
        stopped = bool(pending or running)  # the loop ended before them: SIGTERM or stop()
        for process, _, _, _ in running.values():  # only when stopped: pass SIGTERM on, let them save their state
            process.terminate()
        for process, log, _, _ in running.values():
            process.wait()
            log.close()
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    if stopped:
        raise XmlmError(f"stopped{' by SIGTERM' if terminated else ''}: {len(running)} runs were running, "
                        f"{len(pending)} had not started; rerun to go on (packed groups resume where they stopped)")
    if failed:
        logs = ", ".join(os.path.join(log_dir, f"{i}.log") for i in sorted(failed))
        raise XmlmError(f"{len(failed)} of {len(commands)} packed runs failed; see {logs}")
    return [wall[i] for i in range(len(commands))]


def several_gpus():
    """The indices of the visible GPUs when there are several (for `run_packed(devices=...)`), else None."""
    import torch

    count = torch.cuda.device_count()
    return list(range(count)) if count > 1 else None


def _place(pending, running, costs, capacity, devices, fills, fills_per_gpu):
    """(the first pending command that fits somewhere, the least loaded device it fits on), or None."""
    load = {device: sum(costs[i] for i, entry in running.items() if entry[3] == device) for device in devices}
    count = {device: sum(entry[3] == device for entry in running.values()) for device in devices}
    filling = {device: sum(entry[3] == device for i, entry in running.items() if fills[i]) for device in devices}
    busy = {device for device in devices if count[device]}
    for index in pending:
        for device in sorted(devices, key=lambda d: (load[d], count[d])):
            if fills[index] and filling[device] >= fills_per_gpu:
                continue
            if device not in busy or capacity is None or load[device] + costs[index] <= capacity:
                return index, device
    return None


def read_commands(path):
    """One shell-quoted command per non-empty line; lines starting with # are comments."""
    if not os.path.isfile(path):
        raise XmlmError(f"command file not found: {path}")
    with open(path, encoding="utf-8") as f:
        return [shlex.split(line) for line in f if line.strip() and not line.lstrip().startswith("#")]


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(description="Run many fairseq-train commands side by side on one GPU.")
    parser.add_argument("commands", help="file with one shell-quoted command per line")
    parser.add_argument("--slots", type=int, default=0, help="runs at a time (0: CPU cores / (1 + --workers))")
    parser.add_argument("--workers", type=int, default=1, help="data-loader workers each run uses (for --slots 0)")
    parser.add_argument("--log-dir", default="gpu-pack-logs", help="one log per run: <index>.log")
    args = parser.parse_args(argv)
    commands = read_commands(args.commands)
    slots = args.slots or default_slots(args.workers)
    started = time.perf_counter()
    run_packed(commands, slots, args.log_dir)
    print(f"gpu-pack: {len(commands)} runs in {time.perf_counter() - started:.0f}s with {slots} slots",
          file=sys.stderr)


if __name__ == "__main__":
    main()
