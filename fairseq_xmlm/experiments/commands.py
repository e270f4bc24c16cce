"""What the experiments' commands share: their --seeds option, comma-separated choices, the --max-update of a
preset, and running the steps of an experiment as child processes: each printed before it runs (`+ command`), none
run under --dry-run, a failure one `error:` line (XmlmError) instead of a traceback."""
import os
import subprocess
import sys

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log


def parse_seeds(text, option="--seeds"):
    """--seeds '1,42,100' -> [1, 42, 100]: distinct integers >= 0 (fairseq's --seed; a seed twice would train one run
    twice), else one error naming `option`."""
    try:
        seeds = [int(seed) for seed in text.split(",") if seed.strip()]
    except ValueError:
        raise XmlmError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not seeds:
        raise XmlmError(f"{option} is empty")
    if min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise XmlmError(f"{option} needs distinct seeds >= 0, got {text!r}")
    return seeds


def parse_choices(text, known, what, default=None):
    """'a, b' -> ["a", "b"], each one of `known` (else one error naming the unknown ones and `what` they are);
    "all" -> every one of `known`; empty or None -> `default` (every one of `known` without one)."""
    if text == "all":
        return list(known)
    chosen = ([name.strip() for name in text.split(",") if name.strip()] if text
              else list(known if default is None else default))
    unknown = [name for name in chosen if name not in known]
    if unknown or not chosen:
        raise XmlmError(f"unknown {what} {unknown or '(none given)'}; known: all, {', '.join(known)}")
    return chosen


def updates_of(train_args):
    """A fairseq-train argv's --max-update (the last one given wins, as in fairseq's parser); None without one."""
    values = [train_args[k + 1] for k, arg in enumerate(train_args[:-1]) if arg == "--max-update"]
    return int(values[-1]) if values else None


def python_module(name):
    """`python -m NAME`: works where the console scripts are not installed (e.g. a GPU machine with PYTHONPATH)."""
    return [sys.executable, "-m", name]


def run_command(command, dry_run, log_path=None):
    """Run one command; with `log_path`, its output goes to LOG.partial, renamed to LOG when it succeeds (so a
    finished step is told from an interrupted one), and its progress lines also to the console."""
    command = list(map(str, command))
    log("+ " + " ".join(command))
    if dry_run:
        return
    # A step that refuses bad input ends with `error: <reason>` (every command of ours, fairseq-train with the
    # plugin): that reason becomes this command's one error line, instead of a second line after the step's.
    reason = None
    if log_path is None:
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
        for line in process.stderr:
            if line.startswith("error: "):
                reason = line[len("error: "):].strip()
            else:
                sys.stderr.write(line)
        if process.wait():
            raise XmlmError(reason or f"command failed: {' '.join(command)}")
        return
    tmp = log_path.with_name(log_path.name + ".partial")
    with open(tmp, "w") as out:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                   env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for line in process.stdout:
            out.write(line)
            if line.startswith("error: "):
                reason = line[len("error: "):].strip()
            elif " | train_inner | " in line or " | valid | " in line or "Error" in line:  # progress on the console
                sys.stderr.write(line)
        if process.wait():
            raise XmlmError(f"{reason} (log: {tmp})" if reason else
                            f"command failed (exit {process.returncode}), log: {tmp}")
    tmp.replace(log_path)
