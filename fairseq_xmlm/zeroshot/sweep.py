"""Hyper-parameter sweep in Conneau et al. 2020's protocol: run the grid, select on English dev, report the
average of the best two settings.

    python -m fairseq_xmlm.zeroshot.sweep --checkpoint A.pt --langs fr --grid xnli --out results/sweep.md
    python -m fairseq_xmlm.zeroshot.sweep --task ner --checkpoint A.pt --train-file en/train --dev-file en/dev \
        --test-file fr=fr/test --out results/ner_sweep.md

Runs a benchmark (`--task genre`, the default: the Bible genre benchmark; `xnli`, `ner`, `parse`: the task files,
see fairseq_xmlm.zeroshot.benchmark) once per grid setting (`--grid xnli`: batch {4, 8} x encoder lr {1.25e-6,
2.5e-6, 5e-6} x head lr {5e-6, 2.5e-5, 1.25e-4}, constant lr; `--grid ner`: batch {16, 32} x lr {2e-5, 3e-5, 5e-5}
for encoder and head, 10 % warm-up then linear decay; the default grid of xnli is xnli, of ner / parse ner) and
writes every run plus the selected average. The task files are read and encoded once for the whole grid. Fine-tuning
runs on the GPU when there is one (`--device`); an epoch is `--epoch-size` examples or one pass, whichever is
smaller (the paper's XNLI: 200 epochs of 20,000 examples; NER / parsing: 10 passes).
"""
import itertools
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.io import write_atomic, write_json

GRIDS = {
    # (batch size, encoder lr, head lr, schedule)
    "xnli": [(b, e, h, "constant") for b, e, h in itertools.product((4, 8), (1.25e-6, 2.5e-6, 5e-6),
                                                                        (5e-6, 2.5e-5, 1.25e-4))],
    "ner": [(b, lr, lr, "warmup_linear") for b, lr in itertools.product((16, 32), (2e-5, 3e-5, 5e-5))],
}


def average_of_best_two(runs, dev_key, test_keys):
    """runs: [{dev_key: score, test_key: score, ...}]; the two runs with the highest dev score (ties: first run
    wins), and the mean of their scores for every test key -> (selected runs, {test_key: mean})."""
    if len(runs) < 2:
        raise XmlmError(f"the average of the best two settings needs at least two runs, got {len(runs)}")
    selected = sorted(runs, key=lambda run: -run[dev_key])[:2]
    return selected, {key: sum(run[key] for run in selected) / 2 for key in test_keys}


def run_sweep(evaluate, grid, epochs, seed=1, epoch_size=None):
    """evaluate(FinetuneConfig) -> {"dev": score, "test": {lang: score}} once per grid setting
    -> (runs, the best two on dev, their average test scores)."""
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig

    if grid not in GRIDS:
        raise XmlmError(f"unknown grid {grid!r} (expected one of {', '.join(GRIDS)})")
    runs = []
    for batch_size, encoder_lr, head_lr, schedule in GRIDS[grid]:
        config = FinetuneConfig(batch_size=batch_size, encoder_lr=encoder_lr, head_lr=head_lr, epochs=epochs,
                                schedule=schedule, seed=seed, epoch_size=epoch_size)
        result = evaluate(config)
        runs.append({"batch_size": batch_size, "encoder_lr": encoder_lr, "head_lr": head_lr, "schedule": schedule,
                     "dev": result["dev"], **{f"test_{lang}": score for lang, score in result["test"].items()}})
    test_keys = [key for key in runs[0] if key.startswith("test_")]
    selected, averages = average_of_best_two(runs, "dev", test_keys)
    return runs, selected, averages


def genre_evaluator(checkpoint, langs, max_train=None, source="en", data=None, device=None):
    from fairseq_xmlm.zeroshot.bible_genre import evaluate_checkpoint

    def evaluate(config):
        result = evaluate_checkpoint(checkpoint, langs, config, source, max_train, data, device)
        return {"dev": result["dev"][source], "test": result["test"]}

    return evaluate


def task_evaluator(benchmark):
    """Primary metric (XNLI accuracy, NER F1, LAS) of a fairseq_xmlm.zeroshot.benchmark.Benchmark."""

    def evaluate(config):
        result = benchmark.run(config)
        return {"dev": result["dev"][benchmark.source],
                "test": {lang: scores[result["metric"]] for lang, scores in result["test"].items()}}

    return evaluate


def sweep_table(title, runs, selected, averages, source="en"):
    test_keys = list(averages)
    header = "| batch | encoder lr | head lr | schedule | " + f"{source} dev | " + " | ".join(
        key.removeprefix("test_") + " test" for key in test_keys) + " | selected |"
    rows = [header, "|---" * (6 + len(test_keys)) + "|"]
    for run in runs:
        mark = "yes" if any(run is chosen for chosen in selected) else ""
        rows.append(f"| {run['batch_size']} | {run['encoder_lr']:g} | {run['head_lr']:g} | {run['schedule']} | "
                    f"{run['dev']:.1f} | " + " | ".join(f"{run[key]:.1f}" for key in test_keys) + f" | {mark} |")
    summary = ", ".join(f"{key.removeprefix('test_')} {value:.1f}" for key, value in averages.items())
    return "\n".join([f"# {title}", "", *rows, "",
                      f"Average of the best two settings selected on {source} dev: {summary}"]) + "\n"


@cli_errors
def main(argv=None):
    from fairseq_xmlm.zeroshot import benchmark
    from fairseq_xmlm.devices import default_device

    parser = ArgumentParser(description="Fine-tuning grid; average of the best two settings on English dev.")
    parser.add_argument("--task", choices=("genre", *benchmark.TASKS), default="genre")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--langs", help="genre: comma-separated target languages")
    parser.add_argument("--train-file", help="xnli / ner / parse: English training file")
    parser.add_argument("--dev-file", help="xnli / ner / parse: English dev file")
    parser.add_argument("--test-file", action="append", default=[], metavar="LANG=FILE")
    parser.add_argument("--source", default="en")
    parser.add_argument("--data", default=None, help="pretraining data-bin (default: the checkpoint's own)")
    parser.add_argument("--grid", choices=sorted(GRIDS), help="default: xnli for genre / xnli, ner for ner / parse")
    parser.add_argument("--epochs", type=int, default=3, help="the paper: 200 for XNLI, 10 for NER/parsing")
    parser.add_argument("--epoch-size", type=int, default=None, help="training examples per epoch, at most one "
                        "pass (default: 20000 for --task xnli, as the paper's XLM epochs; else one pass)")
    parser.add_argument("--device", default=default_device(), help="cuda or cpu (default: cuda when available)")
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="markdown table (and a .json with the same stem)")
    args = parser.parse_args(argv)
    if args.task == "genre":
        if not args.langs:
            raise XmlmError("--task genre needs --langs")
        evaluate = genre_evaluator(args.checkpoint, [lang for lang in args.langs.split(",") if lang],
                                   args.max_train, args.source, args.data, args.device)
        grid, title = args.grid or "xnli", f"Genre sweep: {args.checkpoint}"
    else:
        if not args.train_file or not args.dev_file:
            raise XmlmError(f"--task {args.task} needs --train-file and --dev-file")
        evaluate = task_evaluator(benchmark.benchmark_from_args(args.task, args))
        grid = args.grid or ("xnli" if args.task == "xnli" else "ner")
        title = f"{args.task} sweep ({benchmark.PRIMARY_METRIC[args.task]}): {args.checkpoint}"
    epoch_size = args.epoch_size or benchmark.DEFAULT_CONFIG.get(args.task, {}).get("epoch_size")
    runs, selected, averages = run_sweep(evaluate, grid, args.epochs, args.seed, epoch_size)
    table = sweep_table(title, runs, selected, averages, args.source)
    write_json(Path(args.out).with_suffix(".json"), {"task": args.task, "grid": grid, "runs": runs,
                                                     "selected": selected, "average_of_best_two": averages}, indent=2)
    write_atomic(args.out, table)
    print(table)


if __name__ == "__main__":
    main()
