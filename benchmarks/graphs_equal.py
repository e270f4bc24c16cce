"""Whether CUDA graphs change a packed group's training: the same updates replayed as graphs and run as they are.

    python3 benchmarks/graphs_equal.py --ids 0,1 --out OUT/graphs_equal

For each case (fp32 without compile, dropout off; the same with the recipe's dropout; bf16 compiled with dropout,
as `--gpu-pack` trains), two `packed_training.PackedGroup`s of the recipe's runs --ids (first seed, real batches of
epoch 1) take the same updates, one with `cuda_graphs`, one without, each from a fresh seed. The batch order repeats
shapes (batches 0, 1, 2, 0, 1, 2, 3), so that the graph group replays graphs as well as capturing them. Prints each
case's largest loss and weight differences and exits 1 if a case is over its tolerance. GPU only; not a test (CI has
no GPU).
"""
import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ORDER = [0, 1, 2, 0, 1, 2, 3]
# case -> (precision, compile, dropout on, tolerance of the relative loss difference, of the weights' difference)
CASES = {"fp32_no_dropout": ("fp32", False, False, 1e-5, 1e-5), "fp32": ("fp32", False, True, 1e-5, 1e-5),
         "bf16_compiled": ("bf16", True, True, 2e-3, 1e-3)}


def train(runs, schedules, precision, compile, cuda_graphs):
    """The ORDER updates of a fresh group -> (losses of each update (steps, N) on the host, final master weights)."""
    from fairseq_xmlm import packed_training

    group = packed_training.PackedGroup(runs, torch.device("cuda"), precision, compile, cuda_graphs)
    losses = []
    for at in ORDER:
        step_losses, counts, _ = group.step([schedule[at] for schedule in schedules])
        losses.append((step_losses / counts).cpu())  # a graph's outputs are its own until the next update
    return torch.stack(losses), group.stacked.flat.cpu(), len(group.graphs or {})


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", default="0,1", help="run IDs of examples/dufter/run.py (tables.RUNS)")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("graphs_equal: needs a GPU")
    sys.path.insert(0, str(HERE))
    import pack_speed
    from fairseq_xmlm import packed_training

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, failed = [], False
    for case in args.cases.split(","):
        precision, compile, dropout, loss_tolerance, weight_tolerance = CASES[case]
        commands = [c + ([] if dropout else ["--dropout", "0", "--attention-dropout", "0"]) for c in
                    pack_speed.recipe_commands(args.ids.split(","), 1, Path(args.data), out / "runs", 10 ** 6,
                                               args.knn_table)]
        runs = [packed_training.parse_run(c).build() for c in commands]
        schedules = [packed_training.epoch_batches(run, 1) for run in runs]
        plain_losses, plain_weights, _ = train(runs, schedules, precision, compile, False)
        graph_losses, graph_weights, graphs = train(runs, schedules, precision, compile, True)
        loss_difference = float(((graph_losses - plain_losses).abs() / plain_losses.abs()).max())
        weight_difference = float((graph_weights - plain_weights).abs().max())
        ok = loss_difference <= loss_tolerance and weight_difference <= weight_tolerance
        failed |= not ok
        rows.append({"case": case, "runs": len(runs), "updates": len(ORDER), "graphs": graphs,
                     "max_relative_loss_difference": loss_difference, "max_weight_difference": weight_difference,
                     "ok": ok})
        print(f"[graphs_equal] {case}: {len(runs)} runs, {len(ORDER)} updates, {graphs} graphs; losses differ by "
              f"{loss_difference:.2e} (relative, at most), weights by {weight_difference:.2e}: "
              f"{'same' if ok else 'DIFFERENT'} (tolerances {loss_tolerance:g}, {weight_tolerance:g})", flush=True)
    (out / "graphs_equal.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                                       "argv": sys.argv[1:]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
