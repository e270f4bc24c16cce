"""xmlm-genre: the Bible genre benchmark (zeroshot/bible_genre.py) for a list of checkpoints.

`xmlm-genre --checkpoints A.pt B.pt --langs fr,de --out results/genre.md` fine-tunes each checkpoint on English
(on the GPU when there is one: `--device`) and writes a table of zero-shot accuracies next to the majority-class
baseline (the most frequent genre of the English training verses), plus the same numbers as JSON
(`results/genre.json`), in percent like every zero-shot metric of `xmlm-zeroshot`.
"""
import json
import os
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.io import write_atomic
from fairseq_xmlm.zeroshot.bible_genre import GENRE_CONFIG, evaluate_checkpoint, results_table


@cli_errors
def main(argv=None):
    from fairseq_xmlm.devices import default_device
    from fairseq_xmlm.zeroshot.finetune import SCHEDULES, FinetuneConfig

    parser = ArgumentParser(prog="xmlm-genre", description="Bible genre classification: fine-tune on "
                            "English, evaluate zero-shot on held-out books in other languages.")
    parser.add_argument("--checkpoints", nargs="+", required=True, help="pretraining checkpoints (.pt)")
    parser.add_argument("--langs", required=True, help="comma-separated target languages, e.g. fr,de,ru,zh,hi")
    parser.add_argument("--out", required=True, help="markdown table to write (a .json with the same stem too)")
    parser.add_argument("--data", default=None, help="data-bin directory (default: the checkpoint's own)")
    parser.add_argument("--source", default="en", help="fine-tuning language")
    parser.add_argument("--max-train", type=int, default=None, help="fine-tune on a random sample of this many")
    parser.add_argument("--batch-size", type=int, default=GENRE_CONFIG["batch_size"])
    parser.add_argument("--encoder-lr", type=float, default=GENRE_CONFIG["encoder_lr"])
    parser.add_argument("--head-lr", type=float, default=GENRE_CONFIG["head_lr"])
    parser.add_argument("--epochs", type=int, default=GENRE_CONFIG["epochs"],
                        help="passes over the English training verses (the dev books are scored after each)")
    parser.add_argument("--schedule", choices=SCHEDULES, default=GENRE_CONFIG["schedule"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default=default_device(), help="cuda or cpu (default: cuda when available)")
    args = parser.parse_args(argv)
    langs = [lang for lang in args.langs.split(",") if lang]
    config = FinetuneConfig(batch_size=args.batch_size, encoder_lr=args.encoder_lr, head_lr=args.head_lr,
                            epochs=args.epochs, schedule=args.schedule, seed=args.seed)
    # every input checked before the first checkpoint's minutes of fine-tuning
    if not langs:
        raise XmlmError("--langs names no language (e.g. --langs fr,de)")
    missing = [path for path in args.checkpoints if not os.path.isfile(path)]
    if missing:
        raise XmlmError(f"checkpoint not found: {', '.join(missing)}")
    if args.data is not None and not os.path.isdir(args.data):
        raise XmlmError(f"data directory {args.data} does not exist")
    results = {}
    for path in args.checkpoints:
        results[path] = evaluate_checkpoint(path, langs, config, args.source, args.max_train, args.data,
                                            args.device)
    table = results_table(results, langs, args.source)
    write_atomic(Path(args.out).with_suffix(".json"), json.dumps(results, indent=2) + "\n")
    write_atomic(args.out, table)
    print(table)
