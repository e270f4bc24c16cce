"""Table 1, its JSON source, Figure 3 and the training curves, from the per-run result files.

A row's number for a per-layer metric is taken at its best layer: the layer whose mean over seeds is highest; the
standard deviation over seeds (sample, ddof=1; 0 for one seed) is the one at that layer.
"""
import json
from pathlib import Path

import numpy as np

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.conneau.runs import PAPER_TABLE1, SETTINGS
from fairseq_xmlm.io import write_atomic, write_json
from fairseq_xmlm.plotting import pyplot, save_png


METRICS_BY_LAYER = ("retrieval", "retrieval_aligned", "translation", "alignment", "cka", "cka_random_encoder")
LOWER_BOUNDS = {"cka": "cka_random_encoder"}  # drawn dashed in the panel of their metric


def load_results(results_root):
    """{pair: {row: {seed: result}}} of every result file under results_root/<pair>/<row>/seed<S>.json."""
    found = {}
    for path in sorted(Path(results_root).glob("*/*/seed*.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise XmlmError(f"{path}: not a result file of this recipe ({err}); delete it to evaluate again") from None
        pair, row = path.parent.parent.name, path.parent.name
        if row in SETTINGS:
            found.setdefault(pair, {}).setdefault(row, {})[int(path.stem[len("seed"):])] = result
    return found


def of_seeds(found, seeds):
    """`found` (as load_results gives it) restricted to `seeds`, without the pairs and rows left empty."""
    kept = {}
    for pair, rows in found.items():
        for row, by_seed in rows.items():
            chosen = {seed: result for seed, result in by_seed.items() if seed in seeds}
            if chosen:
                kept.setdefault(pair, {})[row] = chosen
    return kept


def _std(values):
    return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def best_layer(by_seed, metric):
    """(layer, mean, std, {layer: mean}) of a per-layer metric over seeds; None when no seed has it."""
    tables = [result[metric] for result in by_seed.values() if result.get(metric)]
    if not tables:
        return None
    layers = sorted(tables[0], key=int)
    means = {layer: float(np.mean([table[layer] for table in tables])) for layer in layers}
    layer = max(layers, key=lambda k: means[k])
    return layer, means[layer], _std([table[layer] for table in tables]), means


def summarize_row(by_seed):
    """The JSON entry of one (pair, row): means over seeds."""
    entry = {"n_seeds": len(by_seed), "seeds": sorted(by_seed)}
    for metric in METRICS_BY_LAYER:
        best = best_layer(by_seed, metric)
        if best is not None:
            layer, mean, std, means = best
            entry.update({metric: mean, f"{metric}_std": std, f"{metric}_layer": int(layer),
                          f"{metric}_by_layer": means})
    genre = [result["genre"] for result in by_seed.values() if result.get("genre")]
    if genre:
        other = [lang for lang in genre[0]["test"] if lang != "en"][0]
        entry.update({"genre": float(np.mean([g["test"][other] for g in genre])),
                      "genre_std": _std([g["test"][other] for g in genre]),
                      "genre_majority": float(np.mean([g["majority"][other] for g in genre])),
                      "genre_en": float(np.mean([g["test"]["en"] for g in genre if "en" in g["test"]]))})
    entry["ppl_en"] = float(np.mean([result["ppl_en"] for result in by_seed.values()]))
    return entry


def summarize(found, preset, updates):
    """The document committed as docs/results/conneau_table1.json; "seeds" lists the seeds that have results."""
    seeds = sorted({seed for rows in found.values() for by_seed in rows.values() for seed in by_seed})
    return {"preset": preset, "updates": updates, "seeds": seeds,
            "pairs": {pair: {row: summarize_row(by_seed) for row, by_seed in rows.items()}
                      for pair, rows in sorted(found.items())}}


def _cell(entry, metric, scale=100, digits=1):
    if metric not in entry:
        return "-"
    std = entry.get(f"{metric}_std")
    layer = entry.get(f"{metric}_layer")
    text = f"{entry[metric] * scale:.{digits}f}"
    if std is not None and entry["n_seeds"] > 1:
        text += f" ± {std * scale:.{digits}f}"
    return text + (f" (L{layer})" if layer is not None else "")


def table_markdown(summary):
    """One table per pair; rows in Table 1 order; Δ = change of retrieval against Default."""
    lines = ["# Table 1 (Conneau et al. 2020) on the Bible", "",
             f"Preset `{summary['preset']}`, {summary['updates']} updates, seeds {summary['seeds']}; mean ± std "
             "over seeds. retrieval: sentence retrieval P@1 (%) on held-out verses at the best layer (Lk), by "
             "cosine in the model's own space; aligned: the same after a Procrustes map learned on training "
             "verses; translation: word translation P@1 (%), Procrustes + CSLS; alignment: contextual word "
             "alignment accuracy (%); genre: zero-shot genre accuracy (%) in the other language, majority baseline "
             "in brackets; genre en: the same classifier on English (in-language); "
             "ppl en: English dev perplexity. Paper Δ: the paper's change of XNLI / NER / parsing against Default.",
             ""]
    for pair, rows in summary["pairs"].items():
        lines += [f"## {pair}", "", "| row | retrieval | Δ | aligned | translation | alignment | genre (majority) | "
                  "genre en | ppl en | paper Δ XNLI/NER/parsing |", "|---|---|---|---|---|---|---|---|---|---|"]
        default = rows.get("default", {}).get("retrieval")
        for row, setting in SETTINGS.items():
            if row not in rows:
                continue
            entry = rows[row]
            delta = f"{(entry['retrieval'] - default) * 100:+.1f}" if default is not None and "retrieval" in entry \
                else "-"
            genre = (f"{_cell(entry, 'genre')} ({entry['genre_majority'] * 100:.1f})" if "genre" in entry
                     else "-")
            genre_en = f"{entry['genre_en'] * 100:.1f}" if "genre_en" in entry else "-"
            paper = "/".join(f"{d:+.1f}" for d in PAPER_TABLE1[row]["delta"])
            lines.append(f"| {setting.label} | {_cell(entry, 'retrieval')} | {delta} | "
                         f"{_cell(entry, 'retrieval_aligned')} | {_cell(entry, 'translation')} | "
                         f"{_cell(entry, 'alignment')} | {genre} | {genre_en} | "
                         f"{entry['ppl_en']:.1f} | {paper} |")
        lines.append("")
    return "\n".join(lines)


def _legend(axis):
    if axis.get_legend_handles_labels()[0]:  # a panel with no data gets none (matplotlib would warn)
        axis.legend(fontsize=8)


def plot_figure3(summary, path):
    """Figure 3's shape: per row, sentence retrieval and zero-shot genre accuracy, one line per pair."""
    plt = pyplot()
    rows = [row for row in SETTINGS if any(row in by_row for by_row in summary["pairs"].values())]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for axis, metric, title in ((axes[0], "retrieval", "sentence retrieval P@1 (best layer)"),
                                (axes[1], "genre", "zero-shot genre accuracy")):
        for pair, by_row in summary["pairs"].items():
            shown = [k for k, row in enumerate(rows) if metric in by_row.get(row, {})]
            if not shown:
                continue
            values = [by_row[rows[k]][metric] for k in shown]
            errors = [by_row[rows[k]].get(f"{metric}_std", 0) for k in shown]
            line = axis.errorbar(shown, values, yerr=errors, marker="o", capsize=3, label=pair)
            if metric == "genre":
                axis.plot(shown, [by_row[rows[k]]["genre_majority"] for k in shown], ls=":",
                          color=line[0].get_color(), label=f"{pair} majority")
        axis.set_xticks(range(len(rows)), [SETTINGS[row].label for row in rows], rotation=35, ha="right")
        axis.set_title(title)
        _legend(axis)
    fig.suptitle("Bilingual MLM on the Bible under Conneau et al.'s settings (cf. their Figure 3)")
    return save_png(fig, path)


def plot_curves(found, path, row="default"):
    """Retrieval (best layer at each point) and English dev perplexity against updates, per pair and seed."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for pair, rows in sorted(found.items()):
        for seed, result in sorted(rows.get(row, {}).items()):
            curve = result.get("curve") or []
            if not curve:
                continue
            updates = [point["updates"] for point in curve]
            left.plot(updates, [max(point["retrieval"].values()) for point in curve], marker=".",
                      label=f"{pair} seed {seed}")
            right.plot(updates, [point["ppl_en"] for point in curve], marker=".", label=f"{pair} seed {seed}")
    left.set(xlabel="updates", ylabel="retrieval P@1 (best layer)", title=f"{SETTINGS[row].label}: retrieval")
    right.set(xlabel="updates", ylabel="English dev perplexity", title=f"{SETTINGS[row].label}: perplexity",
              yscale="log")
    _legend(left)
    return save_png(fig, path)


def compare_curves(roots, path, pair="en-fr", row="default"):
    """Several result trees of one row (e.g. model sizes): {label: {seed: curve}} as JSON, and their retrieval
    and perplexity curves in one figure (how a preset was chosen)."""
    plt = pyplot()
    curves = {}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
    for label, root in roots.items():
        by_seed = load_results(root).get(pair, {}).get(row, {})
        if not by_seed:
            raise XmlmError(f"no {pair} {row} results under {root}")
        curves[label] = {str(seed): result.get("curve") or [] for seed, result in sorted(by_seed.items())}
        for seed, curve in curves[label].items():
            updates = [point["updates"] for point in curve]
            left.plot(updates, [max(point["retrieval"].values()) for point in curve], marker=".",
                      label=f"{label} seed {seed}")
            right.plot(updates, [point["ppl_en"] for point in curve], marker=".", label=f"{label} seed {seed}")
    left.set(xlabel="updates", ylabel="retrieval P@1 (best layer)", title=f"{pair} {SETTINGS[row].label}")
    right.set(xlabel="updates", ylabel="English dev perplexity", title=f"{pair} {SETTINGS[row].label}")
    _legend(left)
    save_png(fig, path)
    write_json(Path(path).with_suffix(".json"), {"pair": pair, "row": row, "curves": curves})
    return curves


def plot_layers(summary, path, row="default"):
    """Section 5 of the paper on the trained Default models: each metric per layer, one line per pair; CKA with
    its random-encoder lower bound dashed (Figure 7)."""
    plt = pyplot()
    metrics = [m for m in METRICS_BY_LAYER if m not in LOWER_BOUNDS.values()
               and any(f"{m}_by_layer" in rows.get(row, {}) for rows in summary["pairs"].values())]
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.8), squeeze=False)
    for axis, metric in zip(axes[0], metrics):
        for pair, rows in summary["pairs"].items():
            by_layer = rows.get(row, {}).get(f"{metric}_by_layer")
            if by_layer:
                layers = sorted(by_layer, key=int)
                line, = axis.plot([int(k) for k in layers], [by_layer[k] for k in layers], marker="o", label=pair)
                bound = rows[row].get(f"{LOWER_BOUNDS.get(metric)}_by_layer")
                if bound:
                    axis.plot([int(k) for k in layers], [bound[k] for k in layers], ls="--",
                              color=line.get_color(), label=f"{pair} random encoder")
        axis.set(xlabel="layer (0 = embeddings)", title=metric)
        _legend(axis)
    fig.suptitle(f"{SETTINGS[row].label} models: cross-lingual similarity per layer")
    return save_png(fig, path)


def write_report(results_root, out_dir, preset, updates, seeds):
    """table1.md, conneau_table1.json, figure3.png, curves.png and layers.png in out_dir; returns the summary."""
    found = of_seeds(load_results(results_root), seeds)
    if not found:
        raise XmlmError(f"no results of seeds {', '.join(map(str, seeds))} under {results_root}: run the recipe "
                        f"first")
    summary = summarize(found, preset, updates)
    out_dir = Path(out_dir)
    write_json(out_dir / "conneau_table1.json", summary)
    write_atomic(out_dir / "table1.md", table_markdown(summary))
    plot_figure3(summary, out_dir / "figure3.png")
    plot_curves(found, out_dir / "curves.png")
    plot_layers(summary, out_dir / "layers.png")
    return summary
