"""The ground floor of file output: atomic writes that respect the umask, JSON, progress lines, meta.json.

Every result, table, figure and dictionary the project writes goes through `write_atomic` (or a `writer`
callback given to `replace_atomically`): it writes a temporary file in the target's folder and renames it, so a
reader never sees half a file and a crash leaves the old file (or none). `tempfile.mkstemp` creates files with
mode 0600; the final file gets the mode a plain `open()` would have given it (0666 minus the umask), so results
stay readable by the rest of a group.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

from fairseq_xmlm.errors import XmlmError


def _umask_mode():
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def replace_atomically(path, write):
    """Call write(tmp_path) on a temporary file beside `path`, then rename it onto `path` (mode as open() gives).

    The temporary file is removed when `write` raises, so nothing half-written is left behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(handle)
    try:
        write(tmp)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def write_atomic(path, text):
    """Write text (UTF-8) to path atomically; returns the path."""
    return replace_atomically(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def write_lines(path, lines):
    """Write one line per item (each followed by a newline) atomically."""
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as handle:
            for line in lines:
                handle.write(f"{line}\n")
    return replace_atomically(path, write)


def write_json(path, payload, indent=1):
    """Write payload as JSON (UTF-8, a final newline) atomically."""
    return write_atomic(path, json.dumps(payload, indent=indent, ensure_ascii=False) + "\n")


def log(message):
    """A progress line on stderr, flushed at once (stdout is kept for results)."""
    print(message, file=sys.stderr, flush=True)


def read_meta(data_dir, required=True):
    """The dict xmlm-prepare wrote to data_dir/meta.json; None when absent and not required."""
    path = Path(data_dir) / "meta.json"
    if not path.is_file():
        if not required:
            return None
        raise XmlmError(f"{path} is missing: is {data_dir} a data-bin directory written by xmlm-prepare?")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise XmlmError(f"{path} is not valid JSON ({err}): rewrite it with xmlm-prepare") from None
    if not isinstance(meta, dict):
        raise XmlmError(f"{path} does not hold a JSON object: rewrite it with xmlm-prepare")
    return meta
