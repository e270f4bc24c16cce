"""One exception type for bad input, and the one-line report every console script gives for it."""
import functools
import sys


class XmlmError(Exception):
    """Bad input: a missing or empty file, invalid UTF-8, an unknown language, an impossible setting, ...

    The message names the problem in one line; console scripts print it as `error: <message>` and exit 2.
    """


def cli_errors(main):
    """Decorate a console-script `main` so an XmlmError becomes one clear line on stderr and exit status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except XmlmError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(2)

    return wrapper
