"""Which part of a GPU run makes a Dufter run stall: the same runs' first epochs trained several ways, and how many
of them stay on the unigram plateau in each.

    python -m fairseq_xmlm.experiments.dufter stall-probe [--ids 1,3] [--seeds 20] [--updates 420]
        [--variants fairseq,eager,compile,graphs] [--precision fp32|bf16] [--train-args "..."] [--data DIR]
        [--results DIR]

A stall is decided in the first few hundred updates: a run leaves the plateau at the peak learning rate or never
does (results.md, "Causes"). Each run ID is trained with N seeds (the paper's five first, then 1000, 1001, ...)
under schedule paper-code (its learning-rate curve, clipping and batches) for its first --updates updates, in each
variant: `fairseq` (fairseq-train, fp32, one process per run), `eager` (the packed trainer, all runs stacked in one
model), `compile` (and its stacked layers and optimizer step compiled), `graphs` (and each batch shape's update
replayed as a CUDA graph, as the GPU sweep trains; GPU only). --train-args adds fairseq-train options to every
run of every variant (a candidate remedy, e.g. "--warmup-updates 500", or "--clip-norm 0" where stalls are common);
the packed trainer follows the schedule and clipping options. A run has stalled when the training loss of its last
full epoch is over STALL_MARGIN bits above the median of its run ID over every variant (it never left the plateau:
at epoch 3 the runs that left it stood at 7.79-7.95 bits, the GPU stalls at 8.21-8.45,
docs/results/dufter_stall_cpu.json), or above its own lowest loss of an earlier epoch (it left the plateau and went
back, as unclipped runs do), or, from epoch PLATEAU_FROM_EPOCH on, within STALL_MARGIN of the unigram plateau
(`unigram_bits`): where most runs of an ID stall, the median stands on the plateau and is no guide.
RESULTS/VARIANT/ID/seedS/ holds each run's log (fairseq-train's output: RESULTS/fairseq/logs/); a variant with
RESULTS/VARIANT/done (which holds its --train-args) is skipped. Writes RESULTS/stall_probe.json (each run's loss
per epoch and whether it stalled; per variant and ID how many stalled).
"""
import shlex
import subprocess
import sys
from pathlib import Path
from statistics import median

import torch

from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import ArgumentParser, XmlmError
from fairseq_xmlm.experiments.commands import parse_choices, python_module
from fairseq_xmlm.experiments.dufter import recipe
from fairseq_xmlm.experiments.dufter.figures import read_fairseq_log
from fairseq_xmlm.experiments.dufter.runs import PRESETS, RUNS, SCHEDULES, SEEDS
from fairseq_xmlm.io import log, write_json
from fairseq_xmlm.vocabulary import load_data_dictionary

# The schedule whose stalls the probe measured (docs/results/dufter_stall_probe.json): the paper's updates and
# clipping, padding masked; attending to padding left no run stalled (docs/results.md)
SCHEDULE = "paper-code"
STALL_MARGIN = 0.2  # bits over the run ID's median, or over the run's own best earlier epoch, at the last full one
# The plateau test needs this many full epochs: before epoch 3 runs that train are near the plateau too (the ID 0
# runs at lr 1e-3 stood at 8.51-8.96 bits at epoch 2, 7.93-8.24 at epoch 3: docs/results/dufter_stall_remedy_gpu.json)
PLATEAU_FROM_EPOCH = 3
VARIANTS = {"fairseq": None, "eager": [], "compile": ["--compile"], "graphs": ["--compile", "--cuda-graphs"]}


def probe_seeds(count):
    """The paper's seeds first, then 1000, 1001, ..."""
    return list(SEEDS[:count]) + [1000 + k for k in range(max(0, count - len(SEEDS)))]


def probe_commands(ids, seeds, data, variant_dir, updates, train_args=()):
    """{(ID, seed): fairseq-train argv}: the probed schedule's command of each run with `train_args` after it,
    capped at `updates` updates, without the multilinguality hook, its log in variant_dir/ID/seedS/train.log."""
    preset = recipe.scheduled(PRESETS["full"], SCHEDULES[SCHEDULE])
    return {(run_id, seed): recipe.capped_command(run_id, seed, data, variant_dir / run_id / f"seed{seed}", preset,
                                                  "", updates) + list(train_args)
            for run_id in ids for seed in seeds}


def train_variant(name, commands, variant_dir, precision):
    """Every command of one variant; the packed ones in one `python -m fairseq_xmlm.packed` process."""
    from fairseq_xmlm.packed.processes import Job, default_slots, run_jobs

    for argv in commands.values():
        Path(argv[argv.index("--save-dir") + 1]).mkdir(parents=True, exist_ok=True)
    if VARIANTS[name] is None:
        run_jobs([Job(argv) for argv in commands.values()], default_slots(0), variant_dir / "logs")
        return
    listing = variant_dir / "commands.txt"
    listing.write_text("".join(" ".join(argv) + "\n" for argv in commands.values()))
    argv = [*python_module("fairseq_xmlm.packed"), str(listing), "--precision", precision, "--max-group",
            str(len(commands)), *VARIANTS[name]]
    with open(variant_dir / "packed.log", "w") as out:
        if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT).returncode:
            raise XmlmError(f"the {name} variant failed: see {variant_dir / 'packed.log'}")


def log_of(variant, variant_dir, index, argv):
    """Where a run's epoch records are: fairseq-train's output (its --log-file misses the first epoch's), or the
    packed trainer's --log-file."""
    own_log = VARIANTS[variant] is not None
    path = Path(argv[argv.index("--log-file") + 1] if own_log else variant_dir / "logs" / f"{index}.log")
    if not path.is_file():  # e.g. a variant done earlier with fewer seeds or other run IDs
        raise XmlmError(f"{path} not found: remove {variant_dir / 'done'} to train the {variant} variant again")
    return path


def epoch_losses(log_path, full_epochs):
    """Training loss (bits) per epoch from a fairseq json log."""
    losses = {int(record["epoch"]): record["train_loss"] for record in read_fairseq_log(log_path, "train")}
    if len(losses) < full_epochs:
        raise XmlmError(f"{log_path} logs {len(losses)} epochs, not the {full_epochs} full ones of its updates")
    return [losses[epoch] for epoch in sorted(losses)]


def unigram_bits(data):
    """The loss (bits) of predicting every masked token by its frequency alone, the plateau a stalled run stays on:
    the entropy -sum p log2 p of the training tokens over both languages. Fake-English gives each English piece a
    twin of the same count (dict.txt holds the English counts), so it is H(English) + 1."""
    dictionary = load_data_dictionary(data)
    counts = torch.tensor(dictionary.count[dictionary.nspecial:], dtype=torch.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log2()).sum()) + 1.0


def summarise(losses, full_epochs, plateau_bits=None):
    """{"runs": {variant: {ID: {seed: {"loss_per_epoch", "stalled"}}}}, "stalled": {variant: {ID: "k/n"}}}, with
    `losses` {variant: {(ID, seed): [loss per epoch]}}: stalled against the ID's median over every variant, against
    the run's own best earlier epoch, or (given `plateau_bits`) within the margin of the unigram plateau."""
    last = {(variant, key): values[full_epochs - 1] for variant, per_run in losses.items()
            for key, values in per_run.items()}
    medians = {run_id: median(v for (_, (i, _)), v in last.items() if i == run_id)
               for run_id in {i for _, (i, _) in last}}
    runs, counts = {}, {}
    for variant, per_run in losses.items():
        for (run_id, seed), values in per_run.items():
            final = last[variant, (run_id, seed)]
            went_back = full_epochs > 1 and final > min(values[:full_epochs - 1]) + STALL_MARGIN
            on_plateau = (plateau_bits is not None and full_epochs >= PLATEAU_FROM_EPOCH
                          and final >= plateau_bits - STALL_MARGIN)
            stalled = final > medians[run_id] + STALL_MARGIN or went_back or on_plateau
            runs.setdefault(variant, {}).setdefault(run_id, {})[str(seed)] = {"loss_per_epoch": values,
                                                                              "stalled": stalled}
        counts[variant] = {run_id: f"{sum(r['stalled'] for r in by_seed.values())}/{len(by_seed)}"
                           for run_id, by_seed in runs[variant].items()}
    return {"runs": runs, "stalled": counts}


def parse_args(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter stall-probe",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--ids", default="1,3", help="comma-separated run IDs (default: lang-pos and inv-order)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per run ID (the paper's five first)")
    parser.add_argument("--updates", type=int, default=420, help="updates of each run (default: 3 epochs and a bit)")
    parser.add_argument("--variants", default="fairseq,eager,compile,graphs", help=f"of {', '.join(VARIANTS)}")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="the packed variants'")
    parser.add_argument("--train-args", default="", help="fairseq-train options added to every run, e.g. "
                                                         "'--warmup-updates 500'")
    parser.add_argument("--data", default=str(recipe.REPO / "data-bin" / "fake_english"))
    parser.add_argument("--results", default=str(recipe.REPO / "results" / "dufter" / "stall_probe"))
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ids = parse_choices(args.ids, RUNS, "run IDs")
    variants = parse_choices(args.variants, VARIANTS, "variants")
    if any(RUNS[run_id].untrained for run_id in ids):
        raise XmlmError("untrained runs cannot stall: leave out " + ", ".join(i for i in ids if RUNS[i].untrained))
    if any(RUNS[run_id].needs_knn for run_id in ids):
        raise XmlmError("the probe trains no knn-replace runs (no neighbour table): leave out "
                        + ", ".join(i for i in ids if RUNS[i].needs_knn))
    train_args = shlex.split(args.train_args)
    reserved = sorted({"--max-update", "--log-file", "--save-dir", "--seed", "--batch-size"} & set(train_args))
    if reserved:
        raise XmlmError(f"--train-args cannot set {', '.join(reserved)}: the probe sets them and counts epochs")
    if args.seeds < 1 or args.updates < 1:
        raise XmlmError(f"--seeds and --updates must be at least 1, got {args.seeds} and {args.updates}")
    data, results = Path(args.data), Path(args.results)
    if "graphs" in variants and not (results / "graphs" / "done").exists() and not has_gpu():
        raise XmlmError("the graphs variant replays CUDA graphs: it needs a GPU (or its runs done, to summarise)")
    recipe.ensure_data(data, dry_run=False)
    full_epochs = args.updates // recipe.updates_per_epoch(data, False, recipe.scheduled(
        PRESETS["full"], SCHEDULES[SCHEDULE])["batch_size"])
    if full_epochs < 1:
        raise XmlmError(f"--updates {args.updates} is less than one epoch: a stall shows at the end of an epoch")
    losses = {}
    for name in variants:
        variant_dir = results / name
        variant_dir.mkdir(parents=True, exist_ok=True)
        commands = probe_commands(ids, probe_seeds(args.seeds), data, variant_dir, args.updates, train_args)
        done = variant_dir / "done"
        if not done.exists():
            log(f"stall probe: {name}, {len(commands)} runs of {args.updates} updates")
            train_variant(name, commands, variant_dir, args.precision)
            done.write_text(args.train_args)
        elif shlex.split(done.read_text()) != train_args:
            raise XmlmError(f"{variant_dir} was trained with --train-args {done.read_text()!r}: give those, or "
                            f"another --results")
        losses[name] = {key: epoch_losses(log_of(name, variant_dir, index, argv), full_epochs)
                        for index, (key, argv) in enumerate(commands.items())}
    plateau = unigram_bits(data)
    summary = {"ids": ids, "seeds": probe_seeds(args.seeds), "updates": args.updates, "full_epochs": full_epochs,
               "precision": args.precision, "train_args": args.train_args, "stall_margin_bits": STALL_MARGIN,
               "unigram_bits": round(plateau, 4), **summarise(losses, full_epochs, plateau)}
    write_json(results / "stall_probe.json", summary)
    for name, counts in summary["stalled"].items():
        log(f"stall probe: {name}: stalled " + ", ".join(f"ID {i} {c}" for i, c in counts.items()))
