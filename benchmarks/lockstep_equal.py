"""Whether a packed group trains the same beside another group in lockstep (`packed_training.train_groups`, each
group on a CUDA stream of its own) as alone.

    python3 benchmarks/lockstep_equal.py --groups 0,1 15 --updates 75 --out OUT/lockstep_equal [--bf16-compiled]

Each group is a list of run IDs of `examples/dufter/run.py full` (first seed, capped at --updates, beyond the 69
updates of an epoch so that CUDA graphs are replayed too), with the recipe's dropout and CUDA graphs; fp32 and not
compiled, or with --bf16-compiled as `--gpu-pack` trains. Every group trains alone, then all together in lockstep,
from the same commands in fresh folders; the checkpoints of each run are compared weight by weight, and each run's
training losses (one per epoch) are printed. Both the dropout draws (one generator state per group) and the
masking draws are the group's own, so the weights should be the same bit for bit. Exits 1 if a difference is over
--tolerance or a weight is not finite. GPU only; not a test (CI has no GPU).
"""
import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", nargs="+", default=["0,1", "15"])
    parser.add_argument("--updates", type=int, default=75)
    parser.add_argument("--tolerance", type=float, default=0.0)
    parser.add_argument("--bf16-compiled", action="store_true")
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lockstep_equal: needs a GPU")
    sys.path.insert(0, str(HERE))
    import pack_speed
    from fairseq_xmlm import packed_training
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.evaluation.figures import read_fairseq_log

    out = Path(args.out)
    device = torch.device("cuda")
    precision, compile = ("bf16", True) if args.bf16_compiled else ("fp32", False)

    def chunks(folder):
        return [[packed_training.parse_run(c).build() for c in pack_speed.recipe_commands(
            ids.split(","), 1, Path(args.data), out / folder, args.updates, args.knn_table)] for ids in args.groups]

    seconds = {}
    started = time.perf_counter()
    for chunk in chunks("alone"):
        packed_training.train_group(chunk, device, precision, compile=compile, cuda_graphs=True)
    seconds["alone"] = time.perf_counter() - started
    started = time.perf_counter()
    team = chunks("lockstep")
    facts = packed_training.train_groups(team, device, precision, compile=compile, cuda_graphs=True)
    seconds["lockstep"] = time.perf_counter() - started
    rows, failed = [], False
    for chunk in team:
        for run in chunk:
            alone = Path(str(run.checkpoint_path).replace(str(out / "lockstep"), str(out / "alone")))
            weights = [load_checkpoint(path)[0].state_dict() for path in (alone, run.checkpoint_path)]
            difference = max(float((a.float() - b.float()).abs().max()) for a, b in zip(weights[0].values(),
                                                                                       weights[1].values()))
            finite = all(bool(torch.isfinite(w).all()) for state in weights for w in state.values())
            ok = difference <= args.tolerance and finite
            failed |= not ok
            losses = [[round(r["train_loss"], 3) for r in read_fairseq_log(path.parent.parent / "train.log", "train")]
                      for path in (alone, Path(run.checkpoint_path))]
            rows.append({"run": str(Path(run.checkpoint_path).parents[1].relative_to(out / "lockstep")),
                         "max_weight_difference": difference, "finite": finite, "losses": losses, "ok": ok})
            print(f"[lockstep_equal] {rows[-1]['run']}: weights differ by {difference:.2e} from alone, "
                  f"{'all' if finite else 'NOT all'} finite: {'same' if ok else 'DIFFERENT'}; train losses alone "
                  f"{losses[0]}, in lockstep {losses[1]}", flush=True)
    print(f"[lockstep_equal] groups {' + '.join(args.groups)}, {args.updates} updates each: alone one after another "
          f"{seconds['alone']:.1f} s, in lockstep {seconds['lockstep']:.1f} s (building included)", flush=True)
    (out / "lockstep_equal.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                                         "facts": facts, "seconds": seconds, "argv": sys.argv[1:]},
                                                        indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
