"""xmlm-prepare: Bible text -> Moses tokens -> sentencepiece pieces -> fairseq binary data in data-bin/NAME/.

The subword modes, the Fake-English data and the splits are described in the library, data/preparation.py.
"""

from fairseq_xmlm.data.preparation import (CLAUSE_MIN_WORDS, DEFAULT_TEST_BOOKS, DEFAULT_VALID_BOOKS, MODES,
                                           prepare_fake_english, prepare_fake_english_clauses,
                                           prepare_fake_english_indomain, prepare_pair)
from fairseq_xmlm.errors import ArgumentParser, cli_errors


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="xmlm-prepare", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    pair = commands.add_parser("pair", help="two real languages for bilingual MLM (Conneau et al.)")
    pair.add_argument("--corpus-dir", required=True, help="directory of <lang>.txt + verses.tsv (xmlm-fetch-bible)")
    pair.add_argument("--langs", required=True, help="comma-separated languages, e.g. en,fr")
    pair.add_argument("--mode", choices=MODES, default="joint")
    pair.add_argument("--vocab-size", type=int, default=12000,
                      help="sentencepiece vocabulary size per model (joint: in total; separate/prefixed: per language)")
    pair.add_argument("--out", required=True, help="output directory, e.g. data-bin/bible_en_fr")
    pair.add_argument("--lowercase", action="store_true")
    pair.add_argument("--valid-books", default=DEFAULT_VALID_BOOKS, help="books (names, numbers, ranges a-b)")
    pair.add_argument("--test-books", default=DEFAULT_TEST_BOOKS)
    pair.add_argument("--train-books", default=None, help="default: every book not held out")
    pair.add_argument("--codeswitch-dict", default=None,
                      help="MUSE dictionary LANG1->LANG2 for code-switching the training text (extra anchors)")
    pair.add_argument("--codeswitch-prob", type=float, default=0.3, help="probability to replace a dictionary word")
    pair.add_argument("--codeswitch-max", type=float, default=0.15, help="most words replaced per 1000-line chunk")
    pair.add_argument("--seed", type=int, default=1)
    pair.add_argument("--spm-type", choices=("bpe", "unigram"), default="bpe")

    fake = commands.add_parser("fake-english", help="English data for Dufter & Schuetze's Fake-English")
    fake.add_argument("--bible-dir", required=True, help="directory with en.txt (BBE), en_kjv.txt (KJV), verses.tsv")
    fake.add_argument("--out", required=True)
    fake.add_argument("--vocab-size", type=int, default=2048)
    fake.add_argument("--train-file", default="en.txt")
    fake.add_argument("--valid-file", default="en_kjv.txt")
    fake.add_argument("--valid-size", type=int, default=10000)
    fake.add_argument("--lowercase", action="store_true")
    fake.add_argument("--spm-type", choices=("bpe", "unigram"), default="bpe")

    clauses = commands.add_parser("fake-english-clauses",
                                  help="a Fake-English data-bin with its training sentences cut into clauses")
    clauses.add_argument("--data", required=True, help="the fake-english data-bin to cut")
    clauses.add_argument("--out", required=True)
    clauses.add_argument("--min-words", type=int, default=CLAUSE_MIN_WORDS,
                         help="fewest words of a unit (a shorter tail joins the unit before it)")

    indomain = commands.add_parser("fake-english-indomain",
                                   help="a Fake-English data-bin whose dev set is BBE Old Testament sentences")
    indomain.add_argument("--data", required=True, help="the fake-english data-bin (its BPE and dictionary)")
    indomain.add_argument("--bible-dir", required=True, help="directory with en.txt (BBE) and verses.tsv")
    indomain.add_argument("--out", required=True)
    indomain.add_argument("--valid-size", type=int, default=10000)
    indomain.add_argument("--train-file", default="en.txt")

    args = parser.parse_args(argv)
    if args.command == "fake-english-clauses":
        prepare_fake_english_clauses(args.data, args.out, args.min_words)
    elif args.command == "fake-english-indomain":
        prepare_fake_english_indomain(args.data, args.bible_dir, args.out, args.valid_size, args.train_file)
    elif args.command == "pair":
        prepare_pair(args.corpus_dir, [lang for lang in args.langs.split(",") if lang], args.mode, args.vocab_size,
                     args.out, args.lowercase, args.valid_books, args.test_books, args.train_books,
                     args.codeswitch_dict, args.codeswitch_prob, args.codeswitch_max, args.seed, args.spm_type)
    else:
        prepare_fake_english(args.bible_dir, args.out, args.vocab_size, args.train_file, args.valid_file,
                             args.valid_size, args.lowercase, args.spm_type)


if __name__ == "__main__":
    main()
