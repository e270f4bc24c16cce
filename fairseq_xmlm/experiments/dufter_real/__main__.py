"""Dufter & Schütze 2020, Table 3 on the Bible: English, German, Hindi; four settings x three seeds.

    python -m fairseq_xmlm.experiments.dufter_real gpu                 # the table on one GPU (seeds 1, 42, 100)
    python -m fairseq_xmlm.experiments.dufter_real tiny --seeds 1      # end to end on a CPU in about a minute
    python -m fairseq_xmlm.experiments.dufter_real --report            # only the table, from the results present
    python -m fairseq_xmlm.experiments.dufter_real evaluate --checkpoint CK.pt --out R.json

Rerun the same command after an interruption: the data, the neighbour tables, evaluated runs and finished training
are kept, interrupted training resumes. Writes RESULTS/dufter_table3.json, table3.md and curves.png.

knn-replace (30-base) takes its neighbours from `--knn-vectors`: fasttext (the paper's: fastText per language,
mapped into English space by the unsupervised mapping) or verse_ids (verse-ID Dice neighbours, which use the
Bible's verse alignment). Both tables are built; DATA.knn.json says how often the fastText neighbours hold the
verse-ID first neighbour, against chance.
"""
import os
import sys

from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.experiments.commands import parse_choices, parse_seeds, updates_of
from fairseq_xmlm.experiments.dufter_real import recipe, report
from fairseq_xmlm.experiments.dufter_real.runs import LANGS, PRESETS, settings
from fairseq_xmlm.io import log, write_json

# verse_ids: on the whole Bibles the mapped fastText neighbours of en/de/hi pieces are at chance (docs/results.md,
# Table 3), as the mapped fastText words of Table 4 were.
DEFAULT_KNN_VECTORS = "verse_ids"


def evaluate_main(argv):
    import json

    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter_real evaluate",
                            description="Evaluate one trained run (genre zero-shot, retrieval, curve).")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True, help="result JSON to write")
    parser.add_argument("--setting", default=None, help="the row of Table 3 (recorded in the result)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--genre-options", default="{}", help="JSON: FinetuneConfig fields and max_train")
    parser.add_argument("--device", default=None)
    args = parser.parse_args(argv)
    from fairseq_xmlm.experiments.dufter_real.evaluate import evaluate_run

    try:
        options = json.loads(args.genre_options)
    except json.JSONDecodeError as err:
        raise XmlmError(f"--genre-options is not JSON: {err}") from None
    result = evaluate_run(args.checkpoint, options, args.device)
    write_json(args.out, {"setting": args.setting, "seed": args.seed, **result})
    log(f"dufter table 3: wrote {args.out}")


def main_run(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter_real",
                            description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", choices=sorted(PRESETS), default="gpu")
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default: the preset's)")
    parser.add_argument("--settings", default="all", help="all, or comma-separated IDs (0-base,3-base,...)")
    parser.add_argument("--langs", default=",".join(LANGS), help="the fine-tuning language first; inv-order "
                        "reverses the second")
    parser.add_argument("--knn-vectors", choices=recipe.KNN_VECTORS, default=DEFAULT_KNN_VECTORS,
                        help="where knn-replace's neighbours come from")
    parser.add_argument("--slots", type=int, default=None,
                        help="runs trained side by side (default: every run on a GPU machine, else 1)")
    parser.add_argument("--corpus-dir", default="data/bible", help="the Bibles: <lang>.txt and verses.tsv")
    parser.add_argument("--data-dir", default="data-bin/dufter_table3")
    parser.add_argument("--checkpoint-root", default="checkpoints/dufter_table3")
    parser.add_argument("--results", default="results/dufter_table3", help="per-run results, table and figure")
    parser.add_argument("--train-args", default="", help="extra fairseq-train options, e.g. '--max-update 3000'")
    parser.add_argument("--report", action="store_true", help="only write the table and figure")
    args = parser.parse_args(argv)
    langs = recipe.parse_langs(args.langs)
    names = parse_choices(args.settings, settings(langs), "settings")
    seeds = parse_seeds(args.seeds) if args.seeds else list(PRESETS[args.preset]["seeds"])
    train_extra = args.train_args.split()
    updates = updates_of(PRESETS[args.preset]["train"] + train_extra)
    if not args.report:
        runs = recipe.runs_to_do(names, seeds, args.results)
        recipe.prepare_data(args.corpus_dir, langs, args.preset, args.data_dir)
        if any(settings(langs)[run.setting].knn for run in runs):
            knn = recipe.build_knn_tables(args.data_dir, langs, args.preset)
            log(f"dufter table 3: knn-replace from {args.knn_vectors}; mapped fastText neighbours hold the "
                f"verse-ID first neighbour for {knn['fasttext_hits_verse_id_first']:.1%} of the symbols "
                f"(chance {knn['chance']:.1%})")
        slots = args.slots or (len(runs) if has_gpu() else 1)
        recipe.train_and_evaluate(runs, langs, args.preset, args.data_dir, args.checkpoint_root, args.results,
                                  max(1, min(slots, os.cpu_count() or 1)), args.knn_vectors, train_extra)
    labels = {name: setting.label for name, setting in settings(langs).items()}
    report.write_report(args.results, labels, args.preset, updates, seeds)
    log(f"dufter table 3: wrote {args.results}/dufter_table3.json, table3.md and curves.png")


@cli_errors
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["evaluate"]:
        evaluate_main(argv[1:])
    else:
        main_run(argv)


if __name__ == "__main__":
    main()
