"""Whether a packed group trains the same beside another group in lockstep (`packed_training.train_groups`, each
group on a CUDA stream of its own) as alone.

    python3 benchmarks/lockstep_equal.py --groups 0,1 15 --updates 75 --out OUT/lockstep_equal [--bf16-compiled]

Each group is a list of run IDs of `examples/dufter/run.py full` (first seed, capped at --updates, beyond the 69
updates of an epoch so that CUDA graphs are replayed too), with the recipe's dropout and CUDA graphs; fp32 and not
compiled, or with --bf16-compiled as `--gpu-pack` trains. Every group trains alone, then all together in lockstep,
from the same commands in fresh folders; the checkpoints of each run are compared weight by weight, and each run's
training losses (one per epoch) are printed. Both the dropout draws (one generator state per group) and the
masking draws are the group's own, so in fp32 the weights should be the same bit for bit. In bf16 two runs alone
already drift apart (atomic adds in some backward kernels), so every group also trains alone a second time. Exits
1 if a weight is not finite, or a difference from alone is over both --tolerance and twice the run's drift between
its two runs alone. GPU only; not a test (CI has no GPU).
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
    for folder in ("alone", "again"):  # again: how far two runs alone drift apart (bf16 kernels are not exact)
        started = time.perf_counter()
        for chunk in chunks(folder):
            packed_training.train_group(chunk, device, precision, compile=compile, cuda_graphs=True)
        seconds[folder] = time.perf_counter() - started
    started = time.perf_counter()
    team = chunks("lockstep")
    facts = packed_training.train_groups(team, device, precision, compile=compile, cuda_graphs=True)
    seconds["lockstep"] = time.perf_counter() - started
    def largest_difference(first, second):
        return max(float((a.float() - b.float()).abs().max()) for a, b in zip(first.values(), second.values()))

    rows, failed = [], False
    for chunk in team:
        for run in chunk:
            paths = [Path(str(run.checkpoint_path).replace(str(out / "lockstep"), str(out / folder)))
                     for folder in ("alone", "again", "lockstep")]
            alone, again, lockstep = (load_checkpoint(path)[0].state_dict() for path in paths)
            difference, drift = largest_difference(alone, lockstep), largest_difference(alone, again)
            finite = all(bool(torch.isfinite(w).all()) for state in (alone, lockstep) for w in state.values())
            ok = finite and difference <= max(args.tolerance, 2 * drift)
            failed |= not ok
            losses = [[round(r["train_loss"], 3) for r in read_fairseq_log(path.parent.parent / "train.log", "train")]
                      for path in paths]
            rows.append({"run": str(paths[2].parents[1].relative_to(out / "lockstep")),
                         "max_weight_difference": difference, "alone_twice_difference": drift, "finite": finite,
                         "losses": losses, "ok": ok})
            print(f"[lockstep_equal] {rows[-1]['run']}: weights differ by {difference:.2e} from alone (alone twice: "
                  f"{drift:.2e}), {'all' if finite else 'NOT all'} finite: {'same' if ok else 'DIFFERENT'}; train "
                  f"losses alone {losses[0]}, again {losses[1]}, in lockstep {losses[2]}", flush=True)
    print(f"[lockstep_equal] groups {' + '.join(args.groups)}, {args.updates} updates each: alone one after another "
          f"{seconds['alone']:.1f} s (again {seconds['again']:.1f} s), in lockstep {seconds['lockstep']:.1f} s "
          "(building included)", flush=True)
    (out / "lockstep_equal.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                                         "facts": facts, "seconds": seconds, "argv": sys.argv[1:]},
                                                        indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
