"""Dufter & Schütze 2020, Table 4 on the Bible: word order against English and zero-shot transfer.

    python -m fairseq_xmlm.experiments.word_order --langs fr,de,ru,zh,hi --no-zero-shot --out DIR
    python -m fairseq_xmlm.experiments.word_order --langs all --genre-json results/genre.json --out DIR
    python -m fairseq_xmlm.experiments.word_order --langs fr,de,ru --train --preset tiny|gpu --out DIR

Writes DIR/table4.md, DIR/dufter_table4.json, DIR/table4.png and DIR/word_order.json (each language's details
and the settings). The zero-shot side is a multilingual model's genre accuracy per language: read from
xmlm-genre's JSON (--genre-json / --zero-shot FILE), or made with --train (one joint-BPE bilingual_mlm model over
English and every plain-language label of --langs, then xmlm-genre; in DIR/model/); a Bible without one (another
version of a language) keeps zero_shot null. Rerun the same command after an interruption: what is done is kept;
with every language's word order in DIR/word_order.json, no Bible is read again.

Word similarities (`alignments.py`): verse-ID vectors of the parallel Bible (default), or fastText vectors mapped
into English space by the unsupervised mapping (--vectors fasttext; runs.py says why it is not the default).
"""
import json

from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.experiments.word_order import recipe, report
from fairseq_xmlm.experiments.word_order.runs import ENGLISH, PRESETS, VERSION_OF, WORD_ORDER
from fairseq_xmlm.io import log


def parse_english(text):
    label, _, code = text.partition(":")
    if label.split("_")[0] != ENGLISH:
        raise XmlmError(f"--english is an English Bible (en, or LABEL:CODE such as en_web:4), got {text!r}")
    code = code or VERSION_OF.get(label)
    if code is None:
        raise XmlmError(f"--english {text!r}: give the version as LABEL:CODE (xmlm-fetch-bible --list)")
    return label, code


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.word_order",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--langs", required=True,
                        help="comma-separated languages (their default Bible) or LABEL:CODE (fr_darby:5); all: "
                             "every Bible that is not English")
    parser.add_argument("--out", required=True, help="directory of the table, JSON, figure and records")
    zero_shot = parser.add_mutually_exclusive_group(required=True)
    zero_shot.add_argument("--no-zero-shot", action="store_true", help="word order only")
    zero_shot.add_argument("--genre-json", "--zero-shot", dest="genre_json", metavar="FILE",
                           help="xmlm-genre's JSON of the multilingual model (languages it lacks stay empty)")
    zero_shot.add_argument("--train", action="store_true", help="train the multilingual model and evaluate it")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="gpu", help="the model --train trains")
    parser.add_argument("--model", default=None, help="the model's name in the table (default: its checkpoints)")
    parser.add_argument("--english", default=ENGLISH, help="the English Bible: en (BBE) or LABEL:CODE")
    parser.add_argument("--corpus-dir", default="data/bible", help="the Bibles: <label>.txt and verses.tsv")
    parser.add_argument("--vectors", choices=recipe.VECTORS, default=WORD_ORDER["vectors"],
                        help="word similarities: verse-ID Dice, or fastText mapped by the unsupervised mapping")
    parser.add_argument("--verses", type=int, default=WORD_ORDER["verses"], help="verses measured per language")
    parser.add_argument("--books", default="all", help="books of the vectors and verses (names, numbers, a-b)")
    parser.add_argument("--seed", type=int, default=WORD_ORDER["seed"], help="verse sample, fastText, mapping")
    parser.add_argument("--fasttext-dim", type=int, default=WORD_ORDER["fasttext_dim"])
    parser.add_argument("--fasttext-epochs", type=int, default=WORD_ORDER["fasttext_epochs"])
    parser.add_argument("--threads", type=int, default=1, help="fastText and mapping threads")
    parser.add_argument("--mapping", default="{}",
                        help=f"JSON: unsupervised_mapping options over {json.dumps(WORD_ORDER['mapping'])}")
    args = parser.parse_args(argv)
    english, english_version = parse_english(args.english)
    versions = recipe.parse_bibles(args.langs, english)
    try:
        mapping = json.loads(args.mapping)
    except json.JSONDecodeError as err:
        raise XmlmError(f"--mapping is not JSON: {err}") from None
    if not isinstance(mapping, dict):
        raise XmlmError(f"--mapping is a JSON object of unsupervised_mapping options, got {args.mapping!r}")
    mapping = {**WORD_ORDER["mapping"], **mapping}
    settings = recipe.word_order_settings(english, english_version, versions, args.vectors, args.verses, args.seed,
                                          args.books, args.fasttext_dim, args.fasttext_epochs, args.threads, mapping)
    genre_json = args.genre_json
    if args.train:
        if english != ENGLISH:
            raise XmlmError("--train uses the English Bible the genre benchmark fine-tunes on: leave out --english")
        genre_json = recipe.train_and_evaluate(args.corpus_dir, list(versions), f"{args.out}/model", args.preset,
                                               args.seed)
    zero_shot = recipe.read_genre_results(genre_json, list(versions)) if genre_json else None
    word_order = recipe.run_word_order(args.corpus_dir, args.out, settings)
    if zero_shot is None:
        model = args.model or "none (word order only)"
    else:
        model = args.model or (f"{args.preset} preset: joint-BPE bilingual_mlm over "
                               f"{','.join([ENGLISH, *recipe.trained_languages(versions)])}"
                               if args.train else ", ".join(zero_shot["checkpoints"]))
    summary = report.write_report(args.out, model, word_order, settings, zero_shot)
    log(f"word order: wrote {args.out}/table4.md, dufter_table4.json, table4.png"
        + (f"; Pearson r {summary['pearson']:.3f}" if summary.get("pearson") is not None else ""))


if __name__ == "__main__":
    main()
