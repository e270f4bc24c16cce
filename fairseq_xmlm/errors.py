"""One exception type for bad input, and the one-line report every command gives for it."""
import argparse
import functools
import sys

# How a traceback printed by another process (a spawned fairseq worker, a DataLoader worker) names our error.
_QUALIFIED_NAME = "fairseq_xmlm.errors.XmlmError: "


class XmlmError(Exception):
    """Bad input: a missing or empty file, invalid UTF-8, an unknown language, an impossible setting, ...

    The message names the problem in one line; console scripts print it as `error: <message>` and exit 2.
    """


class ArgumentParser(argparse.ArgumentParser):
    """argparse for our commands: a wrong option or value is bad input like any other, so it gets the one
    `error: ...` line and status 2 (argparse's own prints its whole usage text first)."""

    # options whose value is itself a command line: `--train-args --lr-scheduler` reads as two options to argparse
    # (a value with a space passes); the word after one of them is always its value
    COMMAND_LINE_VALUES = ("--train-args",)

    def parse_known_args(self, args=None, namespace=None):
        args = list(sys.argv[1:] if args is None else args)
        for i in range(len(args) - 2, -1, -1):
            if args[i] in self.COMMAND_LINE_VALUES:
                args[i:i + 2] = [f"{args[i]}={args[i + 1]}"]
        return super().parse_known_args(args, namespace)

    def error(self, message):
        self.exit(2, f"error: {message} (--help lists the options)\n")


def error_line(err):
    """The one-line message of an XmlmError, raised in this process or in a worker; None for any other error.

    A worker's error reaches this process as text: torch.multiprocessing.spawn raises ProcessRaisedException with
    the worker's traceback, and a DataLoader re-raises a worker's XmlmError with that traceback as its message. The
    last line of such a text is `fairseq_xmlm.errors.XmlmError: <message>`.
    """
    is_xmlm = isinstance(err, XmlmError)
    if not is_xmlm and type(err).__name__ != "ProcessRaisedException":
        return None
    lines = str(err).strip().splitlines()
    if lines and lines[-1].startswith(_QUALIFIED_NAME):
        return lines[-1][len(_QUALIFIED_NAME):]
    return " ".join(line.strip() for line in lines) if is_xmlm else None


def exit_with_error_line(err):
    """Print `error: <message>` and exit with status 2 if err is an XmlmError (here or in a worker); else return."""
    line = error_line(err)
    if line is not None:
        print(f"error: {line}", file=sys.stderr, flush=True)
        sys.exit(2)


def cli_errors(main):
    """Decorate a console-script `main` so an XmlmError becomes one clear line on stderr and exit status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 (anything but an XmlmError is re-raised as it was)
            exit_with_error_line(err)
            raise

    return wrapper


def install_excepthook():
    """The same one line for an XmlmError that ends a program whose main we do not own: fairseq-train,
    fairseq-preprocess, ... with `--user-dir fairseq_xmlm`. Any other error goes to the hook installed before.

    sys.exit inside an excepthook is honoured: the interpreter exits with that status, running atexit handlers.
    """
    previous = sys.excepthook
    if getattr(previous, "reports_xmlm_errors", False):
        return

    def hook(kind, value, traceback):
        exit_with_error_line(value)
        previous(kind, value, traceback)

    hook.reports_xmlm_errors = True
    sys.excepthook = hook
