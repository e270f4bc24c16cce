"""The summary of the similarity analyses: results/analysis/summary.md from each pair's sentence.json, cka.json
and (en-fr, en-de, en-ru) word.json."""
import json
from pathlib import Path

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import write_atomic


def _read(path):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise XmlmError(f"{path}: not a readable result JSON ({err})") from None


def _row(name, values):
    return f"| {name} | " + " | ".join(f"{100 * v:.1f}" for v in values) + " |"


def _layer_table(title, pairs, values_of):
    rows = [_row(pair.name, values_of(pair)) for pair in pairs]
    width = rows[0].count("|") - 2
    return [f"## {title}", "", "| pair | " + " | ".join(f"L{i}" for i in range(width)) + " |",
            "|---" * (width + 1) + "|", *rows, ""]


def summary_markdown(results):
    """Per layer: sentence retrieval P@1 (both directions averaged), linear CKA and its random-encoder bound; the
    Pearson correlation of CKA and retrieval; word translation P@1 where a dictionary was given."""
    pairs = sorted(path.parent for path in Path(results).glob("*/cka.json"))
    if not pairs:
        raise XmlmError(f"no <pair>/cka.json under {results}: run the analyses first")
    lines = ["# Similarity of monolingual Bible MLMs (Conneau et al. 2020, Section 5)", ""]
    lines += _layer_table("Sentence retrieval P@1 (%), mean of both directions, per layer", pairs,
                          lambda p: [(r["a_to_b"] + r["b_to_a"]) / 2 for r in _read(p / "sentence.json")["layers"]])
    lines += _layer_table("Linear CKA (x100) per layer", pairs, lambda p: _read(p / "cka.json")["cka"])
    lines += _layer_table("Random-encoder CKA (x100) per layer", pairs, lambda p: _read(p / "cka.json")["cka_random"])
    lines += ["## Pearson correlation of CKA and sentence retrieval across layers", "",
              *[f"- {p.name}: {_read(p / 'cka.json')['pearson_cka_retrieval']:.3f}" for p in pairs], ""]
    words = [p for p in pairs if (p / "word.json").exists()]
    if words:
        lines += ["## Word translation P@1 (%), CSLS", "", "| pair | embeddings | fastText | best contextual layer |",
                  "|---|---|---|---|"]
        for p in words:
            word = _read(p / "word.json")
            best = max(range(len(word["contextual"])), key=lambda i: word["contextual"][i]["p1"])
            lines.append(f"| {p.name} | {100 * word['noncontextual']['p1']:.1f} | {100 * word['fasttext']['p1']:.1f} | "
                         f"L{best}: {100 * word['contextual'][best]['p1']:.1f} |")
    return "\n".join(lines) + "\n"


def write_summary(results):
    return write_atomic(Path(results) / "summary.md", summary_markdown(results))
