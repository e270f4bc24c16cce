"""The Bible genre benchmark (zero-shot cross-lingual transfer, offline) for pretrained checkpoints.

    python -m fairseq_xmlm.experiments.genre CHECKPOINT.pt [CHECKPOINT.pt ...] [--langs fr,de,ru,zh,hi]

Fine-tunes each checkpoint on English verses of the training books and tests on held-out books in the other
languages (xmlm-genre, one table for all checkpoints: results/genre.md); then, for the first checkpoint, Conneau et
al.'s selection: a grid of fine-tuning settings, the best two on English dev averaged (fairseq_xmlm.zeroshot.sweep:
results/genre_sweep.md).
"""
import sys
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, cli_errors
from fairseq_xmlm.experiments.commands import python_module, run_command


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.genre",
                            description=__doc__.split("\n")[0])
    parser.add_argument("checkpoints", nargs="+", metavar="CHECKPOINT.pt")
    parser.add_argument("--langs", default="fr,de,ru,zh,hi", help="comma-separated target languages")
    parser.add_argument("--epochs", type=int, default=3, help="fine-tuning epochs")
    parser.add_argument("--grid", default="ner", help="the sweep's grid of settings (fairseq_xmlm.zeroshot.sweep)")
    parser.add_argument("--out", default="results/genre.md", help="the table of every checkpoint")
    parser.add_argument("--sweep-out", default="results/genre_sweep.md", help="the first checkpoint's sweep")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    args = parser.parse_args(argv)
    genre = Path(sys.executable).parent / "xmlm-genre"  # the console script (its module has no __main__)
    run_command([genre, "--checkpoints", *args.checkpoints, "--langs", args.langs, "--out", args.out,
                 "--epochs", args.epochs], args.dry_run)
    run_command([*python_module("fairseq_xmlm.zeroshot.sweep"), "--checkpoint", args.checkpoints[0],
                 "--langs", args.langs, "--grid", args.grid, "--epochs", args.epochs, "--out", args.sweep_out],
                args.dry_run)


if __name__ == "__main__":
    main()
