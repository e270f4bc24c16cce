"""Turns among processes, as lock files: the GPU's (`take_gpu`: processes whose groups keep the GPU busy by
themselves train one at a time) and the warm-up's (`take_warm_up`: processes of one model shape compile one after
another, the later ones finding the layers in inductor's cache). Each is a POSIX record lock per set of visible
GPUs, waited for while `stop()` is false.
"""
import errno
import fcntl
import os
import sys
import time


def take_gpu(lock_path, stop, label):
    """Wait until this process holds `lock_path` (one file per set of visible GPUs, see `take_lock`), checking
    `stop()` meanwhile; returns the held lock (closing it lets the next process in), or None when stopped."""
    return take_lock(f"{lock_path}.{visible_gpus()}", stop, label, "the GPU", "waiting for the GPU")


def take_warm_up(lock_path, chunks, stop, label):
    """`take_lock` of `lock_path` for the model shapes of `chunks` and the visible GPUs (one file per set of shapes
    and of GPUs): the turn to warm up (compile) among the processes of those shapes on those GPUs. Per GPU, so that
    on several GPUs the first group of each still warms up at once."""
    shape = "+".join(f"{len(c)}x{c[0].cfg.model.encoder_layers}x{c[0].cfg.model.encoder_embed_dim}x"
                     f"{c[0].cfg.model.encoder_ffn_embed_dim}x{c[0].cfg.model.encoder_attention_heads}" for c in chunks)
    return take_lock(f"{lock_path}.{visible_gpus()}.{shape}", stop, label, "the warm-up turn of its shape",
                     "waiting to warm up after the other group of its shape")


def visible_gpus():
    """The visible GPUs as part of a file name: "0_1" for CUDA_VISIBLE_DEVICES=0,1, "all" when it is not set."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_")


class HeldLock:
    """A lock file this process holds, as a POSIX record lock (`fcntl.lockf`). Such a lock belongs to the process,
    not to the open file: a child process that inherited the descriptor (anything forked while it was held) does
    not keep it after `close()`, as it would keep an flock. Taking and letting go are logged with the clock, so that
    a sweep's logs show who held what when (in a 5-seed sweep a process was still waiting to warm up 7 minutes after
    the turn's holder, which held an flock then, had warmed up; 2026-11-28, one H200, commit ca91fba; record locks
    since ad7990f)."""

    def __init__(self, file, label, what):
        self.file, self.label, self.what = file, label, what
        print(f"{label}: took {what} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)

    @property
    def closed(self):
        return self.file.closed

    def close(self):
        if not self.file.closed:
            self.file.close()  # closing any descriptor of the file ends this process's record locks on it
            print(f"{self.label}: let go of {self.what} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)


def take_lock(path, stop, label, what, waiting):
    """Wait until this process holds `path` (an exclusive record lock, `HeldLock`), checking `stop()` meanwhile and
    printing "`label`: `waiting` (path) at time" once if it has to wait; returns the `HeldLock` (closing it lets the
    next process in), or None when stopped."""
    lock, waited = open(path, "a"), False
    while True:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return HeldLock(lock, label, what)
        except OSError as error:  # held elsewhere: EAGAIN or EACCES, as the system reports it
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if not waited:
            print(f"{label}: {waiting} ({path}) at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
            waited = True
        if stop():
            lock.close()
            return None
        time.sleep(0.2)
