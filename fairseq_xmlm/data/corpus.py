"""Reading a plain-text corpus (one item per line) with the checks every preparation step needs."""
from pathlib import Path

from fairseq_xmlm.errors import XmlmError


def _decoded_lines(path: Path):
    """(1-based number, line without its newline) of a UTF-8 file; XmlmError for a missing file or invalid UTF-8."""
    if not path.is_file():
        raise XmlmError(f"corpus file not found: {path}")
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise XmlmError(f"{path}: invalid UTF-8 on line {number} (byte {err.start + 1})") from None


def read_corpus(path, allow_empty_lines: bool = True) -> list[str]:
    """Lines of a UTF-8 text file without their newlines.

    Raises XmlmError for a missing file, a file with no non-blank line, and invalid UTF-8 (naming the 1-based
    line). Empty lines are kept (a verse file marks a verse missing in a version with an empty line) unless
    `allow_empty_lines` is False.
    """
    path = Path(path)
    lines = []
    for number, line in _decoded_lines(path):
        if not allow_empty_lines and not line.strip():
            raise XmlmError(f"{path}: empty line {number}")
        lines.append(line)
    if not any(line.strip() for line in lines):
        raise XmlmError(f"corpus file is empty: {path}")
    return lines


def check_corpus(path) -> None:
    """read_corpus's checks, the lines not kept: for a file that another program is about to read."""
    path = Path(path)
    has_text = False
    for _, line in _decoded_lines(path):
        has_text = has_text or bool(line.strip())
    if not has_text:
        raise XmlmError(f"corpus file is empty: {path}")
