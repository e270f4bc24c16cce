"""Training packed groups to their end: each group's epochs, logs, validations beside it and checkpoints
(`GroupTraining`), several groups in lockstep on CUDA streams of their own (`train_groups`), turns on the GPU, and
suspending to and resuming from a group's saved state.

Each run's log gets fairseq's json records (`train` per epoch, `valid` from `validation.BackgroundValidation`,
written once done) and its `--save-dir` gets `checkpoint_last.pt`, saved by fairseq's Trainer, as fairseq-train
writes them. The optimiser state is not saved there: a packed checkpoint is a finished model, not a resume point.
A suspended group (`stop()`) saves its whole state to `resume_path` instead, and the next call with the same runs
goes on from there to the result an uninterrupted run gives.
"""
import json
import math
import os
import pickle
import shlex
import sys
import time
from contextlib import nullcontext

import numpy as np
import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import replace_atomically
from fairseq_xmlm.packed.group import PackedGroup
from fairseq_xmlm.packed.optim import learning_rate
from fairseq_xmlm.packed.runs import epoch_batches
from fairseq_xmlm.packed.validation import BackgroundValidation
from fairseq_xmlm.precision import fp32_products


def record_line(tag, record):
    """A log line in fairseq's json format, as `experiments.dufter.figures.read_fairseq_log` and people read them."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    values = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}
    return f"{stamp} | INFO | {tag} | {json.dumps(values)}\n"


def save_checkpoint(run, state_dict, epoch):
    """checkpoint_last.pt through fairseq's Trainer, so it reads like any fairseq-train checkpoint."""
    from fairseq.trainer import Trainer

    run.model.load_state_dict(state_dict)
    trainer = Trainer(run.cfg, run.task, run.model, run.criterion)
    trainer.set_num_updates(run.total_updates)
    trainer.consolidate_optimizer()  # fairseq-train does this before every save
    replace_atomically(run.checkpoint_path, lambda path: trainer.save_checkpoint(path, {
        "train_iterator": {"epoch": epoch, "iterations_in_epoch": 0, "shuffle": True}, "val_loss": None}))


def resume_path(runs):
    """Where a suspended group keeps its state: beside its first run's checkpoint."""
    return os.path.join(runs[0].cfg.checkpoint.save_dir, "packed_resume.pt")


def read_resume(runs):
    """The saved state of this very group (same commands, logs still there), or None."""
    path = resume_path(runs)
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:  # the group can start over
        print(f"pack: {path} is unreadable ({type(err).__name__}): starting afresh", file=sys.stderr)
        return None
    if not isinstance(state, dict) or state.get("commands") != [run.argv for run in runs] or not all(
            os.path.exists(run.log_path + ".partial") for run in runs):
        print(f"pack: {path} belongs to another group or lost its logs: starting afresh", file=sys.stderr)
        return None
    return state


def train_group(runs, device, precision="bf16", progress=None, stop=None, compile=False, cuda_graphs=False,
                take_turn=None, take_warm_up=None):
    """`train_groups` of one group: its timing facts, or None when suspended."""
    facts = train_groups([runs], device, precision, [progress], stop, compile, cuda_graphs, take_turn, take_warm_up)
    return None if facts is None else facts[0]


def train_groups(chunks, device, precision="bf16", progress=None, stop=None, compile=False, cuda_graphs=False,
                 take_turn=None, take_warm_up=None):
    """Train each chunk of runs (one group_key each) as a group, all groups in lockstep: one update of each a round,
    each group on a CUDA stream of its own, so that one group's kernels fill the GPU where another's leave it idle
    (a BERT-base group and a BERT-small group took 52.24 ms a round against 54.32 ms one after the other, with the
    no-parallel group too 66.90 against 72.39 ms; 2026-11-27, one H100, commit 57efe4a). A group whose
    updates end first leaves the round. Writes each run's log and checkpoint. Returns each group's timing facts, or
    None when `stop()` turned true before the end: every group then saved its state (`resume_path`) and the next
    call with the same chunks goes on from there, with the same result as an uninterrupted run. On a GPU a group's
    result does not depend on the groups beside it: each has its own random streams and captures its graphs on its
    own stream (`tests/gpu/test_lockstep_equal.py`). `progress`: one function (or None) per chunk, given a line per
    epoch.

    With `take_turn` (a function returning a held lock to close at the end, or None when stopped while waiting,
    see `locks.take_gpu`), the groups train their first epoch (compiling, capturing their CUDA graphs) beside whichever
    process holds the GPU, then wait for their turn: warm-ups no longer stand between one process's training and
    the next's. With `take_warm_up` (the same kind of function) that first epoch waits for a lock of its own,
    released when the epoch ends: processes of one model shape then compile one after another, and each after the
    first finds the compiled layers in inductor's cache instead of compiling them beside the others on the same CPU
    cores (a BERT-base group's first epoch took about 99 s cold, the next one's 43 s from the cache; 2026-11-27, one
    H200, commit adc7f25).

    Logs grow as `<log>.partial` and are renamed once the run's checkpoint is saved; a failure removes those of the
    groups that did not finish.
    """
    runs = [run for chunk in chunks for run in chunk]
    for run in runs:
        os.makedirs(os.path.dirname(os.path.abspath(run.log_path)), exist_ok=True)
    streams = device.type == "cuda" and len(chunks) > 1
    members, turn, warming = [], [], []  # take_turn's lock, once given; take_warm_up's, while held
    validations = BackgroundValidation(device)
    try:
        for chunk, report in zip(chunks, progress or [None] * len(chunks), strict=True):
            members.append(GroupTraining(chunk, device, precision, compile, cuda_graphs, report, streams,
                                         validations))
        facts = _train_groups(members, stop or (lambda: False), take_turn, turn, take_warm_up, warming)
    except BaseException:
        for member in members:
            member.discard_logs()
        raise
    finally:
        validations.close()
        for lock in turn + warming:
            lock.close()
    for member in members:
        if not member.finished:
            member.close_logs()
    return facts


def _train_groups(members, stop, take_turn, turn, take_warm_up, warming):
    if take_warm_up is not None:
        warming += [lock for lock in [take_warm_up()] if lock]
    seconds_before = max(member.seconds_before for member in members)
    started = time.perf_counter() - seconds_before
    warm_rounds = max(member.per_epoch for member in members)  # from here on, the groups train in their turn
    rounds = 0
    refused = take_warm_up is not None and not warming  # stopped while waiting to warm up
    while any(not member.finished for member in members):
        if rounds == warm_rounds:
            release_warm_up_memory(members[0])
        if warming and rounds >= warm_rounds:  # compiled: the next process of this shape may warm up
            warming.pop().close()
        due = take_turn is not None and not turn and rounds >= warm_rounds
        if due:
            waiting_since = time.perf_counter()
            turn += [lock for lock in [take_turn()] if lock]
            started += time.perf_counter() - waiting_since  # waiting is not training time
        if stop() or refused or (due and not turn):  # stopped, maybe while waiting to warm up or for the turn
            for member in members:
                member.suspend(time.perf_counter() - started)
            return None
        for member in members:
            if not member.finished:
                member.update(started)
        rounds += 1
    return [member.facts for member in members]


def release_warm_up_memory(member):
    """After the warm-up (the first epoch: compiling, each batch shape's first update run as is, then captured), give
    the memory those first updates left cached back to the GPU, before the next process warms up beside this one:
    a CUDA graph keeps what it needs in its own pool. Reports the process's peak and what it keeps."""
    device = member.group.device
    if device.type != "cuda":
        return
    peak = torch.cuda.max_memory_reserved(device)
    torch.cuda.empty_cache()
    if member.progress is not None:
        member.progress(f"warmed up: GPU memory {peak / 2 ** 30:.1f} GiB at most, "
                        f"{torch.cuda.memory_reserved(device) / 2 ** 30:.1f} GiB kept")


class GroupTraining:
    """One group's training: its PackedGroup, its runs' logs, and where it is (epoch, step in it, loss sums),
    resumed from its saved state if there is one. Everything it does runs on its own CUDA stream, if given one."""

    def __init__(self, runs, device, precision, compile, cuda_graphs, progress, stream, validations):
        self.runs, self.progress = runs, progress
        self.validations, self.validating = validations, []  # its BackgroundValidation; (log, future) in order
        self.stream = torch.cuda.Stream(device) if stream else None
        self.total, self.per_epoch = runs[0].total_updates, runs[0].updates_per_epoch
        if any((run.total_updates, run.updates_per_epoch) != (self.total, self.per_epoch) for run in runs):
            raise XmlmError("runs packed together must have the same number of updates per epoch and in all")
        self.group = PackedGroup(runs, device, precision, compile, cuda_graphs)
        self.group.before_capture = validations.wait
        self.resume = read_resume(runs)
        self.logs = [open(run.log_path + ".partial", "a" if self.resume else "w") for run in runs]
        zeros = torch.zeros(len(runs), device=device)
        # the epoch in progress (its batches, the next step) and the loss sums of its steps so far
        self.epoch, self.step, self.schedules, self.loss_sum, self.target_count = 0, 0, None, zeros, zeros.clone()
        self.tokens_seen, self.seconds_before, self.facts = 0, 0.0, None
        if self.resume:
            self.group.load_state_dict(self.resume["group"])
            self.epoch, self.step = self.resume["epoch"], self.resume["step"]
            self.schedules = [epoch_batches(run, self.epoch) for run in runs]
            self.loss_sum, self.target_count = self.resume["loss_sum"].to(device), self.resume["target_count"].to(
                device)
            self.tokens_seen, self.seconds_before = self.resume["tokens"], self.resume["seconds"]
            print(f"pack: resuming at update {self.group.updates} (epoch {self.epoch})", file=sys.stderr, flush=True)
        else:
            for run, log in zip(runs, self.logs):
                log.write(record_line("packed", {"command": shlex.join(run.argv), "runs_in_group": len(runs),
                                                 "validation_products": fp32_products(device)}))
        if self.stream is not None:  # after the weights and state set on the default stream
            self.stream.wait_stream(torch.cuda.current_stream(device))

    @property
    def finished(self):
        return self.facts is not None

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def update(self, started):
        """One update; at the end of an epoch its `train` records; after the last, validation and checkpoints."""
        with self.on_stream():
            group, runs = self.group, self.runs
            if self.schedules is None:
                self.epoch += 1
                self.schedules = [epoch_batches(run, self.epoch) for run in runs]
                self.loss_sum.zero_()
                self.target_count.zero_()
            losses, counts, batch = group.step([schedule[self.step] for schedule in self.schedules])
            self.tokens_seen += batch[-1]
            self.loss_sum += losses
            self.target_count += counts
            self.step += 1
            self._validate(group.validations_due())
            if self.step == self.per_epoch or group.updates == self.total:
                self._end_epoch(time.perf_counter() - started)
            if group.updates == self.total:
                self._finish(time.perf_counter() - started)

    def _validate(self, slots):
        for slot in slots:
            future = self.validations.submit(self.runs[slot], self.group.stacked.state_dict(slot), self.epoch,
                                             self.group.updates)
            self.validating.append((self.logs[slot], future))

    def _write_validations(self, wait=False):
        """The `valid` records of the validations that have ended (with `wait`: of all), in the order they began:
        each after the train records of the epochs that passed meanwhile."""
        while self.validating and (wait or self.validating[0][1].done()):
            log, future = self.validating.pop(0)
            log.write(record_line("valid", future.result()))
            log.flush()

    def _end_epoch(self, elapsed):
        group = self.group
        mean_loss = (self.loss_sum / self.target_count.clamp(min=1) / math.log(2)).tolist()  # base 2, as fairseq
        next_lr = learning_rate(group.updates + 1, group.schedule, group.peak_lr)
        for log, loss in zip(self.logs, mean_loss):
            log.write(record_line("train", {"epoch": self.epoch, "train_loss": loss, "train_ppl": 2 ** loss,
                                            "train_lr": next_lr, "train_num_updates": group.updates,
                                            "train_wall": elapsed}))
            log.flush()
        self._write_validations()
        if self.progress:
            clock = time.strftime("%H:%M:%S")  # so that a sweep's processes can be laid side by side afterwards
            self.progress(f"epoch {self.epoch} update {group.updates}/{self.total} at {clock}: "
                          f"{group.updates / elapsed:.1f} updates/s, "
                          f"{group.updates * len(self.runs) / elapsed:.0f} run-updates/s, "
                          f"mean loss {np.mean(mean_loss):.2f}")
        self.schedules, self.step = None, 0

    def _finish(self, seconds):
        group = self.group
        self._validate(group.validations_due(final=True))
        self._write_validations(wait=True)  # and the runs' models are free to save
        for slot, (run, log) in enumerate(zip(self.runs, self.logs)):
            save_checkpoint(run, group.stacked.state_dict(slot), self.epoch)
            log.write(record_line("packed", {"updates": group.updates, "seconds": seconds,
                                             "tokens_per_s": self.tokens_seen / seconds}))
        for run, log in zip(self.runs, self.logs):
            log.close()
            os.replace(run.log_path + ".partial", run.log_path)
        if self.resume:
            os.remove(resume_path(self.runs))
        self.facts = {"runs": len(self.runs), "updates": group.updates, "seconds": seconds,
                      "tokens": self.tokens_seen}
        if group.graphs is not None:
            self.facts.update(cuda_graphs=len(group.graphs), capture_seconds=round(group.capture_seconds, 1))

    def suspend(self, seconds):
        """Save where the group is (`resume_path`), to go on from there in a later process."""
        if self.finished:
            return
        self._write_validations(wait=True)
        with self.on_stream():
            between = self.schedules is None  # the next update starts the next epoch
            state = {"commands": [run.argv for run in self.runs], "group": self.group.state_dict(),
                     "epoch": self.epoch + between, "step": self.step,
                     "loss_sum": self.loss_sum * (not between), "target_count": self.target_count * (not between),
                     "tokens": self.tokens_seen, "seconds": seconds}
            replace_atomically(resume_path(self.runs), lambda path: torch.save(state, path))
        for log in self.logs:
            log.flush()

    def close_logs(self):
        """A suspended group's logs stay `.partial`, to go on in the next process."""
        for log in self.logs:
            log.close()

    def discard_logs(self):
        """After a failure: the logs of a group that did not finish go."""
        if self.finished:
            return
        for run, log in zip(self.runs, self.logs):
            log.close()
            os.remove(run.log_path + ".partial")
