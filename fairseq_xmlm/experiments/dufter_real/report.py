"""Table 3 on the Bible: results/dufter_table3/{dufter_table3.json, table3.md, curves.png}.

dufter_table3.json = {"updates": int, "seeds": [int], "rows": {setting: {"en": float, "de": float, "hi": float,
"majority": {lang: float}, "retrieval": {lang: float}, "n": int}}}: genre test accuracies (fractions; the first
language in-language, the others zero-shot) and their majority-class baselines, retrieval P@1 of each other
language against the first at the layer best for that run, each the mean over the n seeds evaluated. The markdown
table adds the standard deviations and the paper's XNLI numbers.
"""
import json
from pathlib import Path

import numpy as np

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter_real.runs import PAPER_TABLE3, SETTING_IDS
from fairseq_xmlm.io import write_atomic, write_json
from fairseq_xmlm.plotting import pyplot, save_png


def load_results(results_root):
    """{setting: {seed: result}} of every seed<S>.json under results_root/<setting>/."""
    found = {}
    for path in sorted(Path(results_root).glob("*/seed*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
            seed = int(path.stem[len("seed"):])
        except (ValueError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise XmlmError(f"{path} is not a result of this recipe ({err}): delete it to evaluate again") from None
        found.setdefault(path.parent.name, {})[seed] = result
    return found


def _mean_std(values):
    return float(np.mean(values)), float(np.std(values))


def summarize(found, updates, seeds):
    """The dufter_table3.json document and {setting: {column: std}} for the markdown table."""
    rows, spread = {}, {}
    for setting in [name for name in SETTING_IDS if name in found] + sorted(set(found) - set(SETTING_IDS)):
        results = [found[setting][seed] for seed in sorted(found[setting])]
        langs = results[0]["langs"]
        row, std = {}, {}
        for lang in langs:
            row[lang], std[lang] = _mean_std([r["genre"]["test"][lang] for r in results])
        row["majority"] = {lang: _mean_std([r["genre"]["majority"][lang] for r in results])[0] for lang in langs}
        row["retrieval"] = {}
        for lang in langs[1:]:
            row["retrieval"][lang], std[f"retrieval_{lang}"] = _mean_std(
                [max(r["retrieval"][lang].values()) for r in results])
        row["n"] = len(results)
        rows[setting], spread[setting] = row, std
    return {"updates": updates, "seeds": list(seeds), "rows": rows}, spread


def table_markdown(summary, spread, labels, preset):
    langs = [key for key in next(iter(summary["rows"].values())) if key not in ("majority", "retrieval", "n")]
    note = (f"Bible genre accuracy (%; {len(langs)} languages, one model per setting and seed, preset `{preset}`, "
            f"{summary['updates']} updates), fine-tuned on {langs[0]} verses of the genre training books, tested on "
            f"held-out books: {langs[0]} in-language, {', '.join(langs[1:])} zero-shot; majority-class baseline in "
            f"brackets; retrieval: P@1 (%) of a test verse's translation against {langs[0]} by cosine of "
            f"mean-pooled states at each run's best layer. Mean ± std over the seeds {summary['seeds']} (n per row). "
            "Paper: XNLI accuracy (%), BERT-base on Wikipedia, majority 33.")
    columns = ["ID", "setting", *langs, *(f"retrieval {lang}" for lang in langs[1:]), "n",
               *(f"paper {lang}" for lang in langs)]
    lines = ["# Table 3 (Dufter & Schütze 2020) on the Bible", "", note, "", "| " + " | ".join(columns) + " |",
             "|---" * len(columns) + "|"]
    for setting, row in summary["rows"].items():
        cells = [setting, labels.get(setting, setting)]
        cells += [f"{row[lang] * 100:.1f} ± {spread[setting][lang] * 100:.1f} ({row['majority'][lang] * 100:.1f})"
                  for lang in langs]
        cells += [f"{row['retrieval'][lang] * 100:.1f} ± {spread[setting][f'retrieval_{lang}'] * 100:.1f}"
                  for lang in langs[1:]]
        cells.append(str(row["n"]))
        paper = PAPER_TABLE3.get(setting, {})
        cells += [f"{paper[lang][0] * 100:.0f} ± {paper[lang][1] * 100:.0f}" if lang in paper else "-"
                  for lang in langs]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_curves(found, path):
    """Dev perplexity per language against updates, one panel per setting: a colour per language, a line style per
    seed, so that nine lines a panel stay apart."""
    plt = pyplot()
    names = [name for name in SETTING_IDS if name in found]
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6), squeeze=False, layout="constrained")
    colours, styles = {}, {}
    for axis, name in zip(axes[0], names):
        for seed, result in sorted(found[name].items()):
            style = styles.setdefault(seed, ("-", "--", ":", "-.")[len(styles) % 4])
            for lang, points in sorted(result.get("curve", {}).items()):
                colour = colours.setdefault(lang, f"C{len(colours) % 10}")
                updates = sorted(points, key=int)
                axis.plot([int(u) for u in updates], [points[u] for u in updates], color=colour, linestyle=style,
                          label=f"{lang} seed {seed}")
        axis.set(xlabel="updates", yscale="log", title=name)
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize=6)
    axes[0][0].set_ylabel("dev perplexity")
    return save_png(fig, path)


def write_report(results_root, labels, preset, updates, seeds):
    """dufter_table3.json, table3.md and curves.png in results_root; returns the summary."""
    found = load_results(results_root)
    if not found:
        raise XmlmError(f"no results under {results_root}: run the recipe first")
    summary, spread = summarize(found, updates, seeds)
    results_root = Path(results_root)
    write_json(results_root / "dufter_table3.json", summary)
    write_atomic(results_root / "table3.md", table_markdown(summary, spread, labels, preset))
    plot_curves(found, results_root / "curves.png")
    return summary
