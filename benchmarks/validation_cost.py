"""What the 5-seed sweep's validations cost its training teams: seconds per `packed_training.validate` of a run.

    python3 benchmarks/validation_cost.py [--ids 0,15,30] [--repeats 3]

`examples/dufter/run.py full` trains IDs 0, 15 and 30 (CURVE_IDS, Dufter's Fig. 6/7) of every seed with the
multilinguality hook and --validate-interval-updates 500: 13 validations a run in its 6,900 updates, which until
the twenty-eighth session ran inside its team's training loop while the team's groups waited (now beside it,
`packed_training.BackgroundValidation`). This builds each run from the recipe's own
command (seed 0, the hook on), puts its weights on the GPU as the packed group hands them over, and times --repeats
validations after one untimed first (which loads the dev set). Prints seconds per validation for each run and what
13 of each cost one team by that arithmetic. Untrained weights: the same work as trained ones.

With --team-updates N it then trains seed 0's team as the sweep does (--team-ids: IDs 15-17 and 0-9, 30 in
lockstep, compiled, CUDA graphs, the hook on) for N updates and prints each epoch's seconds from the first run's
log: the epochs that hold a validation (updates 500, 1000, ...) against the median of the others. Not a test.
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from pack_speed import recipe_commands  # noqa: E402 (benchmarks/ on the path first)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", default="0,15,30")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--out", default="/tmp/validation_cost")
    parser.add_argument("--team-updates", type=int, default=0)
    parser.add_argument("--team-ids", default="15,16,17,0,1,2,3,4,5,6,7,8,9,30",
                        help="the team's runs; the first one's log is read")
    args = parser.parse_args()
    from fairseq_xmlm.packed_training import parse_run, validate

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    total = 0.0
    for run_id in args.ids.split(","):
        command, = recipe_commands([run_id], 1, Path(args.data), Path(args.out), 10 ** 6, args.knn_table,
                                   multilinguality=True)
        run = parse_run(command).build()
        weights = {name: value.detach().to(device) for name, value in run.model.state_dict().items()}
        validate(run, weights, 1, 500, device)
        seconds = []
        for _ in range(args.repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            started = time.perf_counter()
            record = validate(run, weights, 1, 500, device)
            seconds.append(time.perf_counter() - started)
        median = statistics.median(seconds)
        total += 13 * median
        print(f"validation_cost: ID {run_id} ({run.cfg.model._name}): {median:.2f} s a validation "
              f"({', '.join(f'{s:.2f}' for s in seconds)}), 13 a run: {13 * median:.1f} s; "
              f"valid_mu {record.get('valid_mu')}", flush=True)
    print(f"validation_cost: one team's validations of IDs {args.ids}: {total:.1f} s")
    if args.team_updates:
        team_epochs(args, device)


def team_epochs(args, device):
    """Seed 0's team for --team-updates updates; each epoch's seconds from its first run's log."""
    from fairseq_xmlm.packed_training import train_packed

    out = Path(args.out) / "team"
    ids = args.team_ids.split(",")
    commands = recipe_commands(ids, 1, Path(args.data), out, args.team_updates, args.knn_table,
                               multilinguality=True)
    cuda = device.type == "cuda"
    train_packed(commands, device=device, compile=cuda, cuda_graphs=cuda, lockstep=True)
    walls, valid_updates = {}, []
    for line in (out / ids[0] / "seed0" / "train.log").read_text().splitlines():
        tag, record = line.split(" | ")[2], json.loads(line.split(" | ", 3)[3])
        if tag == "train":
            walls[record["train_num_updates"]] = record["train_wall"]
        elif tag == "valid":
            valid_updates.append(record["valid_num_updates"])
    ends = sorted(walls)
    per_epoch = ends[0]
    seconds = {end: walls[end] - walls[start] for start, end in zip(ends, ends[1:]) if end - start == per_epoch}
    holding = {end for end in seconds for update in valid_updates if end - per_epoch < update <= end}
    plain = statistics.median(s for end, s in seconds.items() if end not in holding)
    print(f"validation_cost: team epochs without a validation: median {plain:.2f} s", flush=True)
    for end in sorted(holding):
        print(f"validation_cost: the epoch ending at update {end} (a validation inside): {seconds[end]:.2f} s, "
              f"{seconds[end] - plain:+.2f} s")


if __name__ == "__main__":
    sys.exit(main())
