"""xmlm-build-knn: the cross-lingual neighbour table of Dufter & Schuetze's knn-replace masking.

How the table is built and its format: the library, analysis/knn_builder.py.
"""

from fairseq_xmlm.analysis.knn_builder import build_multilingual_table, build_table, is_fake_english_data, save_table
from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.io import log


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="xmlm-build-knn", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="data-bin directory written by xmlm-prepare")
    parser.add_argument("--langs", default="en",
                        help="two or more languages a,b[,c...]; Fake-English: the one real language")
    parser.add_argument("--k", type=int, default=5, help="neighbours per symbol")
    parser.add_argument("--out", required=True, help="table file (.pt)")
    parser.add_argument("--fake-english", action="store_true",
                        help="English + Fake-English (default when meta.json says task fake_english)")
    parser.add_argument("--inv-order", action="store_true", help="Fake-English sentences reversed")
    parser.add_argument("--vectors", choices=("fasttext", "verse_ids"), default="fasttext",
                        help="real languages: mapped fastText (the paper) or verse-ID Dice neighbours (parallel "
                             "items; one table over all --langs, K per other language)")
    parser.add_argument("--dim", type=int, default=300, help="fastText dimensions")
    parser.add_argument("--epochs", type=int, default=20,
                        help="fastText epochs (5, fastText's default, gives poorly aligned spaces on the Bible)")
    parser.add_argument("--threads", type=int, default=2, help="fastText threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--method", choices=("csls", "nn"), default="csls", help="neighbour retrieval")
    parser.add_argument("--init-vocab", type=int, default=4000, help="most frequent symbols for the VecMap init")
    parser.add_argument("--vocab-cutoff", type=int, default=20000, help="most frequent symbols for self-learning")
    parser.add_argument("--patience", type=int, default=50,
                        help="self-learning iterations without improvement before the keep probability grows")
    args = parser.parse_args(argv)
    langs = [lang for lang in args.langs.split(",") if lang]
    fake_english = args.fake_english or is_fake_english_data(args.data)
    if fake_english and len(langs) != 1:
        raise XmlmError(f"--fake-english takes one real language in --langs, got {args.langs!r}")
    if not fake_english and (len(langs) < 2 or len(set(langs)) != len(langs)):
        raise XmlmError(f"--langs needs two or more distinct languages (a,b[,c...]), got {args.langs!r}")
    if args.k < 1 or args.dim < 1 or args.epochs < 1:
        raise XmlmError("--k, --dim and --epochs must be positive")
    mapping = dict(init_vocab=args.init_vocab, vocab_cutoff=args.vocab_cutoff, patience=args.patience)
    if fake_english and args.vectors != "fasttext":
        raise XmlmError("Fake-English neighbours come from fastText: leave out --vectors")
    if len(langs) > 2 or args.vectors == "verse_ids":
        table = build_multilingual_table(args.data, langs, args.k, args.vectors, args.dim, args.epochs, args.seed,
                                         args.threads, args.method, **mapping)
    else:
        table = build_table(args.data, langs, args.k, fake_english, args.inv_order, args.dim, args.epochs,
                            args.seed, args.threads, args.method, **mapping)
    save_table(table, args.out)
    covered = int((table["neighbours"][:, 0] >= 0).sum())
    log(f"wrote {args.out}: {covered} of {table['dict_size']} symbols have {table['k']} neighbours")


if __name__ == "__main__":
    main()
