"""The one place that schedules processes: jobs (a command each, with what to run once it has succeeded) run side by
side on a machine's CPU cores and GPUs (`run_jobs`), and a sweep of fairseq-train commands trained as packed groups,
one `python -m fairseq_xmlm.packed` process per group or team of groups (`train_side_by_side`).

A BERT-small on the Bible keeps a GPU busy for a few percent of each step when trained alone; the rest is Python.
Several processes side by side fill the gaps: the GPU time-slices between them and each one's CPU work overlaps the
others' kernels. Slots beyond the CPU count only queue behind each other (`default_slots`). SIGTERM is passed on to
the running processes: a packed group then saves its state and the same command later resumes it.
"""
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import write_lines
from fairseq_xmlm.packed.plan import estimated_gpu_bytes, fills_gpu, grouped, lockstep_teams
from fairseq_xmlm.packed.runs import parse_runs


@dataclass
class Job:
    """One command to run in a process of its own (an argv list), and what its scheduling needs to know of it."""

    argv: list
    then: list = field(default_factory=list)  # commands to run as soon as it has succeeded (its evaluation)
    then_beside: list = field(default_factory=list)  # where not empty, `then` while other jobs remain to run
    cost: float = 0.0  # e.g. its estimated GPU memory, against run_jobs' capacity
    fills_gpu: bool = False  # keeps a GPU busy by itself


def default_slots(workers_per_run):
    """How many runs fit side by side: CPU cores / (1 main process + its data-loader workers), at least 1."""
    return max(1, (os.cpu_count() or 1) // (1 + workers_per_run))


def run_jobs(jobs, slots, log_dir, env=None, poll_s=0.2, capacity=None, devices=None, fills_per_gpu=1, stop=None,
             end_slots=None):
    """Run every job, at most `slots` at a time, each one's stdout and stderr to `log_dir/<index>.log`; returns the
    wall time per job (seconds), the follow-ups' after the jobs'.

    A job's `then` (commands) start as soon as it has succeeded: they go ahead of the queue and cost nothing. Its
    `then_beside`, where not empty, replaces `then` when, as the job ends, other jobs are still running or queued (an
    evaluation on the CPU, leaving the GPU to the training still going); these queue behind the jobs not yet
    started, which would otherwise wait out a wave of them (2026-11-28, one H200, commit ad7990f).
    `end_slots` (default `slots`): how many follow-ups run at a time once no job is left to run or start, when
    nothing else may need the cores or the GPU any more.

    With `capacity`, a job starts only while the costs of the running ones plus its own fit in it (a job alone always
    starts); jobs start in their order, a later one that fits going ahead of an earlier one that does not. At most
    `fills_per_gpu` jobs that fill a GPU share one: 1 where side by side they would only take turns; 2 where they
    take turns anyway (CUDA graphs under one lock) and only the next one's warm-up should go on beside the one
    training. With `devices` (GPU indices) each job sees one GPU (CUDA_VISIBLE_DEVICES), the least loaded one it
    fits on, and `capacity` holds per GPU; without, every job sees the GPUs of the environment.

    Raises XmlmError naming the logs of the jobs that exited non-zero, after all have ended. On SIGTERM it passes the
    signal on to the running ones (a packed group's process then saves its state to resume), waits for them, and
    raises XmlmError; so it does once `stop()` (optional) turns true, e.g. when run in a thread, where SIGTERM cannot
    be caught.
    """
    if slots < 1:
        raise XmlmError(f"--slots must be at least 1, got {slots}")
    os.makedirs(log_dir, exist_ok=True)
    jobs = list(jobs)
    given = len(jobs)  # the jobs after these are follow-ups
    pending = list(range(len(jobs)))
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
                placement = _place(pending, running, jobs, capacity, devices or [None], fills_per_gpu)
                if placement is None:
                    break
                index, device = placement
                pending.remove(index)
                log = open(os.path.join(log_dir, f"{index}.log"), "w")
                own_env = child_env if device is None else {**child_env, "CUDA_VISIBLE_DEVICES": str(device)}
                running[index] = (subprocess.Popen(jobs[index].argv, stdout=log, stderr=subprocess.STDOUT,
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
                job = jobs[index]
                if process.returncode != 0:
                    failed.append(index)
                elif job.then:
                    beside = job.then_beside and any(i < given for i in [*pending, *running])
                    follow = list(range(len(jobs), len(jobs) + len(job.then_beside if beside else job.then)))
                    jobs += [Job(argv) for argv in (job.then_beside if beside else job.then)]
                    if beside:  # behind the jobs yet to start
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
        raise XmlmError(f"{len(failed)} of {len(jobs)} packed runs failed; see {logs}")
    return [wall[i] for i in range(len(jobs))]


def _place(pending, running, jobs, capacity, devices, fills_per_gpu):
    """(the first pending job that fits somewhere, the least loaded device it fits on), or None."""
    load = {device: sum(jobs[i].cost for i, entry in running.items() if entry[3] == device) for device in devices}
    count = {device: sum(entry[3] == device for entry in running.values()) for device in devices}
    filling = {device: sum(entry[3] == device for i, entry in running.items() if jobs[i].fills_gpu)
               for device in devices}
    busy = {device for device in devices if count[device]}
    for index in pending:
        for device in sorted(devices, key=lambda d: (load[d], count[d])):
            if jobs[index].fills_gpu and filling[device] >= fills_per_gpu:
                continue
            if device not in busy or capacity is None or load[device] + jobs[index].cost <= capacity:
                return index, device
    return None


def several_gpus():
    """The names CUDA_VISIBLE_DEVICES gives the visible GPUs when there are several (for `run_jobs(devices=...)`,
    which shows each job one of them), else None: a CUDA_VISIBLE_DEVICES of this process's environment is kept to
    (its entries, not 0..N-1), so that a job never sees a GPU this process was not given. One GPU per job also
    keeps fairseq-train from starting data-parallel training over every GPU it sees."""
    import torch

    count = torch.cuda.device_count()
    if count < 2:
        return None
    given = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    return [name.strip() for name in given.split(",")][:count] if given else [str(index) for index in range(count)]


def train_side_by_side(jobs, workdir, max_group=40, precision="bf16", slots=0, compile=None, cuda_graphs=None,
                       lockstep=False, tf32=False):
    """Every group (see `plan.grouped`) of the jobs' fairseq-train commands in a `python -m fairseq_xmlm.packed`
    process, `slots` processes at a time on the GPU; each job's `then` (its evaluation) runs as soon as its group's
    process has ended, or its `then_beside` while other groups have yet to train (`run_jobs`), so a sweep cut short
    keeps every result it finished.

    A group takes at most 60 % of a GPU's memory budget (by `estimated_gpu_bytes`: three BERT-base runs on an 80 GB
    GPU); larger models start first; with several GPUs each process runs on one of them, the least loaded.
    `compile` (default: on a GPU) compiles the stacked layers and the optimizer step; `cuda_graphs` (default: on a
    GPU) replays each batch shape's whole update as a CUDA graph, and the processes then train one at a time per GPU
    (`locks.take_gpu`) while the others build their runs and train their first epoch (compiling; compiled, one
    process of a model shape at a time, `locks.take_warm_up`). With `lockstep` a group that fills the GPU shares its
    process with small ones, in lockstep (`plan.lockstep_teams`, `loop.train_groups`): its rounds are faster, but
    such a process compiles its groups one after another, and is larger, so fewer of them warm up beside the one
    training. Without graphs, groups train side by side, so one group's Python overlaps the others' kernels, and a
    group that fills a GPU (`fills_gpu`) never shares one with another such group; with graphs, at most two such
    processes share a GPU. `tf32`: the validations' matrix products in TF32 (the CLI's --tf32).
    Writes workdir/commands.<i>.txt, summary.<i>.json and logs/<i>.log; returns the wall time and the per-process
    summaries."""
    import torch

    os.makedirs(workdir, exist_ok=True)
    capacity = 0.9 * torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    compile = torch.cuda.is_available() if compile is None else compile
    cuda_graphs = torch.cuda.is_available() if cuda_graphs is None else cuda_graphs
    # with CUDA graphs a group keeps a GPU busy by itself (side by side, three groups made 0.91 of what they make
    # taking turns; 2026-11-27, one H200, commit 5e871b2): the groups train one at a time per GPU, under one lock
    locks = ["--gpu-lock", os.path.join(os.path.abspath(workdir), "gpu.lock")] if cuda_graphs else []
    # compiled, the processes of one model shape warm up one after another: the later ones find the layers in
    # inductor's cache (2026-11-27, one H200, commit adc7f25)
    locks += ["--warm-up-lock", os.path.join(os.path.abspath(workdir), "warm-up.lock")] if compile else []
    runs = parse_runs([job.argv for job in jobs])
    job_of = {id(run): job for run, job in zip(runs, jobs)}
    chunks = grouped(runs, max_group, capacity and 0.6 * capacity)
    # the longest groups (larger models, more runs) first, so none is left to run alone at the end
    chunks.sort(key=lambda chunk: (-chunk[0].cfg.model.encoder_embed_dim, -len(chunk)))
    teams = lockstep_teams(chunks) if lockstep else [[chunk] for chunk in chunks]
    processes, summaries = [], []
    for index, team in enumerate(teams):
        members = [job_of[id(run)] for chunk in team for run in chunk]
        listing = write_lines(os.path.join(workdir, f"commands.{index}.txt"), [shlex.join(job.argv) for job in members])
        summaries.append(os.path.join(workdir, f"summary.{index}.json"))
        argv = [sys.executable, "-m", "fairseq_xmlm.packed", str(listing), "--max-group", str(max_group),
                "--precision", precision, "--summary", summaries[-1]] + (["--compile"] if compile else []) \
            + (["--cuda-graphs"] if cuda_graphs else []) + locks + (["--lockstep"] if len(team) > 1 else []) \
            + (["--tf32"] if tf32 else [])
        processes.append(Job(argv, then=[c for job in members for c in job.then],
                             then_beside=[c for job in members for c in job.then_beside or job.then],
                             cost=sum(map(estimated_gpu_bytes, team)), fills_gpu=fills_gpu(team[0])))
    slots = slots or min(len(processes), max(1, (os.cpu_count() or 2) // 2))
    devices = several_gpus()  # each process on one of them, spread by memory
    logs = os.path.join(workdir, "logs")
    print(f"pack: {len(jobs)} runs in {len(processes)} groups, at most {slots} processes at a time and as many "
          f"as fit in GPU memory ({len(devices or [0])} GPUs); progress in {logs}/", file=sys.stderr, flush=True)
    started = time.perf_counter()
    # With graphs, two processes that fill a GPU: the one training and the next one warming up, which then waits
    # with its graphs captured. A third would only hold memory: at 100 epochs three teams of 3 BERT-base + 11
    # BERT-small held 43.24, 35.93 and 60.56 GiB and the third's warm-up ran an H200 out of memory, while the next
    # one's start and warm-up (about a minute) fit in the training of the one before (about 5 minutes; 2026-11-28,
    # one H200, commit 42a285d; two at most since 5f2dec0). At the end, the last evaluations all at once: all that
    # is left.
    run_jobs(processes, slots, logs, capacity=capacity, devices=devices, fills_per_gpu=2 if cuda_graphs else 1,
             end_slots=os.cpu_count())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "slots": slots,
            "processes": [json.loads(Path(path).read_text(encoding="utf-8")) for path in summaries]}
