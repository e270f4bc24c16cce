"""Dufter & Schütze 2020's Tables 1 and 2 (markdown) and Figures 4-8 (PNG) from the runs' results.

Each run writes one `xmlm-eval-mult` JSON per seed; `aggregate` turns a run's JSONs into mean and std per column
and `markdown_table` lays them out as the paper does (mu, layer-0 F1/rho/tau, layer-8 F1/rho/tau, train/dev
perplexity), with the paper's mu beside ours.
"""
import importlib.util
import json
import math
import statistics
from pathlib import Path

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter.runs import (COLUMNS, CURVE_IDS, PAPER_TABLE1, PAPER_TABLE2, RUNS, TABLE1_IDS,
                                                  TABLE2_IDS)
from fairseq_xmlm.io import log, write_atomic, write_json


def result_columns(result, layers=("0", "8")):
    """One eval JSON -> {column: value} for the two layers shown (low, high)."""
    try:
        low, high = (result["layers"][layer] for layer in layers)
        return {
            "mu": result["mu"],
            "f1_lo": low["align_f1"], "rho_lo": low["retrieval"], "tau_lo": low["translation"],
            "f1_hi": high["align_f1"], "rho_hi": high["retrieval"], "tau_hi": high["translation"],
            "ppl_train": result["ppl"]["train"], "ppl_dev": result["ppl"]["valid"],
        }
    except (KeyError, TypeError) as err:
        raise XmlmError(f"result {result.get('checkpoint', '?') if isinstance(result, dict) else '?'} lacks "
                        f"{err} (layers {list(layers)} expected)") from None


def mean_std(values):
    """Mean and sample standard deviation (None for a single value: one seed has no spread to report)."""
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


# A seed stalled (trained, but its training never left the unigram plateau) when its training perplexity ends over
# STALL_FACTOR x the median of every trained run of its table: measured stalls end at 276-558 (about the unigram
# perplexity), trained runs at 2-14. The median of the whole table, not of one row: where most of a row's seeds
# stalled (lang-pos, 2 of 3 in one sweep), the row's own median is a stalled seed.
STALL_FACTOR = 10.0


def stall_ppl(results):
    """STALL_FACTOR x the median training perplexity of `results` (eval JSONs of trained runs); inf without any."""
    ppls = [result["ppl"]["train"] for result in results]
    return STALL_FACTOR * statistics.median(ppls) if ppls else math.inf


def trained_results(results_by_id):
    """Every eval JSON of {ID: [results]} whose run ID trains (not `untrained`): what `stall_ppl` is taken over."""
    return [result for run_id, results in results_by_id.items()
            if run_id in RUNS and not RUNS[run_id].untrained for result in results]


def aggregate(results, layers=("0", "8"), stall_threshold=math.inf):
    """A run's eval JSONs (one per seed) -> {column: (mean, std)}, "n": number of seeds, "stalled": the checkpoints
    and train perplexities of seeds over `stall_threshold` (`stall_ppl`), which stay in the mean."""
    rows = [result_columns(r, layers) for r in results]
    summary = {column: mean_std([row[column] for row in rows]) for column in COLUMNS}
    summary["n"] = len(rows)
    summary["stalled"] = [(r["checkpoint"], r["ppl"]["train"]) for r in results
                          if r["ppl"]["train"] > stall_threshold]
    return summary


def _cell(column, mean_and_std):
    mean, std = mean_and_std
    if column.startswith("ppl"):
        text = f"{mean:.0f}"
        return text if std is None else f"{text} ± {std:.1f}"
    text = f"{mean:.2f}"
    return text if std is None else f"{text} ± {std:.2f}"


HEADER = ("| ID | Description | n | μ | μ (paper) | L0 F1 | L0 ρ | L0 τ | L8 F1 | L8 ρ | L8 τ "
          "| ppl train | ppl dev |")


def markdown_table(ids, summaries, paper, title):
    """Our mean ± std per column (seeds: n), with the paper's μ beside ours and its full row below ours."""
    rule = "|" + "---|" * (HEADER.count("|") - 1)
    lines = [f"## {title}", "", HEADER, rule]
    for run_id in ids:
        summary = summaries.get(run_id)
        paper_row = paper.get(run_id)
        paper_mu = _cell("mu", (paper_row["mu"][0], None)) if paper_row else "–"
        if summary:
            cells = [_cell(column, summary[column]) for column in COLUMNS]
            lines.append(f"| {run_id} | {RUNS[run_id].description} | {summary['n']} | {cells[0]} | {paper_mu} | "
                         + " | ".join(cells[1:]) + " |")
        else:
            lines.append(f"| {run_id} | {RUNS[run_id].description} | 0 | – | {paper_mu} |" + " – |" * 8)
    flagged = [(run_id, summaries[run_id]) for run_id in ids if summaries.get(run_id, {}).get("stalled")]
    if flagged:
        lines += ["", f"Seeds that stalled (train perplexity over {STALL_FACTOR:g}x the median of every trained run "
                      "in the table; included above):"]
        lines += [f"- ID {run_id}: {checkpoint} (train perplexity {ppl:.0f}, row mean {summary['ppl_train'][0]:.0f})"
                  for run_id, summary in flagged for checkpoint, ppl in summary["stalled"]]
    lines += ["", "Paper (Dufter & Schütze 2020), same columns:", "", HEADER, rule]
    for run_id in ids:
        if run_id in paper:
            cells = [_cell(column, paper[run_id][column]) for column in COLUMNS]
            lines.append(f"| {run_id} | {RUNS[run_id].description} | 5 | {cells[0]} | {cells[0]} | "
                         + " | ".join(cells[1:]) + " |")
    return "\n".join(lines) + "\n"


def load_run_results(runs_dir, name="eval.json"):
    """runs_dir/<ID>/seed<k>/eval.json (or `name`) -> {ID: [result, ...]} (IDs without results are absent)."""
    results = {}
    for path in sorted(Path(runs_dir).glob(f"*/seed*/{name}")):
        try:
            results.setdefault(path.parent.parent.name, []).append(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise XmlmError(f"{path}: not a valid eval JSON ({err})") from None
    return results


def summarise_runs(results_by_id, layers=("0", "8")):
    """{ID: `aggregate`} of the known run IDs, stalls counted against the median of all trained ones (`stall_ppl`;
    an untrained run has no training to stall)."""
    results_by_id = {run_id: results for run_id, results in results_by_id.items() if run_id in RUNS}
    threshold = stall_ppl(trained_results(results_by_id))
    return {run_id: aggregate(results, layers, math.inf if RUNS[run_id].untrained else threshold)
            for run_id, results in results_by_id.items()}


def write_tables(runs_dir, out_dir, layers=("0", "8"), ids=None):
    """Aggregate every run under runs_dir and write out_dir/table1.md and table2.md (and, from the runs'
    eval_indomain.json, table1_indomain.md: the same on the in-domain dev set); returns their paths.

    `ids` keeps only those rows (a table without any of them is not written).
    """
    dev, indomain = (summarise_runs(load_run_results(runs_dir, evaluation), layers)
                     for evaluation in ("eval.json", "eval_indomain.json"))
    paths = []
    for name, table_ids, paper, title, summaries in (
        ("table1.md", TABLE1_IDS, PAPER_TABLE1, "Table 1: multilinguality and model fit", dev),
        ("table2.md", TABLE2_IDS, PAPER_TABLE2, "Table 2: parallel vs. non-parallel training corpus", dev),
        ("table1_indomain.md", TABLE1_IDS, PAPER_TABLE1, "Table 1 on in-domain dev sentences (BBE Old Testament; "
         "the paper's on its own dev set)", indomain),
    ):
        if name == "table1_indomain.md" and not indomain:  # no run evaluated in-domain (--indomain-dev)
            continue
        rows = [run_id for run_id in table_ids if ids is None or run_id in ids]
        if not rows:
            continue
        path = Path(out_dir) / name
        write_atomic(path, markdown_table(rows, summaries, paper, title))
        paths.append(path)
    return paths


def trained_updates(runs_dir):
    """The updates of the first trained seed of run ID 0 (of any run without one): its log's last `train` record's
    train_num_updates; 0 without a training log."""
    from fairseq_xmlm.experiments.dufter.figures import read_fairseq_log

    logs = sorted(Path(runs_dir).glob("0/seed*/train.log")) or sorted(Path(runs_dir).glob("*/seed*/train.log"))
    for path in logs:
        records = read_fairseq_log(path, "train")
        if records:
            return int(records[-1]["train_num_updates"])
    return 0


def table_json(runs_dir, setting, ids=None):
    """Tables 1 and 2 as docs/results/dufter_table1.json holds them: {"setting", "updates", "seeds", "rows": {ID:
    {"mu", "mu_std" (None for one seed), "n", "layers": {"0"|"8": {"align_f1", "retrieval", "translation"}},
    "ppl_train", "ppl_dev", "stalled" (how many of the n seeds stalled, `stall_ppl`)}}}, means over the seeds
    present, rows in RUNS' order (only `ids`, if given)."""
    summaries = summarise_runs(load_run_results(runs_dir))
    rows = {}
    for run_id in RUNS:
        if run_id not in summaries or (ids is not None and run_id not in ids):
            continue
        summary = summaries[run_id]
        mean = {column: value[0] for column, value in summary.items() if column in COLUMNS}
        rows[run_id] = {
            "mu": mean["mu"], "mu_std": summary["mu"][1], "n": summary["n"],
            "layers": {layer: {"align_f1": mean[f"f1_{end}"], "retrieval": mean[f"rho_{end}"],
                               "translation": mean[f"tau_{end}"]} for layer, end in (("0", "lo"), ("8", "hi"))},
            "ppl_train": mean["ppl_train"], "ppl_dev": mean["ppl_dev"], "stalled": len(summary["stalled"])}
    seeds = sorted({int(path.parent.name[len("seed"):]) for path in Path(runs_dir).glob("*/seed*/eval.json")
                    if path.parent.parent.name in rows})
    return {"setting": setting, "updates": trained_updates(runs_dir), "seeds": seeds, "rows": rows}


def write_figures(runs_dir, out_dir, data):
    """Fig. 4 (ID 0), Fig. 5/8 (IDs 1 and 9), Fig. 6/7 (IDs 0, 15, 30) from whichever runs exist."""
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.evaluation.scores import word_vectors
    from fairseq_xmlm.experiments.dufter import figures

    def first_checkpoint(run_id):
        found = sorted((runs_dir / run_id).glob("seed*/checkpoints/checkpoint_last.pt"))
        return found[0] if found else None

    if checkpoint := first_checkpoint("0"):
        model, task, _ = load_checkpoint(checkpoint, data=str(data))
        words, vectors = word_vectors(model, task, layers=(0,))
        english, fake = vectors[0]
        figures.plot_token_pca(english, fake, [task.dictionary[w] for w in words], out_dir / "fig4_token_pca.png")
    panels = {}
    for run_id in ("1", "9"):
        if checkpoint := first_checkpoint(run_id):
            model, _, _ = load_checkpoint(checkpoint, data=str(data))
            panels[f"{run_id}: {RUNS[run_id].description}"] = figures.position_similarity(
                [table.weight for table in model.position_embeddings])
    if panels:
        figures.plot_position_similarity(panels, out_dir / "fig5_position_similarity.png")
    curves = {f"{run_id}: {RUNS[run_id].description}": sorted((runs_dir / run_id).glob("seed*/train.log"))
              for run_id in CURVE_IDS}
    curves = {label: logs for label, logs in curves.items() if logs}
    if curves:
        figures.plot_training_curves(curves, out_dir / "fig6_7_training_curves.png")


def write_report(runs_dir, results, data, ids, setting=None):
    """Tables 1 and 2 (printed as well), with a `setting` (a line naming the training) dufter_table1.json
    (`table_json`), and the figures, from the results present under runs_dir."""
    for path in write_tables(runs_dir, results, ids=ids):
        log(f"wrote {path}")
        print(path.read_text())
    if setting is not None and (table := table_json(runs_dir, setting, ids))["rows"]:
        log(f"wrote {write_json(Path(results) / 'dufter_table1.json', table)}")
    if importlib.util.find_spec("matplotlib") is None:  # e.g. a GPU machine with the training stack only
        log("figures skipped: matplotlib is not installed here; `python -m fairseq_xmlm.experiments.dufter "
            "--report` draws them where it is")
        return
    write_figures(runs_dir, results, data)
