"""Dufter & Schuetze 2020, Tables 1 and 2 and Figures 4-8, as one restartable command.

    python examples/dufter/run.py [full|quick] [--seeds N] [--ids 0,1,...] [--dry-run] [--gpu-pack] [--report|--status]

For every run ID (tables.RUNS) and seed: fairseq-train into results/dufter/runs/ID/seedS/, then xmlm-eval-mult
into .../eval.json. A run whose eval.json exists is skipped, so an interrupted invocation resumes where it stopped.
Then results/dufter/table1.md, table2.md and the figures (PNG) are written from whatever results exist (--report
writes only them).
With --gpu-pack every pending run is trained at once as stacked models (fairseq_xmlm.packed_training), side by
side on the GPU or GPUs, each run evaluated as soon as its group has trained: the whole of Tables 1 and 2 in one
command. SIGTERM suspends the packed groups (they save their state) and the same command resumes them.
"""
import argparse
import importlib.util
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from fairseq_xmlm.errors import XmlmError, cli_errors
from fairseq_xmlm.evaluation.tables import RUNS, TABLE1_IDS, TABLE2_IDS, write_tables

REPO = Path(__file__).resolve().parents[2]


def module(name):
    """`python -m NAME`: works where the console scripts are not installed (e.g. a GPU machine with PYTHONPATH)."""
    return [sys.executable, "-m", name]

SEEDS = (0, 42, 43, 100, 101)  # the paper's seeds (Table 9)
PRESETS = {
    # paper: 100 epochs, 5 seeds, the whole 10k-sentence dev set
    "full": {"epochs": 100, "seeds": 5, "eval_sentences": None, "eval_train_sentences": None, "validate_every": 500,
             "valid_steps": 20},
    # a CPU afternoon: the same runs, short and once, perplexity and mu on subsets
    "quick": {"epochs": 3, "seeds": 1, "eval_sentences": 1000, "eval_train_sentences": 2000, "validate_every": 50,
              "valid_steps": 10},
    # examples/quickstart.sh: the original model and its untrained twin, <= 10 minutes on 2 CPU cores. Batches of
    # 32 sentences give 8x the updates of the paper's 256 for the same compute: multilinguality shows up sooner.
    "quickstart": {"epochs": 3, "seeds": 1, "eval_sentences": 1000, "eval_train_sentences": 2000,
                   "validate_every": 500, "valid_steps": 10, "ids": ("0", "18"), "batch_size": 32},
}
CURVE_IDS = ("0", "15", "30")  # Fig. 6/7: trained with the multilinguality validation hook
KNN_NEIGHBOURS = 1  # Appendix A.3: "in the fake-English setup only with the nearest neighbor"
BATCH_SIZE = 256  # the paper's; a preset may set its own


def log(message):
    print(message, file=sys.stderr, flush=True)


def run(command, dry_run, log_path=None):
    log("+ " + " ".join(map(str, command)))
    if dry_run:
        return
    if log_path is None:
        subprocess.run(list(map(str, command)), check=True)
        return
    tmp = log_path.with_name(log_path.name + ".partial")
    with open(tmp, "w") as out:
        process = subprocess.Popen(list(map(str, command)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        for line in process.stdout:
            out.write(line)
            if " | train_inner | " in line or " | valid | " in line or "Error" in line:  # progress on the console
                sys.stderr.write(line)
        if process.wait():
            raise XmlmError(f"command failed (exit {process.returncode}), log: {tmp}")
    tmp.replace(log_path)


def ensure_data(data, dry_run):
    if (data / "dict.txt").exists():
        return
    bible = REPO / "data" / "bible_dufter"
    run([*module("fairseq_xmlm.data.bible"), "--versions", "en:3,en_kjv:k", "--out", bible], dry_run)
    run([*module("fairseq_xmlm.data.prepare"), "fake-english", "--bible-dir", bible, "--out", data], dry_run)


def updates_per_epoch(data, no_parallel, batch_size):
    """Both languages of every training sentence (no-parallel: each sentence in one language), in batches."""
    index = data / "train.en.idx"
    if not index.exists():  # dry run before the data exists
        return 1
    from fairseq.data import data_utils
    from fairseq_xmlm.vocabulary import load_data_dictionary

    sentences = len(data_utils.load_indexed_dataset(str(data / "train.en"), load_data_dictionary(data), "mmap"))
    return math.ceil((1 if no_parallel else 2) * sentences / batch_size)


def train_command(run_id, seed, data, save_dir, preset, knn_table, train_args=()):
    spec = RUNS[run_id]
    epochs = preset["epochs"] * spec.epoch_factor
    batch_size = preset.get("batch_size", BATCH_SIZE)
    total = epochs * updates_per_epoch(data, "--no-parallel" in spec.flags, batch_size)
    # Untrained rows: xmlm-untrained saves the update-0 model that fairseq-train would start from.
    command = [
        *module("fairseq_xmlm.untrained" if spec.untrained else "fairseq_cli.train"), data,
        "--user-dir", REPO / "fairseq_xmlm", "--task", "fake_english",
        "--criterion", "xmlm_masked_lm", "--optimizer", "adam", "--adam-eps", "1e-6", "--weight-decay", "0.01",
        "--batch-size", batch_size, "--save-dir", save_dir, "--seed", seed, "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", "10",
    ]
    flags = dict(zip(("--arch", "--lr"), ("xmlm_bert_small", "2e-3")))
    extra = list(spec.flags)
    for name in ("--arch", "--lr"):  # overparam replaces the defaults
        if name in extra:
            at = extra.index(name)
            flags[name] = extra[at + 1]
            del extra[at:at + 2]
    if spec.untrained:
        command += ["--arch", flags["--arch"], "--lr", flags["--lr"]]
    else:
        command += ["--arch", flags["--arch"], "--lr", flags["--lr"], "--lr-scheduler", "polynomial_decay",
                    "--warmup-updates", "50", "--total-num-update", total, "--max-epoch", epochs]
    if spec.needs_knn:
        command += ["--knn-replace", KNN_NEIGHBOURS, "--knn-table", knn_table]
    if run_id in CURVE_IDS and not spec.untrained:
        command += ["--eval-multilinguality", "--validate-interval-updates", preset["validate_every"]]
    if preset.get("valid_steps"):  # the dev loss on a few batches, not all 10k sentences, at every validation
        command += ["--max-valid-steps", preset["valid_steps"]]
    if os.environ.get("XMLM_CPU", "") == "1" or not _has_cuda():
        command += ["--cpu", "--num-workers", "0"]
    return command + extra + list(train_args)


def _has_cuda():
    import torch

    return torch.cuda.is_available()


def checkpoint_of(run_id, run_dir):
    name = "checkpoint_untrained.pt" if RUNS[run_id].untrained else "checkpoint_last.pt"
    return run_dir / "checkpoints" / name


def evaluate_command(run_id, run_dir, data, preset, on_cpu=False):
    command = [*module("fairseq_xmlm.evaluation.eval_mult"), checkpoint_of(run_id, run_dir), "--data", data,
               "--json", run_dir / "eval.json"]
    if preset["eval_sentences"]:
        command += ["--max-sentences", preset["eval_sentences"]]
    if preset["eval_train_sentences"]:
        command += ["--max-train-sentences", preset["eval_train_sentences"]]
    if on_cpu:  # beside training: yield the cores to its processes and their compiling; two threads (gpu_pack: one)
        return ["nice", "-n", "19", "env", "OMP_NUM_THREADS=2", *command, "--device", "cpu"]
    # TF32 products: half the GPU time of a BERT-base evaluation, which slows the training team beside it while it
    # runs; the metrics moved by 1e-5 or less (eval_mult --tf32)
    return command + (["--tf32"] if _has_cuda() else [])


def small_model(command):
    """Whether a training command's model is Dufter's BERT-small (not overparam's BERT-base)."""
    return command[command.index("--arch") + 1] == "xmlm_bert_small"


def trained(run_id, run_dir):
    return checkpoint_of(run_id, run_dir).exists() and (run_dir / "train.log").exists()


def run_state(run_id, run_dir):
    """Where one run stands: evaluated, trained (not yet evaluated), started (its training log still growing, or
    its packed group suspended), or pending."""
    if (run_dir / "eval.json").exists():
        return "evaluated"
    if trained(run_id, run_dir):
        return "trained"
    return "started" if (run_dir / "train.log.partial").exists() else "pending"


def print_status(runs_dir, ids, seeds):
    """One line per run ID: how many of its seeds are in each state (see `run_state`)."""
    states = ("evaluated", "trained", "started", "pending")
    for run_id in ids:
        counts = [run_state(run_id, runs_dir / run_id / f"seed{seed}") for seed in seeds]
        print(f"{run_id:>4} {RUNS[run_id].description:<45} "
              + "  ".join(f"{state} {counts.count(state)}" for state in states))


def run_one(run_id, seed, data, runs_dir, preset, knn_table, dry_run, train_args=()):
    run_dir = runs_dir / run_id / f"seed{seed}"
    if (run_dir / "eval.json").exists():
        log(f"run {run_id} seed {seed}: done already ({run_dir / 'eval.json'})")
        return
    save_dir = run_dir / "checkpoints"
    if not dry_run:
        run_dir.mkdir(parents=True, exist_ok=True)
    if not trained(run_id, run_dir):
        if not dry_run:
            shutil.rmtree(save_dir, ignore_errors=True)  # a half-finished training restarts from scratch
        run(train_command(run_id, seed, data, save_dir, preset, knn_table, train_args), dry_run,
            run_dir / "train.log")
    run(evaluate_command(run_id, run_dir, data, preset), dry_run)


def run_all_packed(pending, data, runs_dir, results, preset, knn_table, slots, max_group, dry_run, compile=None,
                   lockstep=False, eval_cpu=False):
    """--gpu-pack: every trained run goes through fairseq_xmlm.packed_training (stacked models, one process per group
    or, with `lockstep`, per team of groups), all side by side and spread over the GPUs when there are several;
    beside them, in a quarter of the slots, the untrained checkpoints are made and the runs trained before but not
    evaluated are evaluated. Each run is evaluated as soon as its checkpoint exists, so a sweep stopped midway keeps
    every result it finished. With `eval_cpu`, a BERT-small run whose group ends while others have yet to train is
    evaluated on the CPU, and so is an untrained BERT-small run when any run trains: evaluations on the GPU share
    it with the training by time slices (in the twenty-fifth session's sweep a team beside the previous team's 14
    evaluations and the next team's warm-up averaged about 61 ms an update, against 52 later in its training; in the
    twenty-ninth's, the no-parallel group trained at 73 updates/s beside the untrained runs' GPU evaluations and at
    82 in its last 17 s without them, docs/benchmarks.md).
    Prints and saves the stage times."""
    from fairseq_xmlm.gpu_pack import run_packed, several_gpus

    results.mkdir(parents=True, exist_ok=True)
    stages, ready, untrained, commands, then, then_beside = {}, [], [], [], {}, {}
    for run_id, seed in pending:
        run_dir = runs_dir / run_id / f"seed{seed}"
        evaluation = [list(map(str, evaluate_command(run_id, run_dir, data, preset)))]
        if trained(run_id, run_dir):
            ready += evaluation
            continue
        command = train_command(run_id, seed, data, run_dir / "checkpoints", preset, knn_table)
        if RUNS[run_id].untrained:
            untrained.append((list(map(str, command)), run_id, run_dir))
        else:
            commands.append(list(map(str, command + ["--log-file", run_dir / "train.log"])))
            then[tuple(commands[-1])] = evaluation
            if eval_cpu and small_model(command):
                then_beside[tuple(commands[-1])] = [list(map(str, evaluate_command(run_id, run_dir, data, preset,
                                                                                  on_cpu=True)))]
    beside_training = eval_cpu and bool(commands)
    untrained = [(command, [list(map(str, evaluate_command(run_id, run_dir, data, preset,
                                                           on_cpu=beside_training and small_model(command))))])
                 for command, run_id, run_dir in untrained]
    if dry_run:
        for command in ready + [c for pair in untrained for c in (pair[0], *pair[1])]:
            log("+ " + " ".join(command))
        for command in commands:
            log("+ " + " ".join(command))
            log("+ " + " ".join(then[tuple(command)][0]))
            if tuple(command) in then_beside:
                log("+ (while other groups train) " + " ".join(then_beside[tuple(command)][0]))
        return
    started, side_failed, training_failed = time.perf_counter(), [], threading.Event()

    def untrained_and_ready():
        # beside the training processes, whose first minutes are compiling on the CPU: before them, these held up
        # the 5-seed sweep's training for 140 s on an H200 (docs/benchmarks.md, twenty-first session)
        try:
            run_packed(ready + [pair[0] for pair in untrained], max(1, slots // 4) if commands else slots,
                       results / "logs" / "untrained_and_ready", devices=several_gpus(),
                       then=[[]] * len(ready) + [pair[1] for pair in untrained], stop=training_failed.is_set)
        except XmlmError as error:
            side_failed.append(error)
        stages["untrained_and_ready_s"] = time.perf_counter() - started

    side = threading.Thread(target=untrained_and_ready, name="untrained_and_ready")
    side.start()
    try:
        if commands:
            from fairseq_xmlm.packed_training import train_side_by_side

            # the validations' products in TF32 on a GPU, as the evaluations' (evaluate_command)
            train_side_by_side(commands, results / "pack", max_group, slots=slots, then=then, compile=compile,
                               lockstep=lockstep, then_beside=then_beside, tf32=_has_cuda())
        stages["training_and_evaluation_s"] = time.perf_counter() - started
    except BaseException:
        training_failed.set()  # its untrained runs and evaluations stop too
        raise
    finally:
        side.join()
    if side_failed:
        raise side_failed[0]
    stages["total_s"] = time.perf_counter() - started  # the two stages ran side by side, from the start
    stages.update(runs=len(pending), trained_runs=len(commands), device=_device_name(),
                  date=time.strftime("%Y-%m-%d %H:%M"))
    timing = results / "packed_timing.json"  # one record per invocation: a table may take several
    earlier = json.loads(timing.read_text()) if timing.exists() else []
    timing.write_text(json.dumps((earlier if isinstance(earlier, list) else [earlier]) + [stages], indent=1))
    log("gpu-pack: " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in stages.items()))


def _device_name():
    import torch

    count = torch.cuda.device_count()
    return f"{count} x {torch.cuda.get_device_name()}" if count else "cpu"


def write_figures(runs_dir, out_dir, data):
    """Fig. 4 (ID 0), Fig. 5/8 (IDs 1 and 9), Fig. 6/7 (IDs 0, 15, 30) from whichever runs exist."""
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.evaluation import figures
    from fairseq_xmlm.evaluation.multilinguality import word_vectors

    def first_checkpoint(run_id):
        found = sorted((runs_dir / run_id).glob("seed*/checkpoints/checkpoint_last.pt"))
        return found[0] if found else None

    if checkpoint := first_checkpoint("0"):
        model, task, _ = load_checkpoint(checkpoint, data=str(data))
        words, vectors = word_vectors(model, task, layers=(0,))
        english, fake = vectors[0]
        figures.plot_token_pca(english, fake, [task.dictionary[w] for w in words], out_dir / "fig4_token_pca.png")
    panels = {}
    for run_id in ("1", "9"):
        if checkpoint := first_checkpoint(run_id):
            model, _, _ = load_checkpoint(checkpoint, data=str(data))
            panels[f"{run_id}: {RUNS[run_id].description}"] = figures.position_similarity(
                [table.weight for table in model.position_embeddings])
    if panels:
        figures.plot_position_similarity(panels, out_dir / "fig5_position_similarity.png")
    curves = {f"{run_id}: {RUNS[run_id].description}": sorted((runs_dir / run_id).glob("seed*/train.log"))
              for run_id in CURVE_IDS}
    curves = {label: logs for label, logs in curves.items() if logs}
    if curves:
        figures.plot_training_curves(curves, out_dir / "fig6_7_training_curves.png")


def write_report(runs_dir, results, data, ids):
    for path in write_tables(runs_dir, results, ids=ids):
        log(f"wrote {path}")
        print(path.read_text())
    if importlib.util.find_spec("matplotlib") is None:  # e.g. a GPU machine with the training stack only
        log("figures skipped: matplotlib is not installed here; `run.py --report` draws them where it is")
        return
    write_figures(runs_dir, results, data)


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", choices=sorted(PRESETS), default="full")
    parser.add_argument("--seeds", type=int, help="how many of the paper's seeds (default: the preset's)")
    parser.add_argument("--ids", help="comma-separated run IDs (default: every ID of Tables 1 and 2)")
    parser.add_argument("--data", default=str(REPO / "data-bin" / "fake_english"))
    parser.add_argument("--results", default=str(REPO / "results" / "dufter"))
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
                             "as CUDA graphs (fairseq_xmlm.packed_training, bf16), each run evaluated once trained; "
                             "SIGTERM suspends the groups, a rerun resumes them; --train-args do not apply")
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
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    ids = args.ids.split(",") if args.ids else list(preset.get("ids", dict.fromkeys(TABLE1_IDS + TABLE2_IDS)))
    unknown = [run_id for run_id in ids if run_id not in RUNS]
    if unknown:
        raise XmlmError(f"unknown run IDs {unknown}; known: {', '.join(RUNS)}")
    seeds = SEEDS[: args.seeds or preset["seeds"]]
    data, results = Path(args.data), Path(args.results)
    runs_dir = results / "runs"
    if args.status:
        print_status(runs_dir, ids, seeds)
        return
    if args.report:
        write_report(runs_dir, results, data, ids)
        return
    if args.gpu_pack and not args.dry_run and not _has_cuda():  # bf16 stacked models on a CPU: hours per run
        raise XmlmError("--gpu-pack trains on a GPU and none is visible here; without --gpu-pack each run is a "
                        "fairseq-train on the CPU")
    ensure_data(data, args.dry_run)
    knn_table = results / "knn_table.pt"
    if any(RUNS[run_id].needs_knn for run_id in ids) and not knn_table.exists():
        run([*module("fairseq_xmlm.knn_table"), "--data", data, "--fake-english", "--k", KNN_NEIGHBOURS, "--out", knn_table],
            args.dry_run)
    if args.gpu_pack:
        if args.train_args:
            raise XmlmError("--train-args apply to fairseq-train runs, not to --gpu-pack")
        pending = [(run_id, seed) for run_id in ids for seed in seeds
                   if not (runs_dir / run_id / f"seed{seed}" / "eval.json").exists()]
        slots = args.pack_slots or max(1, (os.cpu_count() or 2) // 2)
        run_all_packed(pending, data, runs_dir, results, preset, knn_table, slots, args.pack_max_group, args.dry_run,
                       False if args.pack_eager else None, args.pack_lockstep, args.pack_eval_cpu)
    else:
        for run_id in ids:
            for seed in seeds:
                run_one(run_id, seed, data, runs_dir, preset, knn_table, args.dry_run, shlex.split(args.train_args))
    if not args.dry_run:
        write_report(runs_dir, results, data, ids)


if __name__ == "__main__":
    main()
