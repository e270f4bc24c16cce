"""Dufter & Schütze 2020's figures as PNG (matplotlib's Agg backend, no display needed).

- Fig. 4: PCA of the layer-0 vectors of every word of both languages (top) and of a sample, twins joined (bottom);
- Fig. 5/8: cosine similarity of position embeddings (English positions first, then Fake under lang-pos);
- Fig. 6/7: mu and perplexity over training updates, mean and std bands over seeds, read from fairseq's
  json validation log lines written while training with `--eval-multilinguality`.
"""
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.plotting import pyplot, save_png


def pca_2d(vectors):
    """Project (n, d) rows on their first two principal components."""
    centered = vectors - vectors.mean(dim=0, keepdim=True)
    _, _, v = torch.pca_lowrank(centered, q=2, center=False)
    return centered @ v[:, :2]


def plot_token_pca(english, fake, words, path, sample=30, seed=0):
    """Fig. 4: one PCA over both languages' word vectors (n, d) each; row i of `fake` is the twin of row i."""
    points = pca_2d(torch.cat([english, fake]).float()).numpy()
    n = len(english)
    fig, (top, bottom) = pyplot().subplots(2, 1, figsize=(7, 11))
    top.scatter(points[:n, 0], points[:n, 1], s=3, alpha=0.5, label="English")
    top.scatter(points[n:, 0], points[n:, 1], s=3, alpha=0.5, label="Fake-English")
    top.legend()
    top.set_title("PCA of layer-0 token vectors")
    chosen = np.random.default_rng(seed).choice(n, size=min(sample, n), replace=False)
    for i in chosen:
        (x0, y0), (x1, y1) = points[i], points[n + i]
        bottom.plot([x0, x1], [y0, y1], color="0.8", linewidth=0.7)
        bottom.annotate(words[i], (x0, y0), fontsize=7, color="C0")
        bottom.annotate("::" + words[i], (x1, y1), fontsize=7, color="C1")
    bottom.scatter(points[chosen, 0], points[chosen, 1], s=8, color="C0")
    bottom.scatter(points[n + chosen, 0], points[n + chosen, 1], s=8, color="C1")
    bottom.set_title(f"a sample of {len(chosen)} tokens and their twins")
    return save_png(fig, path)


def position_similarity(tables):
    """Cosine similarity between all rows of the position tables, stacked in order (English first): (P, P)."""
    rows = F.normalize(torch.cat([t.detach().float() for t in tables]), dim=-1)
    return rows @ rows.T


def plot_position_similarity(panels, path):
    """Fig. 5/8: one similarity matrix per panel, {title: (P, P) matrix}."""
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5 * len(panels), 4.5), squeeze=False)
    for axis, (title, matrix) in zip(axes[0], panels.items()):
        image = axis.imshow(matrix.numpy(), cmap="viridis", vmin=-1, vmax=1)
        axis.set_title(title)
        axis.set_xlabel("position id")
        axis.set_ylabel("position id")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8)
    return save_png(fig, path)


def read_fairseq_log(path, tag):
    """The json records of one kind (`valid`, `train`) from a fairseq log written with --log-format json.

    A line looks like `... | INFO | valid | {"epoch": 1, "valid_loss": "6.1", ..., "valid_num_updates": "40"}`.
    Values become floats where they are numbers.
    """
    records = []
    for line in Path(path).read_text(errors="replace").splitlines():
        marker = f"| {tag} | {{"
        if marker not in line:
            continue
        record = json.loads(line[line.index(marker) + len(marker) - 1:])
        records.append({key: _number(value) for key, value in record.items()})
    return records


def _number(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def curves_over_seeds(logs, metric, tag="valid"):
    """Mean and (sample) std over seeds of `{tag}_{metric}` at the updates every seed's log has.

    logs: list of log paths (one per seed). Returns (updates, mean, std) as numpy arrays.
    """
    per_seed = []
    for path in logs:
        series = {int(r[f"{tag}_num_updates"]): r[f"{tag}_{metric}"]
                  for r in read_fairseq_log(path, tag) if f"{tag}_{metric}" in r and f"{tag}_num_updates" in r}
        per_seed.append(series)
    common = sorted(set.intersection(*(set(s) for s in per_seed))) if per_seed else []
    if not common:
        raise XmlmError(f"no '{tag}_{metric}' records shared by the logs {[str(p) for p in logs]} "
                        "(train with --log-format json and --eval-multilinguality)")
    values = np.array([[series[u] for u in common] for series in per_seed])
    std = values.std(axis=0, ddof=1) if len(values) > 1 else np.zeros(len(common))
    return np.array(common), values.mean(axis=0), std


def plot_training_curves(runs, path, metrics=("mu", "retrieval0", "retrieval8", "translation0", "translation8")):
    """Fig. 6/7: per run (label -> seed logs) the multilinguality parts and the perplexities over updates."""
    fig, axes = pyplot().subplots(len(runs), 2, figsize=(12, 3.8 * len(runs)), squeeze=False)
    for (label, logs), (left, right) in zip(runs.items(), axes):
        for metric in metrics:
            updates, mean, std = curves_over_seeds(logs, metric)
            left.plot(updates, mean, label=metric, linewidth=2 if metric == "mu" else 1)
            left.fill_between(updates, mean - std, mean + std, alpha=0.2)
        left.set_ylim(0, 1)
        seeds = f"{len(logs)} seed{'s' if len(logs) > 1 else ''}"
        left.set_title(f"{label}: multilinguality ({seeds})")
        left.legend(fontsize=7)
        for tag in ("train", "valid"):
            # over seeds in log space (fairseq's base-2 loss): one run that fails to learn widens the band
            # instead of swamping the mean, and the band stays positive on the log axis
            updates, mean, std = curves_over_seeds(logs, "loss", tag)
            right.plot(updates, 2 ** mean, label=f"{tag} perplexity")
            right.fill_between(updates, 2 ** (mean - std), 2 ** (mean + std), alpha=0.2)
        right.set_yscale("log")
        right.set_title(f"{label}: MLM perplexity ({seeds})")
        right.legend(fontsize=7)
        for axis in (left, right):
            axis.set_xlabel("updates")
    fig.tight_layout()
    return save_png(fig, path)


def plot_causes(summary, path):
    """The causes table as a figure: per cause and run, μ before (open circle) and after (filled), joined by an arrow,
    the paper's μ of the run as a grey bar, and how many seeds stalled before and after, where any did. Writes
    nothing (returns None) while no run has results on both sides: the tables still report the side there is."""
    from fairseq_xmlm.experiments.dufter.runs import PAPER_TABLE1, RUNS

    rows = [(cause, run_id, sides) for cause, entry in summary.items() for run_id, sides in entry["runs"].items()
            if sides["before"] and sides["after"]]
    if not rows:
        return None
    colors = {cause: f"C{k % 10}" for k, cause in enumerate(summary)}
    fig, axis = pyplot().subplots(figsize=(8, 0.28 * len(rows) + 1.2))
    for y, (cause, run_id, sides) in enumerate(rows):
        before, after = sides["before"]["mu"], sides["after"]["mu"]
        color = colors[cause]
        axis.annotate("", xy=(after, y), xytext=(before, y), arrowprops={"arrowstyle": "->", "color": color})
        axis.plot([before], [y], "o", mfc="white", color=color)
        axis.plot([after], [y], "o", color=color)
        if run_id in PAPER_TABLE1:
            axis.plot([PAPER_TABLE1[run_id]["mu"][0]] * 2, [y - 0.35, y + 0.35], color="0.5", linewidth=2)
        if sides["before"]["stalled"] or sides["after"]["stalled"]:  # a stalled side explains its μ
            axis.annotate("stalled " + " → ".join(f"{side['stalled']}/{side['n']}" for side in sides.values()),
                          (max(before, after), y), xytext=(6, -3), textcoords="offset points", fontsize=7, color="C3")
    axis.set_yticks(range(len(rows)), [f"{cause}: {run_id} {RUNS[run_id].description}" for cause, run_id, _ in rows],
                    fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel("μ (open: the setting set against, the 2026-11-28 baseline unless the cause names another, or "
                    "the cause's own KJV evaluation; filled: with the cause; grey: the paper)", fontsize=7)
    axis.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path)


def plot_comparison(rows, names, path):
    """Two Dufter tables against the paper (`compare`): per row (label, the paper's μ or None, BEFORE's row, AFTER's
    row), μ ± std over the seeds of BEFORE (open circle) and AFTER (filled), joined by an arrow, and the paper's μ as
    a grey bar."""
    fig, axis = pyplot().subplots(figsize=(8, 0.32 * len(rows) + 1.4))
    for y, (_, paper, old, new) in enumerate(rows):
        if paper is not None:
            axis.plot([paper] * 2, [y - 0.35, y + 0.35], color="0.5", linewidth=2)
        axis.annotate("", xy=(new["mu"], y + 0.12), xytext=(old["mu"], y - 0.12),
                      arrowprops={"arrowstyle": "->", "color": "0.3", "linewidth": 0.8})
        for row, offset, style in ((old, -0.12, {"mfc": "white"}), (new, 0.12, {})):
            axis.errorbar([row["mu"]], [y + offset], xerr=[row.get("mu_std") or 0], fmt="o", color="C0", capsize=2,
                          markersize=5, **style)
    axis.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=7)
    axis.invert_yaxis()
    axis.set_xlim(0, 1)
    axis.set_xlabel(f"μ ± std over seeds (open: {names[0]}; filled: {names[1]}; grey: the paper)", fontsize=8)
    axis.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path)
