"""Two Dufter tables side by side, against the paper: what a change of schedule or training did to each row.

    python -m fairseq_xmlm.experiments.dufter compare BEFORE.json AFTER.json [--names A,B] [--out FILE.md]
        [--plot FILE.png]

BEFORE and AFTER are `dufter_table1.json` files (the recipe's table, `report.table_json`), e.g.
docs/results/dufter_paper-code/ and docs/results/dufter_padding-specials/. For every run ID in both, in AFTER's
order: the paper's μ, each side's μ ± std over its seeds (with n where a row has fewer seeds than its table), the
stalled seeds, ρ and τ at layers 0 and 8 and the training perplexity, before → after; then, per side, which rows are
within MARGIN of the paper's μ. Printed on stdout, and with --out written to FILE.md as well; --plot draws each
row's μ on both sides beside the paper's (`figures.plot_comparison`).
"""
import json
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError
from fairseq_xmlm.experiments.dufter.figures import plot_comparison
from fairseq_xmlm.experiments.dufter.runs import PAPER_TABLE1, PAPER_TABLE2, RUNS
from fairseq_xmlm.io import write_atomic

PAPER = {**PAPER_TABLE1, **PAPER_TABLE2}
MARGIN = 0.10  # the fidelity goal: every row's μ within .10 of the paper's
PARTS = (("0", "retrieval", "L0 ρ"), ("0", "translation", "L0 τ"), ("8", "retrieval", "L8 ρ"),
         ("8", "translation", "L8 τ"))


def read_table(path):
    """{"setting", "rows": {ID: row}} of a dufter_table1.json, checked to be one: every row has μ, its layers' ρ and
    τ at 0 and 8, and the training perplexity."""
    path = Path(path)
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise XmlmError(f"{path} not found: the Dufter recipe writes RESULTS/dufter_table1.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise XmlmError(f"{path} is not a dufter_table1.json ({err})") from None
    rows = table.get("rows") if isinstance(table, dict) else None
    if not isinstance(rows, dict) or not rows or not all(_is_row(run_id, row) for run_id, row in rows.items()):
        raise XmlmError(f"{path} is not a dufter_table1.json: expected {{\"rows\": {{ID: {{\"mu\", \"layers\": "
                        "{\"0\": {\"retrieval\", \"translation\"}, \"8\": ...}, \"ppl_train\"}}}} with the recipe's "
                        "run IDs")
    return table


def _is_row(run_id, row):
    try:
        return (run_id in RUNS and isinstance(row["mu"], (int, float)) and isinstance(row["ppl_train"], (int, float))
                and all(isinstance(row["layers"][layer][part], (int, float)) for layer, part, _ in PARTS))
    except (KeyError, TypeError):
        return False


def _decimal(value):
    """.64 for 0.64, as the paper prints it; 1.00 stays."""
    text = f"{value:.2f}"
    return text[1:] if text.startswith("0.") else text


def _seeds_note(table, run_id):
    """" (n=2)" where the row has fewer seeds than its table: a mean of 2 is not one of 5."""
    n = table["rows"][run_id].get("n")
    return f" (n={n})" if isinstance(n, int) and n < len(table.get("seeds") or ()) else ""


def _mu(table, run_id):
    row = table["rows"][run_id]
    std = row.get("mu_std")
    return _decimal(row["mu"]) + ("" if std is None else f" ± {_decimal(std)}") + _seeds_note(table, run_id)


def _stalled(row):
    return "–" if row.get("stalled") is None else str(row["stalled"])


def within(rows):
    """The run IDs of `rows` whose μ is within MARGIN of the paper's (IDs the paper has)."""
    return [run_id for run_id, row in rows.items()
            if run_id in PAPER and abs(row["mu"] - PAPER[run_id]["mu"][0]) <= MARGIN + 1e-9]


def shared_ids(before, after):
    """The run IDs of both tables, in AFTER's order."""
    shared = [run_id for run_id in after["rows"] if run_id in before["rows"]]
    if not shared:
        raise XmlmError("the two tables have no run ID in common")
    return shared


def markdown(before, after, names=("before", "after")):
    shared = shared_ids(before, after)
    header = (f"| run | μ paper | μ {names[0]} | μ {names[1]} | stalled | "
              + " | ".join(label for _, _, label in PARTS) + " | ppl train |")
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for run_id in shared:
        old, new = before["rows"][run_id], after["rows"][run_id]
        paper = _decimal(PAPER[run_id]["mu"][0]) if run_id in PAPER else "–"
        parts = [f"{_decimal(old['layers'][layer][part])} → {_decimal(new['layers'][layer][part])}"
                 for layer, part, _ in PARTS]
        lines.append(f"| {run_id} {RUNS[run_id].description} | {paper} | {_mu(before, run_id)} | "
                     f"{_mu(after, run_id)} | {_stalled(old)} → {_stalled(new)} | " + " | ".join(parts)
                     + f" | {old['ppl_train']:.0f} → {new['ppl_train']:.0f} |")
    lines.append("")
    for name, table in zip(names, (before, after)):
        rows = {run_id: table["rows"][run_id] for run_id in shared}
        close = within(rows)
        missed = [run_id for run_id in rows if run_id in PAPER and run_id not in close]
        lines.append(f"- {name}: {len(close)} of {sum(run_id in PAPER for run_id in rows)} rows within "
                     f"{MARGIN:.2f} of the paper's μ" + (f" (not: {', '.join(missed)})" if missed else "")
                     + f"; {table.get('setting', '?')}")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter compare",
                            description=__doc__.split("\n")[0])
    parser.add_argument("before", help="a dufter_table1.json")
    parser.add_argument("after", help="another dufter_table1.json")
    parser.add_argument("--names", default="before,after", help="the two columns' names, comma-separated")
    parser.add_argument("--out", help="also write the table to this markdown file")
    parser.add_argument("--plot", help="also draw the rows' μ against the paper's in this PNG file")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    names = args.names.split(",")
    if len(names) != 2 or not all(names):
        raise XmlmError(f"--names must be two names, comma-separated, got {args.names!r}")
    before, after = read_table(args.before), read_table(args.after)
    text = markdown(before, after, names)
    if args.out:
        write_atomic(Path(args.out), text)
    if args.plot:
        plot_comparison([(f"{run_id} {RUNS[run_id].description}{_seeds_note(after, run_id)}",
                          PAPER[run_id]["mu"][0] if run_id in PAPER else None, before["rows"][run_id],
                          after["rows"][run_id]) for run_id in shared_ids(before, after)], names, Path(args.plot))
    print(text, end="")
