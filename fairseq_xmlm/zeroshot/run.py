"""Zero-shot cross-lingual transfer on XNLI, NER and dependency parsing (Conneau et al. 2020, section 3.2).

    python -m fairseq_xmlm.zeroshot.run xnli --checkpoint CK.pt --train-file multinli.train.en.tsv \
        --dev-file xnli.dev.tsv --test-file fr=xnli.test.tsv --test-file de=xnli.test.tsv --out results/xnli.json
    python -m fairseq_xmlm.zeroshot.run ner   ... --train-file en/train --dev-file en/dev --test-file fr=fr/test
    python -m fairseq_xmlm.zeroshot.run parse ... --train-file en_ewt-ud-train.conllu ... --test-file fr=fr.conllu

`xmlm-zeroshot`: fine-tune on the English (`--source`) training file, evaluate every test file zero-shot, write
the result JSON (the benchmark itself: `zeroshot/benchmark.py`). XNLI files with a `language` column (the XNLI
dev/test release) are filtered to the file's language; WikiAnn words written `fr:Paris` lose their `<lang>:`
prefix. Fine-tuning runs on the GPU when there is one (`--device`). An epoch is `--epoch-size` training examples
or one pass, whichever is smaller: XNLI's 200 epochs are the paper's (its XLM code's) epochs of 20,000 examples;
NER and parsing epochs are passes.
"""

from fairseq_xmlm.devices import default_device
from fairseq_xmlm.errors import ArgumentParser, cli_errors
from fairseq_xmlm.io import write_json
from fairseq_xmlm.zeroshot.benchmark import DEFAULT_CONFIG, TASKS, benchmark_from_args
from fairseq_xmlm.zeroshot.finetune import SCHEDULES, FinetuneConfig


def add_benchmark_arguments(parser):
    """The benchmark's data arguments (read by benchmark_from_args)."""
    parser.add_argument("--checkpoint", required=True, help="pretraining checkpoint (.pt)")
    parser.add_argument("--train-file", required=True, help="English training file")
    parser.add_argument("--dev-file", required=True, help="English dev file (model selection)")
    parser.add_argument("--test-file", action="append", default=[], metavar="LANG=FILE",
                        help="a zero-shot test file and its language (repeatable)")
    parser.add_argument("--source", default="en", help="fine-tuning language")
    parser.add_argument("--data", default=None, help="pretraining data-bin (default: the checkpoint's own)")
    parser.add_argument("--max-train", type=int, default=None, help="fine-tune on a random sample of this many")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default=default_device(), help="cuda or cpu (default: cuda when available)")


@cli_errors
def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.zeroshot.run",
                            description="Fine-tune on English, evaluate zero-shot (XNLI, NER, parsing).")
    parser.add_argument("task", choices=TASKS)
    add_benchmark_arguments(parser)
    parser.add_argument("--out", required=True, help="result JSON to write")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float, help="encoder and head learning rate (NER / parsing)")
    parser.add_argument("--encoder-lr", type=float)
    parser.add_argument("--head-lr", type=float)
    parser.add_argument("--epochs", type=int, help="XNLI: 200 as in the paper; NER / parsing: 10 (after each, "
                        "the English dev set selects)")
    parser.add_argument("--epoch-size", type=int, help="training examples per epoch, at most one pass (XNLI: "
                        "20000, XLM's epoch as the paper ran it; NER / parsing: one pass)")
    parser.add_argument("--schedule", choices=SCHEDULES)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args(argv)
    settings = dict(DEFAULT_CONFIG[args.task])
    if args.lr is not None:
        settings.update(encoder_lr=args.lr, head_lr=args.lr)
    for name in ("batch_size", "encoder_lr", "head_lr", "epochs", "schedule", "epoch_size"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    config = FinetuneConfig(**settings, dropout=args.dropout, seed=args.seed)
    result = benchmark_from_args(args.task, args).run(config)
    write_json(args.out, result, indent=2)
    metric = result["metric"]
    print(f"{args.task} {metric}: {args.source} dev {result['dev'][args.source]:.2f}; " + ", ".join(
        f"{lang} test {scores[metric]:.2f}" for lang, scores in result["test"].items()))


if __name__ == "__main__":
    main()
