"""The commands of one Dufter run (fairseq-train or xmlm-untrained, then xmlm-eval-mult), running them one after
another, and where each run stands.

Every run lives in RESULTS/runs/ID/seedS/: checkpoints/, train.log (renamed from train.log.partial when the
training ends) and eval.json. A run whose eval.json exists is done, so an interrupted recipe resumes where it
stopped.
"""
import math
import os
import shutil
from pathlib import Path

from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.commands import python_module, run_command
from fairseq_xmlm.experiments.dufter.runs import BATCH_SIZE, CURVE_IDS, KNN_NEIGHBOURS, RUNS
from fairseq_xmlm.io import log

PACKAGE = Path(__file__).resolve().parents[2]  # fairseq_xmlm/, the --user-dir of every training
REPO = PACKAGE.parent  # the default home of data/, data-bin/ and results/ (an editable install)
BIBLE = REPO / "data" / "bible_dufter"


def ensure_data(data, dry_run):
    """The BBE and KJV Bibles fetched and Dufter's Fake-English data-bin prepared, unless `data` has a dictionary."""
    if (data / "dict.txt").exists():
        return
    run_command([*python_module("fairseq_xmlm.data.bible"), "--versions", "en:3,en_kjv:k", "--out", BIBLE], dry_run)
    run_command([*python_module("fairseq_xmlm.data.prepare"), "fake-english", "--bible-dir", BIBLE, "--out", data],
                dry_run)


def scheduled(preset, spec):
    """The preset with the schedule's (a runs.Schedule) batch size (unless the preset sets its own), epochs (times
    its own), gradient clipping, no-random MASK share, attended padding, shift-special after masking and overparam's
    micro-batches."""
    return {**preset, "batch_size": preset.get("batch_size", spec.batch_size),
            "epochs": preset["epochs"] * spec.epoch_factor, "clip_norm": spec.clip_norm,
            "no_random_mask_share": spec.no_random_mask_share, "attend_padding": spec.attend_padding,
            "shift_special_after_masking": spec.shift_special_after_masking,
            "overparam_micro_batch": spec.overparam_micro_batch}


def batch_options(batch_size, micro_batch):
    """fairseq-train's options for batches of `batch_size` sentences, accumulated from micro-batches of `micro_batch`
    (0: none). fairseq's --update-freq K groups K batches of the epoch: ceil(ceil(n / m) / K) = ceil(n / (m K))
    updates an epoch, as many as batches of m K give."""
    if not micro_batch or micro_batch >= batch_size:
        return ["--batch-size", batch_size]
    if batch_size % micro_batch:
        raise XmlmError(f"micro-batches of {micro_batch} do not divide batches of {batch_size}")
    return ["--batch-size", micro_batch, "--update-freq", batch_size // micro_batch]


def schedule_data(data, spec, dry_run):
    """The data-bin a schedule (a runs.Schedule) trains on: `data` itself, or with clause units DATA_clauses cut from
    it (made here)."""
    if not spec.clauses:
        return data
    clauses = data.with_name(data.name + "_clauses")
    if not (clauses / "dict.txt").exists():
        run_command([*python_module("fairseq_xmlm.data.prepare"), "fake-english-clauses", "--data", data,
                     "--out", clauses], dry_run)
    return clauses


def indomain_data(data, dry_run, bible=BIBLE):
    """DATA_indomain: `data` with the in-domain dev set (BBE Old Testament sentences) instead of KJV (made here)."""
    indomain = data.with_name(data.name + "_indomain")
    if not (indomain / "dict.txt").exists():
        run_command([*python_module("fairseq_xmlm.data.prepare"), "fake-english-indomain", "--data", data,
                     "--bible-dir", bible, "--out", indomain], dry_run)
    return indomain


def ensure_knn_table(data, knn_table, dry_run):
    if not knn_table.exists():
        run_command([*python_module("fairseq_xmlm.analysis.knn_table"), "--data", data, "--fake-english",
                     "--k", KNN_NEIGHBOURS, "--out", knn_table], dry_run)


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
        *python_module("fairseq_xmlm.untrained" if spec.untrained else "fairseq_cli.train"), data,
        "--user-dir", PACKAGE, "--task", "fake_english",
        "--criterion", "xmlm_masked_lm", "--optimizer", "adam", "--adam-eps", "1e-6", "--weight-decay", "0.01",
        *batch_options(batch_size, preset.get("overparam_micro_batch", 0) if spec.overparam else 0),
        "--save-dir", save_dir, "--seed", seed, "--no-epoch-checkpoints",
        "--log-format", "json", "--log-interval", "10",
    ]
    flags = dict(zip(("--arch", "--lr"), ("xmlm_bert_small", preset.get("lr", "2e-3"))))
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
    if preset.get("clip_norm") and not spec.untrained:
        command += ["--clip-norm", preset["clip_norm"]]
    if preset.get("no_random_mask_share") and "--no-random" in spec.flags:
        command += ["--no-random-mask-share", preset["no_random_mask_share"]]
    if preset.get("attend_padding"):  # untrained runs too: the evaluation attends to padding as the model was trained
        command += ["--attend-padding"]
    if preset.get("shift_special_after_masking") and "--shift-special" in spec.flags and not spec.untrained:
        command += ["--shift-special-after-masking"]
    if preset.get("max_update"):  # the tiny presets: a few updates of the whole schedule
        command += ["--max-update", preset["max_update"]]
    if preset.get("valid_steps"):  # the dev loss on a few batches, not all 10k sentences, at every validation
        command += ["--max-valid-steps", preset["valid_steps"]]
    if os.environ.get("XMLM_CPU", "") == "1" or not has_gpu():
        command += ["--cpu", "--num-workers", "0"]
    return command + extra + list(train_args)


def capped_command(run_id, seed, data, run_dir, preset, knn_table, updates, multilinguality=False):
    """`train_command` of one run stopped after `updates` updates, its checkpoints in run_dir/checkpoints and its
    log in run_dir/train.log, without the multilinguality hook (a timing or a probe of training) unless
    `multilinguality`."""
    command = [str(c) for c in train_command(run_id, seed, data, Path(run_dir) / "checkpoints", preset, knn_table)]
    if "--eval-multilinguality" in command and not multilinguality:
        command.remove("--eval-multilinguality")
    return command + ["--max-update", str(updates), "--log-file", str(Path(run_dir) / "train.log")]


def checkpoint_of(run_id, run_dir):
    name = "checkpoint_untrained.pt" if RUNS[run_id].untrained else "checkpoint_last.pt"
    return run_dir / "checkpoints" / name


def evaluate_command(run_id, run_dir, data, preset, on_cpu=False, name="eval.json"):
    command = [*python_module("fairseq_xmlm.evaluation.eval_mult"), checkpoint_of(run_id, run_dir), "--data", data,
               "--json", run_dir / name]
    if preset["eval_sentences"]:
        command += ["--max-sentences", preset["eval_sentences"]]
    if preset["eval_train_sentences"]:
        command += ["--max-train-sentences", preset["eval_train_sentences"]]
    if on_cpu:  # beside training: yield the cores to its processes and their compiling; two threads (run_jobs: one)
        return ["nice", "-n", "19", "env", "OMP_NUM_THREADS=2", *command, "--device", "cpu"]
    # TF32 products: half the GPU time of a BERT-base evaluation, which slows the training team beside it while it
    # runs; the metrics moved by 1e-5 or less (eval_mult --tf32)
    return command + (["--tf32"] if has_gpu() else [])


def evaluate_indomain(pending, runs_dir, data, preset, dry_run):
    """Each (run ID, seed) of `pending` that has a checkpoint evaluated on `indomain_data`'s dev set into
    eval_indomain.json, unless that exists: on a GPU several at a time (`packed.processes.run_jobs`, logs in
    RUNS_DIR/../logs/indomain/), else one after another."""
    commands = []
    for run_id, seed in pending:
        run_dir = runs_dir / run_id / f"seed{seed}"
        if (run_dir / "eval_indomain.json").exists() or not (dry_run or checkpoint_of(run_id, run_dir).exists()):
            continue
        commands.append(evaluate_command(run_id, run_dir, data, preset, name="eval_indomain.json"))
    if dry_run or not has_gpu():
        for command in commands:
            run_command(command, dry_run)
        return
    from fairseq_xmlm.packed.processes import Job, run_jobs

    for command in commands:
        log("+ " + " ".join(map(str, command)))
    run_jobs([Job(list(map(str, command))) for command in commands], max(1, (os.cpu_count() or 2) // 2),
             runs_dir.parent / "logs" / "indomain")


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
    """Train (unless trained) and evaluate one run with fairseq-train and xmlm-eval-mult, one after the other."""
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
        run_command(train_command(run_id, seed, data, save_dir, preset, knn_table, train_args), dry_run,
                    run_dir / "train.log")
    run_command(evaluate_command(run_id, run_dir, data, preset), dry_run)
