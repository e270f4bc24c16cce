"""Throughput of packed training (fairseq_xmlm.packed_training) on Dufter's real setup, per group of stacked runs.

    python benchmarks/pack_speed.py --data data-bin/fake_english --ids 0,2,15 --seeds 5 --updates 300 --out DIR

Builds the `examples/dufter/run.py full` fairseq-train commands of the chosen runs (the paper's BERT-small /
BERT-base, batch 256, 100 epochs), caps each at --updates, trains them as `run.py --gpu-pack` does (one process per
group of stacked runs, side by side) and prints per group: runs, updates, seconds, run-updates/s; then the
total wall time (start-up included) and rates; everything also goes to OUT/pack_speed.json. Not a test.
"""
import argparse
import importlib.util
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def dufter_recipe():
    spec = importlib.util.spec_from_file_location("dufter_run", REPO / "examples" / "dufter" / "run.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    return recipe


def recipe_commands(ids, seeds, data, out, updates, knn_table, first_seed=0, multilinguality=False):
    """`examples/dufter/run.py full`'s fairseq-train commands of these run IDs and `seeds` seeds from the recipe's
    `first_seed`-th, capped at `updates` updates, without the multilinguality hook (the timing is of training) unless
    `multilinguality`, logs and checkpoints in out/ID/seedS."""
    recipe = dufter_recipe()
    commands = []
    for run_id in ids:
        for seed in recipe.SEEDS[first_seed:first_seed + seeds]:
            run_dir = out / run_id / f"seed{seed}"
            command = recipe.train_command(run_id, seed, data, run_dir / "checkpoints", recipe.PRESETS["full"],
                                           knn_table)
            if "--eval-multilinguality" in command and not multilinguality:
                command.remove("--eval-multilinguality")
            commands.append([str(c) for c in command] + ["--max-update", str(updates),
                                                         "--log-file", str(run_dir / "train.log")])
    return commands


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(REPO / "data-bin" / "fake_english"))
    parser.add_argument("--ids", default="0,2,15", help="run IDs (tables.RUNS), trained ones only")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--updates", type=int, default=300, help="updates per run (cap)")
    parser.add_argument("--max-group", type=int, default=40)
    parser.add_argument("--knn-table", default=str(REPO / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    from fairseq_xmlm.packed_training import train_side_by_side

    out = Path(args.out)
    commands = recipe_commands(args.ids.split(","), args.seeds, Path(args.data), out, args.updates, args.knn_table)
    result = train_side_by_side(commands, out / "pack", args.max_group)
    import torch

    result["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    run_updates = tokens = 0
    for index, process in enumerate(result["processes"]):
        for g in process["groups"]:
            run_updates += g["runs"] * g["updates"]
            tokens += g["tokens"]
            print(f"process {index}: group of {g['runs']} runs, {g['updates']} updates, {g['seconds']:.1f}s, "
                  f"{g['runs'] * g['updates'] / g['seconds']:.0f} run-updates/s")
    print(f"all: {len(commands)} runs, {run_updates} run-updates in {result['seconds']:.0f}s wall (start-up, "
          f"building, training, saving): {run_updates / result['seconds']:.0f} run-updates/s, "
          f"{tokens / result['seconds']:.0f} tokens/s on {result['device']}")
    (out / "pack_speed.json").write_text(json.dumps({**result, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
