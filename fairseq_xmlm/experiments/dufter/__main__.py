"""Dufter & Schuetze 2020, Tables 1 and 2 and Figures 4-8, as one restartable command.

    python -m fairseq_xmlm.experiments.dufter [full|quick|quickstart] [--seeds N|--seed-list 1,2] [--ids 0,1,...]
        [--dry-run] [--schedule NAME (runs.SCHEDULES)] [--clip-norm X] [--lr X]
        [--indomain-dev] [--gpu-pack [--pack-precision bf16|fp32]] [--report|--status]
    python -m fairseq_xmlm.experiments.dufter causes [--preset small|all|tiny|code] [--seeds N]   (causes.py)
    python -m fairseq_xmlm.experiments.dufter export-stock --out DIR                          (stock.py)
    python -m fairseq_xmlm.experiments.dufter stock-compare [full|tiny]                       (stock_compare.py)
    python -m fairseq_xmlm.experiments.dufter stall-probe [--ids 1,3] [--seeds N] [--variants ...] (stall_probe.py)
    python -m fairseq_xmlm.experiments.dufter compare BEFORE.json AFTER.json [--out FILE.md]   (compare.py)

For every run ID (runs.RUNS) and seed: fairseq-train into results/dufter/runs/ID/seedS/, then xmlm-eval-mult
into .../eval.json. A run whose eval.json exists is skipped, so an interrupted invocation resumes where it stopped.
Then table1.md, table2.md, dufter_table1.json and the figures (PNG) are written from whatever results exist
(--report writes only them). The results live in results/dufter/SCHEDULE/ (the 2026-11-28 schedule's in
results/dufter/ itself): the default schedule follows the paper's number of updates (runs.SCHEDULES).
With --gpu-pack every pending run is trained at once as stacked models (sweep.py), side by side on the GPU or
GPUs, each run evaluated as soon as its group has trained: the whole of Tables 1 and 2 in one command. SIGTERM
suspends the packed groups (they save their state) and the same command resumes them.
"""
import os
import shlex
import sys
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.experiments.commands import parse_choices, parse_seeds
from fairseq_xmlm.experiments.dufter import (causes, compare, recipe, report, stall_probe, stock, stock_compare,
                                             sweep)
from fairseq_xmlm.experiments.dufter.runs import (DEFAULT_SCHEDULE, LEGACY_SCHEDULE, PRESETS, RUNS, SCHEDULES, SEEDS,
                                                  TABLE1_IDS, TABLE2_IDS)


def parse_args(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter",
                            description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", choices=sorted(PRESETS), default="full")
    parser.add_argument("--seeds", type=int, help="how many of the paper's seeds (default: the preset's)")
    parser.add_argument("--seed-list", help="comma-separated seeds in place of --seeds, e.g. more than the paper's "
                                            "five, to tell whether a row's mean departs from the paper's by chance")
    parser.add_argument("--epochs", type=int, help="epochs of every run (default: the preset's; the schedule's "
                                                   "factor applies on top)")
    parser.add_argument("--ids", help="comma-separated run IDs (default: every ID of Tables 1 and 2)")
    parser.add_argument("--data", default=str(recipe.REPO / "data-bin" / "fake_english"))
    parser.add_argument("--results", help="default: results/dufter/SCHEDULE (results/dufter for 2026-11-28)")
    parser.add_argument("--schedule", choices=list(SCHEDULES), default=DEFAULT_SCHEDULE,
                        help="how long each run trains: " + "; ".join(f"{name}: {spec.description}"
                                                                      for name, spec in SCHEDULES.items()))
    parser.add_argument("--clip-norm", type=float,
                        help="fairseq-train's --clip-norm for every trained run (default: the schedule's; the "
                             "paper's code: 1.0; 0: none)")
    parser.add_argument("--lr", type=float,
                        help="peak learning rate of the BERT-small runs (default: the preset's; the paper's: 2e-3); "
                             "overparam's BERT-base runs keep their 1e-4")
    parser.add_argument("--indomain-dev", action="store_true",
                        help="also evaluate each run on in-domain dev sentences (BBE Old Testament, DATA_indomain): "
                             "eval_indomain.json beside eval.json")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--status", action="store_true",
                        help="print how many seeds of each run ID are evaluated, trained, started or pending; "
                             "change nothing")
    parser.add_argument("--report", action="store_true",
                        help="train and evaluate nothing: write the tables and figures from the results present "
                             "(e.g. copied back from a GPU machine)")
    parser.add_argument("--train-args", default="",
                        help="extra fairseq-train options, e.g. '--fp16 --optimizer xmlm_adamw --num-workers 2'")
    parser.add_argument("--gpu-pack", action="store_true",
                        help="train the runs as stacked models, one process per group, taking turns on each GPU "
                             "as CUDA graphs (fairseq_xmlm.packed, --pack-precision), each run evaluated once trained; "
                             "SIGTERM suspends the groups, a rerun resumes them; --train-args do not apply")
    parser.add_argument("--pack-precision", choices=("bf16", "fp32"), default="bf16",
                        help="--gpu-pack: the stacked models' products (bf16 with fp32 master weights, or fp32 as "
                             "the paper's code trains)")
    parser.add_argument("--pack-slots", type=int, default=0,
                        help="--gpu-pack: processes (groups, evaluations, untrained runs) at a time (0: CPU cores / 2)")
    parser.add_argument("--pack-max-group", type=int, default=40, help="--gpu-pack: most runs stacked in one model")
    parser.add_argument("--pack-eager", action="store_true",
                        help="--gpu-pack: no torch.compile of the stacked models (compiled by default)")
    parser.add_argument("--pack-lockstep", action="store_true",
                        help="--gpu-pack: train each BERT-base group in one process with small groups, each on a "
                             "CUDA stream of its own, one update of each a round (faster rounds, slower warm-up)")
    parser.add_argument("--pack-eval-cpu", action="store_true",
                        help="--gpu-pack: evaluate a BERT-small run on the CPU (niced, 2 threads) when its group "
                             "ends while others have yet to train, and an untrained one while any run trains, so that "
                             "the GPU is the training's alone")
    return parser.parse_args(argv)


def results_dir(schedule):
    results = recipe.REPO / "results" / "dufter"
    return results if schedule == LEGACY_SCHEDULE else results / schedule


@cli_errors
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["causes"]:
        return causes.main(argv[1:])
    if argv[:1] == ["export-stock"]:
        return stock.main(argv[1:])
    if argv[:1] == ["stock-compare"]:
        return stock_compare.main(argv[1:])
    if argv[:1] == ["stall-probe"]:
        return stall_probe.main(argv[1:])
    if argv[:1] == ["compare"]:
        return compare.main(argv[1:])
    args = parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        raise XmlmError(f"--epochs must be at least 1, got {args.epochs}")
    if args.clip_norm is not None and args.clip_norm < 0:
        raise XmlmError(f"--clip-norm must be >= 0, got {args.clip_norm}")
    preset = recipe.scheduled({**PRESETS[args.preset], **({"epochs": args.epochs} if args.epochs else {})},
                              SCHEDULES[args.schedule])
    if args.clip_norm is not None:
        preset["clip_norm"] = args.clip_norm
    if args.lr is not None:
        if not args.lr > 0:
            raise XmlmError(f"--lr must be > 0, got {args.lr:g}")
        preset["lr"] = f"{args.lr:g}"
    ids = parse_choices(args.ids, RUNS, "run IDs", default=preset.get("ids", dict.fromkeys(TABLE1_IDS + TABLE2_IDS)))
    if args.seed_list and args.seeds:
        raise XmlmError("--seeds and --seed-list name the seeds twice: give one")
    seeds = parse_seeds(args.seed_list, "--seed-list") if args.seed_list else SEEDS[: args.seeds or preset["seeds"]]
    base_data, results = Path(args.data), Path(args.results or results_dir(args.schedule))
    runs_dir = results / "runs"
    setting = f"{args.schedule}: {SCHEDULES[args.schedule].description}" + (
        f"; preset {args.preset}: {preset['epochs']} epochs of batches of {preset['batch_size']} sentences"
        if args.preset != "full" else "") + (
        f"; --clip-norm {preset['clip_norm']:g}" if args.clip_norm is not None else "") + (
        f"; --lr {preset['lr']}" if args.lr is not None else "") + (
        f"; packed, {args.pack_precision}" if args.gpu_pack else "")
    if args.status:
        recipe.print_status(runs_dir, ids, seeds)
        return
    if args.report:
        report.write_report(runs_dir, results, base_data, ids, setting)
        return
    if args.gpu_pack and not args.dry_run and not recipe.has_gpu():  # bf16 stacked models on a CPU: hours per run
        raise XmlmError("--gpu-pack trains on a GPU and none is visible here; without --gpu-pack each run is a "
                        "fairseq-train on the CPU")
    if args.gpu_pack and args.train_args:
        raise XmlmError("--train-args apply to fairseq-train runs, not to --gpu-pack")
    recipe.ensure_data(base_data, args.dry_run)
    data = recipe.schedule_data(base_data, SCHEDULES[args.schedule], args.dry_run)
    train_args = shlex.split(args.train_args)
    knn_table = results / "knn_table.pt"
    if any(RUNS[run_id].needs_knn for run_id in ids):
        recipe.ensure_knn_table(data, knn_table, args.dry_run)
    if args.gpu_pack:
        pending = [(run_id, seed) for run_id in ids for seed in seeds
                   if not (runs_dir / run_id / f"seed{seed}" / "eval.json").exists()]
        slots = args.pack_slots or max(1, (os.cpu_count() or 2) // 2)
        sweep.run_all_packed(pending, data, runs_dir, results, preset, knn_table, slots, args.pack_max_group,
                             args.dry_run, False if args.pack_eager else None, args.pack_lockstep, args.pack_eval_cpu,
                             args.pack_precision, lambda run_id: train_args)
    else:
        for run_id in ids:
            for seed in seeds:
                recipe.run_one(run_id, seed, data, runs_dir, preset, knn_table, args.dry_run, train_args)
    if args.indomain_dev:
        recipe.evaluate_indomain([(run_id, seed) for run_id in ids for seed in seeds], runs_dir,
                                 recipe.indomain_data(base_data, args.dry_run), preset, args.dry_run)
    if not args.dry_run:
        report.write_report(runs_dir, results, base_data, ids, setting)


if __name__ == "__main__":
    main()
