"""Reading a plain-text corpus (one item per line) with the checks every preparation step needs."""
from pathlib import Path

from fairseq_xmlm.errors import XmlmError


def read_corpus(path, allow_empty_lines: bool = True) -> list[str]:
    """Lines of a UTF-8 text file without their newlines.

    Raises XmlmError for a missing file, a file with no non-blank line, and invalid UTF-8 (naming the 1-based
    line). Empty lines are kept (a verse file marks a verse missing in a version with an empty line) unless
    `allow_empty_lines` is False.
    """
    path = Path(path)
    if not path.is_file():
        raise XmlmError(f"corpus file not found: {path}")
    lines = []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise XmlmError(f"{path}: invalid UTF-8 on line {number} (byte {err.start + 1})") from None
            line = line.rstrip("\r\n")
            if not allow_empty_lines and not line.strip():
                raise XmlmError(f"{path}: empty line {number}")
            lines.append(line)
    if not any(line.strip() for line in lines):
        raise XmlmError(f"corpus file is empty: {path}")
    return lines
