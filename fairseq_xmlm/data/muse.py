"""Bilingual word dictionaries in MUSE format: one pair `src tgt` per line, optionally a weight `src tgt 0.7`.

The one reader of such files (xmlm-eval-mult's --dict, xmlm-analyze word's --dict-train/--dict-test, the
code-switching dictionary of xmlm-prepare) and their one writer (xmlm-fetch-dict).
"""
from pathlib import Path

from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import write_lines


def load_muse_dictionary(path, with_weights: bool = False) -> list[tuple]:
    """MUSE lines `src tgt [weight]` -> [(src, tgt)], or [(src, tgt, weight)] (weight 1.0 when absent).

    Blank lines are skipped. A missing file, a file without pairs, invalid UTF-8 and a line of another shape are
    XmlmErrors naming the file (and the line)."""
    if not Path(path).is_file():
        raise XmlmError(f"dictionary {path} does not exist")
    entries = []
    for number, line in enumerate(read_corpus(path), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) not in (2, 3):
            raise XmlmError(f"{path}: line {number} is not `src tgt [weight]`: {line[:60]!r}")
        if with_weights:
            try:
                weight = float(fields[2]) if len(fields) == 3 else 1.0
            except ValueError:
                raise XmlmError(f"{path}: line {number} has a non-numeric weight {fields[2]!r}") from None
            entries.append((fields[0], fields[1], weight))
        else:
            entries.append((fields[0], fields[1]))
    return entries


def write_muse(path, pairs) -> None:
    """One `src tgt` line per pair, written atomically."""
    write_lines(path, (" ".join(map(str, pair)) for pair in pairs))
