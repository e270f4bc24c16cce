"""Conneau et al. 2020, Table 1 and Figure 3 on the Bible: prepare, train side by side, evaluate, report.

    python -m fairseq_xmlm.experiments.conneau bible --pairs en-fr,en-ru,en-zh --rows all --seeds 1,2
    python -m fairseq_xmlm.experiments.conneau --report        # only the table and figures, from the results present
    python -m fairseq_xmlm.experiments.conneau --status        # per pair and row: seeds evaluated / trained
    python -m fairseq_xmlm.experiments.conneau evaluate --checkpoint CK.pt --out R.json [--dict D]

Rerun the same command after an interruption: prepared data, evaluated runs and finished training are kept,
interrupted training resumes. The training text may be any verse-aligned pair of files (`--corpus-dir DIR` with
DIR/<l1>.txt, DIR/<l2>.txt and verses.tsv), which is how the Wiki-CC domain row is run on corpora from elsewhere.
"""
import json
import os
import sys
from pathlib import Path

from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.experiments.commands import parse_choices, parse_seeds, updates_of
from fairseq_xmlm.experiments.conneau import recipe, report
from fairseq_xmlm.experiments.conneau.runs import PRESETS, SETTINGS
from fairseq_xmlm.io import log, write_json

# The genre benchmark's fine-tuning per preset: a sample of the English training verses, a few epochs (an epoch
# is one pass over that sample); the CPU presets keep it short.
GENRE_OPTIONS = {
    "tiny": {"max_train": 60, "epochs": 1, "batch_size": 16},
    "quick": {"max_train": 2000, "epochs": 2, "batch_size": 32},
    "bible": {"max_train": 8000, "epochs": 3, "batch_size": 32},
    "paper": {"max_train": 8000, "epochs": 3, "batch_size": 32},
}


def evaluate_main(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.conneau evaluate",
                            description="Evaluate one trained run (retrieval, translation, alignment, "
                                        "genre, English dev perplexity, training curve).")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, help="result JSON to write")
    parser.add_argument("--row", default=None, help="the row of Table 1 (recorded in the result)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dict", default=None, help="MUSE dictionary of the pair (translation and alignment)")
    parser.add_argument("--no-dict", action="store_true", help="ignore --dict: no translation, no alignment")
    parser.add_argument("--genre-options", default="{}", help="JSON: FinetuneConfig fields and max_train")
    parser.add_argument("--no-genre", action="store_true")
    parser.add_argument("--no-curve", action="store_true")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    from fairseq_xmlm.experiments.conneau.evaluate import evaluate_run

    try:
        genre_options = json.loads(args.genre_options)
    except json.JSONDecodeError as err:
        raise XmlmError(f"--genre-options is not JSON: {err}") from None
    dictionary = None if args.no_dict else args.dict
    result = evaluate_run(args.checkpoint, dictionary, not args.no_genre, genre_options, args.device,
                          not args.no_curve)
    write_json(args.out, {"row": args.row, "seed": args.seed, **result})
    log(f"conneau: wrote {args.out}")


def status(pairs, rows, seeds, checkpoint_root, results_root):
    for pair in pairs:
        for row in rows:
            runs = [recipe.Run(pair, row, seed) for seed in seeds]
            done = sum(run.result_path(results_root).is_file() for run in runs)
            trained = sum((run.save_dir(checkpoint_root) / "checkpoint_best.pt").is_file() for run in runs)
            print(f"{pair} {row}: {done}/{len(runs)} evaluated, {trained} with a checkpoint")


def main_run(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.conneau",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", "--pair", default="en-fr,en-ru,en-zh",
                        help="comma-separated pairs, English first (en-fr,en-ru,en-zh); en,fr is read as en-fr")
    parser.add_argument("--rows", "--settings", default="all", help="all, or comma-separated rows of Table 1")
    parser.add_argument("preset_name", nargs="?", choices=sorted(PRESETS), metavar="PRESET",
                        help=f"the same as --preset ({', '.join(PRESETS)})")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--slots", type=int, default=None,
                        help="runs trained side by side (default: the CPU count on a GPU machine, else 1)")
    parser.add_argument("--corpus-dir", default="data/bible", help="verse-aligned <lang>.txt + verses.tsv")
    parser.add_argument("--dict-dir", default="data/dicts", help="MUSE dictionaries <pair>.txt (en-fr.txt, ...)")
    parser.add_argument("--data-root", default="data-bin/conneau")
    parser.add_argument("--checkpoint-root", default="checkpoints/conneau")
    parser.add_argument("--results", default="results/conneau", help="per-run results, table and figures")
    parser.add_argument("--no-genre", action="store_true", help="leave out the zero-shot genre benchmark")
    parser.add_argument("--no-dictionary", action="store_true",
                        help="leave out word translation and contextual alignment (they need --dict-dir)")
    parser.add_argument("--train-args", default="", help="extra fairseq-train options, e.g. '--max-update 5000'")
    parser.add_argument("--prepare-only", action="store_true", help="only prepare the data the rows need")
    parser.add_argument("--report", action="store_true", help="only write the table and figures")
    parser.add_argument("--status", action="store_true", help="only list what is evaluated and trained")
    parser.add_argument("--compare", default=None, metavar="LABEL=DIR,...",
                        help="only plot the Default curves of several result trees (the first pair) into "
                             "--results/compare.png and .json")
    args = parser.parse_args(argv)
    args.preset = args.preset_name or args.preset
    pairs = recipe.parse_pairs(args.pairs)
    rows = parse_choices(args.rows, SETTINGS, "rows")
    seeds = parse_seeds(args.seeds) if args.seeds else list(PRESETS[args.preset]["seeds"])
    train_extra = args.train_args.split()
    updates = updates_of(PRESETS[args.preset]["train"] + train_extra)
    if args.status:
        status(pairs, rows, seeds, args.checkpoint_root, args.results)
        return
    if args.compare:
        roots = dict(item.split("=", 1) for item in args.compare.split(",") if "=" in item)
        if not roots:
            raise XmlmError(f"--compare takes LABEL=DIR,..., got {args.compare!r}")
        report.compare_curves(roots, Path(args.results) / "compare.png", pairs[0])
        return
    if not args.report:
        recipe.fetch_inputs(pairs, args.corpus_dir, args.dict_dir, not args.no_dictionary)
        runs = recipe.runs_to_do(pairs, rows, seeds, args.results)
        recipe.prepare_data(runs, args.preset, args.corpus_dir, args.data_root, args.dict_dir)
        if args.prepare_only:
            return
        slots = args.slots or (min(len(runs), os.cpu_count() or 1) if has_gpu() else 1)
        options = ["--genre-options", json.dumps(GENRE_OPTIONS[args.preset])]
        options += ["--no-genre"] * args.no_genre
        options += ["--no-dict"] * args.no_dictionary
        recipe.train_and_evaluate(runs, args.preset, args.data_root, args.checkpoint_root, args.results,
                                  args.dict_dir, max(1, slots), Path(args.results) / "logs", train_extra, options)
    report.write_report(args.results, args.results, args.preset, updates, seeds)
    log(f"conneau: wrote {args.results}/table1.md, conneau_table1.json and the figures")


@cli_errors
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["evaluate"]:
        evaluate_main(argv[1:])
    else:
        main_run(argv)


if __name__ == "__main__":
    main()
