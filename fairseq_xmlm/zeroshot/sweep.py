"""Hyper-parameter sweep in Conneau et al. 2020's protocol: run the grid, select on English dev, report the
average of the best two settings.

    python -m fairseq_xmlm.zeroshot.sweep --checkpoint A.pt --langs fr --grid xnli --out results/sweep.md

Runs the Bible genre benchmark once per grid setting (`--grid xnli`: batch {4, 8} x encoder lr {1.25e-6, 2.5e-6,
5e-6} x head lr {5e-6, 2.5e-5, 1.25e-4}, constant lr; `--grid ner`: batch {16, 32} x lr {2e-5, 3e-5, 5e-5} for
encoder and head, 10 % warm-up then linear decay) and writes every run plus the selected average.
"""
import argparse
import itertools
import json
from pathlib import Path

from fairseq_xmlm.errors import XmlmError, cli_errors

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


def run_sweep(checkpoint, langs, grid, epochs, max_train=None, seed=1, source="en"):
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig
    from fairseq_xmlm.zeroshot.genre import evaluate_checkpoint

    if grid not in GRIDS:
        raise XmlmError(f"unknown grid {grid!r} (expected one of {', '.join(GRIDS)})")
    runs = []
    for batch_size, encoder_lr, head_lr, schedule in GRIDS[grid]:
        config = FinetuneConfig(batch_size=batch_size, encoder_lr=encoder_lr, head_lr=head_lr, epochs=epochs,
                                schedule=schedule, seed=seed)
        result = evaluate_checkpoint(checkpoint, langs, config, source, max_train)
        runs.append({"batch_size": batch_size, "encoder_lr": encoder_lr, "head_lr": head_lr, "schedule": schedule,
                     "dev": result["dev"][source], **{f"test_{lang}": acc for lang, acc in result["test"].items()}})
    test_keys = [key for key in runs[0] if key.startswith("test_")]
    selected, averages = average_of_best_two(runs, "dev", test_keys)
    return runs, selected, averages


def sweep_table(checkpoint, runs, selected, averages, source="en"):
    test_keys = list(averages)
    header = "| batch | encoder lr | head lr | schedule | " + f"{source} dev | " + " | ".join(
        key.removeprefix("test_") + " test" for key in test_keys) + " | selected |"
    rows = [header, "|---" * (6 + len(test_keys)) + "|"]
    for run in runs:
        mark = "yes" if any(run is chosen for chosen in selected) else ""
        rows.append(f"| {run['batch_size']} | {run['encoder_lr']:g} | {run['head_lr']:g} | {run['schedule']} | "
                    f"{run['dev']:.1f} | " + " | ".join(f"{run[key]:.1f}" for key in test_keys) + f" | {mark} |")
    summary = ", ".join(f"{key.removeprefix('test_')} {value:.1f}" for key, value in averages.items())
    return "\n".join([f"# Genre sweep: {checkpoint}", "", *rows, "",
                      f"Average of the best two settings selected on {source} dev: {summary}"]) + "\n"


@cli_errors
def main(argv=None):
    from fairseq_xmlm.zeroshot.genre import _write_atomic

    parser = argparse.ArgumentParser(description="Genre benchmark sweep; average of the best two on English dev.")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--langs", required=True, help="comma-separated target languages")
    parser.add_argument("--grid", choices=sorted(GRIDS), default="xnli")
    parser.add_argument("--epochs", type=int, default=3, help="the paper: 200 for XNLI, 10 for NER/parsing")
    parser.add_argument("--max-train", type=int, default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", required=True, help="markdown table (and a .json with the same stem)")
    args = parser.parse_args(argv)
    langs = [lang for lang in args.langs.split(",") if lang]
    runs, selected, averages = run_sweep(args.checkpoint, langs, args.grid, args.epochs, args.max_train, args.seed)
    table = sweep_table(args.checkpoint, runs, selected, averages)
    _write_atomic(Path(args.out).with_suffix(".json"), json.dumps(
        {"runs": runs, "selected": selected, "average_of_best_two": averages}, indent=2) + "\n")
    _write_atomic(args.out, table)
    print(table)


if __name__ == "__main__":
    main()
