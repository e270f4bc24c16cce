"""Dufter & Schuetze 2020, Tables 1 and 2: the runs (ID -> flags), the paper's numbers, and the markdown writer.

Each run writes one `xmlm-eval-mult` JSON per seed; `aggregate` turns a run's JSONs into mean and std per column
and `markdown_table` lays them out as the paper does (mu, layer-0 F1/rho/tau, layer-8 F1/rho/tau, train/dev
perplexity), with the paper's mu beside ours.
"""
import json
import math
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from fairseq_xmlm.errors import XmlmError


@dataclass(frozen=True)
class Run:
    description: str
    flags: tuple = ()  # fairseq-train flags on top of the common ones
    untrained: bool = False  # evaluate an update-0 checkpoint
    epoch_factor: int = 1  # no-parallel sees each sentence in one language only: twice the epochs
    needs_knn: bool = False  # needs the neighbour table of xmlm-build-knn


OVERPARAM = ("--arch", "xmlm_bert_base", "--lr", "1e-4")
RUNS = {
    "0": Run("original"),
    "1": Run("lang-pos", ("--lang-pos",)),
    "2": Run("shift-special", ("--shift-special",)),
    "4": Run("no-random", ("--no-random",)),
    "5": Run("lang-pos;shift-special", ("--lang-pos", "--shift-special")),
    "6": Run("lang-pos;no-random", ("--lang-pos", "--no-random")),
    "7": Run("shift-special;no-random", ("--shift-special", "--no-random")),
    "8": Run("lang-pos;shift-special;no-random", ("--lang-pos", "--shift-special", "--no-random")),
    "15": Run("overparam", OVERPARAM),
    "16": Run("lang-pos;overparam", ("--lang-pos",) + OVERPARAM),
    "17": Run("lang-pos;shift-special;no-random;overparam", ("--lang-pos", "--shift-special", "--no-random") + OVERPARAM),
    "3": Run("inv-order", ("--inv-order",)),
    "9": Run("lang-pos;inv-order;shift-special;no-random",
             ("--lang-pos", "--inv-order", "--shift-special", "--no-random")),
    "18": Run("untrained", untrained=True),
    "19": Run("untrained;lang-pos", ("--lang-pos",), untrained=True),
    "30": Run("knn-replace", needs_knn=True),
    "21": Run("no-parallel", ("--no-parallel",), epoch_factor=2),
    "21b": Run("lang-pos;no-parallel", ("--lang-pos", "--no-parallel"), epoch_factor=2),
}
TABLE1_IDS = ("0", "1", "2", "4", "5", "6", "7", "8", "15", "16", "17", "3", "9", "18", "19", "30")
TABLE2_IDS = ("0", "21", "21b")

# the table's numeric columns, in the paper's order ("lo"/"hi": the two layers shown, 0 and 8 by default)
COLUMNS = ("mu", "f1_lo", "rho_lo", "tau_lo", "f1_hi", "rho_hi", "tau_hi", "ppl_train", "ppl_dev")

# The paper's numbers: Table 1 as (mean, std) per column; Table 2 gives means only.
_PAPER_TABLE1 = """
0 .70 1.00 .00 .16 .02 .88 .02 1.00 .00 .97 .01 .79 .03 9 0.2 217 7.8
1 .30 .87 .05 .33 .13 .40 .09 .89 .05 .39 .15 .09 .05 9 0.1 216 9.0
2 .66 1.00 .00 .15 .02 .88 .01 1.00 .00 .97 .02 .63 .13 9 0.1 227 17.9
4 .68 1.00 .00 .19 .03 .87 .02 1.00 .00 .85 .07 .82 .04 9 0.6 273 7.7
5 .20 .62 .19 .22 .19 .27 .20 .72 .22 .27 .21 .05 .04 10 0.5 205 7.6
6 .30 .91 .04 .29 .10 .36 .12 .89 .05 .32 .15 .25 .12 10 0.4 271 8.6
7 .68 1.00 .00 .21 .03 .85 .01 1.00 .00 .89 .06 .79 .04 8 0.3 259 15.6
8 .12 .46 .26 .09 .09 .18 .22 .54 .31 .11 .11 .11 .13 10 0.6 254 15.9
15 .58 1.00 .00 .27 .03 .63 .05 1.00 .00 .97 .01 .47 .06 2 0.1 261 4.5
16 .01 .25 .10 .01 .00 .01 .00 .37 .13 .01 .00 .00 .00 3 0.0 254 4.9
17 .00 .05 .02 .00 .00 .00 .00 .05 .04 .00 .00 .00 .00 1 0.0 307 7.7
3 .01 .02 .00 .00 .00 .01 .00 .02 .00 .01 .01 .00 .00 11 0.3 209 14.4
9 .00 .04 .01 .00 .00 .00 .00 .03 .01 .00 .00 .00 .00 10 0.4 270 20.1
18 .00 .97 .01 .00 .00 .00 .00 .96 .01 .00 .00 .00 .00 3484 44.1 4128 42.7
19 .00 .02 .00 .00 .00 .00 .00 .02 .00 .00 .00 .00 .00 3488 41.4 4133 50.3
30 .74 1.00 .00 .31 .08 .88 .00 1.00 .00 .97 .01 .81 .01 11 0.3 225 12.4
"""
_PAPER_TABLE2 = """
0 .70 1.00 .16 .88 1.00 .97 .79 9 217
21 .25 .98 .06 .28 .98 .50 .15 14 383
21b .07 .60 .10 .07 .73 .11 .02 16 456
"""


def _parse_paper_table1(text):
    table = {}
    for line in text.strip().splitlines():
        run_id, mu, *rest = line.split()
        values = [float(v) for v in rest]
        table[run_id] = {"mu": (float(mu), None)} | {
            column: (values[2 * k], values[2 * k + 1]) for k, column in enumerate(COLUMNS[1:])}
    return table


def _parse_paper_table2(text):
    table = {}
    for line in text.strip().splitlines():
        run_id, *values = line.split()
        table[run_id] = {column: (float(v), None) for column, v in zip(COLUMNS, values)}
    return table


PAPER_TABLE1 = _parse_paper_table1(_PAPER_TABLE1)
PAPER_TABLE2 = _parse_paper_table2(_PAPER_TABLE2)


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


def did_not_learn(results, factor=10.0):
    """The results (of one row's seeds, at least 3) whose training perplexity is over `factor` x the row's median:
    a seed whose training diverged or never took off. They stay in the mean; the table names them."""
    if len(results) < 3:
        return []
    median = statistics.median(r["ppl"]["train"] for r in results)
    return [r for r in results if r["ppl"]["train"] > factor * median]


def aggregate(results, layers=("0", "8")):
    """A run's eval JSONs (one per seed) -> {column: (mean, std)}, "n": number of seeds, "did_not_learn": the
    checkpoints and train perplexities of seeds far worse than the others (`did_not_learn`)."""
    rows = [result_columns(r, layers) for r in results]
    summary = {column: mean_std([row[column] for row in rows]) for column in COLUMNS}
    summary["n"] = len(rows)
    summary["did_not_learn"] = [(r["checkpoint"], r["ppl"]["train"]) for r in did_not_learn(results)]
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
    flagged = [(run_id, summaries[run_id]) for run_id in ids if summaries.get(run_id, {}).get("did_not_learn")]
    if flagged:
        lines += ["", "Seeds that did not learn (train perplexity over 10x the median of their row; included above):"]
        lines += [f"- ID {run_id}: {checkpoint} (train perplexity {ppl:.0f}, row mean {summary['ppl_train'][0]:.0f})"
                  for run_id, summary in flagged for checkpoint, ppl in summary["did_not_learn"]]
    lines += ["", "Paper (Dufter & Schütze 2020), same columns:", "", HEADER, rule]
    for run_id in ids:
        if run_id in paper:
            cells = [_cell(column, paper[run_id][column]) for column in COLUMNS]
            lines.append(f"| {run_id} | {RUNS[run_id].description} | 5 | {cells[0]} | {cells[0]} | "
                         + " | ".join(cells[1:]) + " |")
    return "\n".join(lines) + "\n"


def load_run_results(runs_dir):
    """runs_dir/<ID>/seed<k>/eval.json -> {ID: [result, ...]} (IDs without results are absent)."""
    results = {}
    for path in sorted(Path(runs_dir).glob("*/seed*/eval.json")):
        try:
            results.setdefault(path.parent.parent.name, []).append(json.loads(path.read_text()))
        except json.JSONDecodeError as err:
            raise XmlmError(f"{path}: not a valid eval JSON ({err})") from None
    return results


def write_atomic(path, text):
    """Write via a temp file in the same folder and rename, so no half-written file is ever seen."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would hide results from the rest of a group
    with os.fdopen(handle, "w") as out:
        out.write(text)
    os.replace(tmp, path)


def write_tables(runs_dir, out_dir, layers=("0", "8"), ids=None):
    """Aggregate every run under runs_dir and write out_dir/table1.md and table2.md; returns their paths.

    `ids` keeps only those rows (a table without any of them is not written).
    """
    summaries = {run_id: aggregate(results, layers) for run_id, results in load_run_results(runs_dir).items()
                 if run_id in RUNS}
    paths = []
    for name, table_ids, paper, title in (
        ("table1.md", TABLE1_IDS, PAPER_TABLE1, "Table 1: multilinguality and model fit"),
        ("table2.md", TABLE2_IDS, PAPER_TABLE2, "Table 2: parallel vs. non-parallel training corpus"),
    ):
        rows = [run_id for run_id in table_ids if ids is None or run_id in ids]
        if not rows:
            continue
        path = Path(out_dir) / name
        write_atomic(path, markdown_table(rows, summaries, paper, title))
        paths.append(path)
    return paths
