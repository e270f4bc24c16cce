"""Conneau et al. 2020, Section 5 on the Bible: train monolingual MLMs and compare them layer by layer.

    python -m fairseq_xmlm.experiments.similarity [full|quick] [--dry-run] [--report]

`quick` (a CPU, minutes): BERT-small, 200 updates, 2000 sentences. `full` (a GPU): xmlm_conneau (8 layers, 768
dims). Writes results/analysis/<pair>/{word,sentence,cka}.{json,png} and results/analysis/summary.md; paths are
relative to the working directory (examples/analysis/run.sh runs it from the repository's root).
"""
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, cli_errors
from fairseq_xmlm.experiments.similarity import recipe, report


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.similarity",
                            description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", choices=sorted(recipe.PRESETS), default="full")
    parser.add_argument("--corpus-dir", default="data/bible", help="the fetched Bibles (<lang>.txt, verses.tsv)")
    parser.add_argument("--data", default="data-bin/bible_mono")
    parser.add_argument("--checkpoints", default="checkpoints/analysis")
    parser.add_argument("--results", default="results/analysis")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--report", action="store_true", help="only write summary.md from the results present")
    args = parser.parse_args(argv)
    results = Path(args.results)
    if not args.report:
        recipe.run_all(recipe.PRESETS[args.preset], Path(args.corpus_dir), Path(args.data), Path(args.checkpoints),
                       results, args.dry_run)
    if not args.dry_run:
        print(report.write_summary(results))


if __name__ == "__main__":
    main()
