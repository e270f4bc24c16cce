"""--gpu-pack: every pending run of the recipe trained at once as stacked models on the GPU or GPUs, each run
evaluated as soon as its group has trained, so a sweep stopped midway keeps every result it finished.

Two stages run side by side from the start: the training (`packed.processes.train_side_by_side`, one process
per group or, with `lockstep`, per team of groups) and, in a quarter of the process slots, the untrained
checkpoints (made and evaluated) and the runs trained before but not yet evaluated. SIGTERM suspends the packed groups (they save their
state) and the same command resumes them.
"""
import json
import threading
import time

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter import recipe
from fairseq_xmlm.experiments.dufter.runs import RUNS
from fairseq_xmlm.io import log, write_json


def _argv(command):
    return list(map(str, command))


def planned_jobs(pending, data, runs_dir, preset, knn_table, eval_cpu=False, train_args=None):
    """The sweep's process records (`packed.processes.Job`): (trained runs: fairseq-train commands, each with its
    evaluation to follow, and with `eval_cpu` a BERT-small run's CPU evaluation for while other groups train;
    the side stage: evaluations of runs trained before, and untrained checkpoints with their evaluations).
    `train_args(run_id)`: extra fairseq-train options of that run (e.g. --clip-norm 1.0), which the packed training
    honours as fairseq-train would or refuses (`packed.runs.parse_run`)."""
    from fairseq_xmlm.packed.processes import Job

    ready, untrained, training = [], [], []
    for run_id, seed in pending:
        run_dir = runs_dir / run_id / f"seed{seed}"
        evaluation = [_argv(recipe.evaluate_command(run_id, run_dir, data, preset))]
        if recipe.trained(run_id, run_dir):
            ready.append(Job(evaluation[0]))
            continue
        command = recipe.train_command(run_id, seed, data, run_dir / "checkpoints", preset, knn_table,
                                       train_args(run_id) if train_args else ())
        if RUNS[run_id].untrained:
            untrained.append((command, run_id, run_dir))
            continue
        beside = [_argv(recipe.evaluate_command(run_id, run_dir, data, preset, on_cpu=True))] \
            if eval_cpu and recipe.small_model(command) else []
        training.append(Job(_argv(command + ["--log-file", run_dir / "train.log"]), then=evaluation,
                            then_beside=beside))
    beside_training = eval_cpu and bool(training)
    untrained = [Job(_argv(command), then=[_argv(recipe.evaluate_command(
                     run_id, run_dir, data, preset, on_cpu=beside_training and recipe.small_model(command)))])
                 for command, run_id, run_dir in untrained]
    return training, ready + untrained


def run_all_packed(pending, data, runs_dir, results, preset, knn_table, slots, max_group, dry_run, compile=None,
                   lockstep=False, eval_cpu=False, precision="bf16", train_args=None):
    """Train and evaluate the `pending` (run ID, seed) pairs; prints and saves (results/packed_timing.json) the
    stage times. `precision`: the stacked models' ("bf16": bf16 products with fp32 master weights; "fp32"), and
    `train_args` as `planned_jobs`'.

    With `eval_cpu`, a BERT-small run whose group ends while others have yet to train is evaluated on the CPU, and
    so is an untrained BERT-small run when any run trains: evaluations on the GPU share it with the training by
    time slices. A team beside the previous team's 14 evaluations and the next team's warm-up averaged 61.3 ms an
    update against about 52 later in its training (2026-11-28, one H200, commit a964e68); the no-parallel group
    trained at 73 updates/s beside the untrained runs' GPU evaluations and at 82 in its last 17 s without them
    (2026-11-28, one H200, commit 5f2dec0)."""
    training, side_jobs = planned_jobs(pending, data, runs_dir, preset, knn_table, eval_cpu, train_args)
    if dry_run:
        for job in side_jobs:
            for argv in (job.argv, *job.then):
                log("+ " + " ".join(argv))
        for job in training:
            log("+ " + " ".join(job.argv))
            log("+ " + " ".join(job.then[0]))
            if job.then_beside:
                log("+ (while other groups train) " + " ".join(job.then_beside[0]))
        return
    from fairseq_xmlm.packed import processes

    results.mkdir(parents=True, exist_ok=True)
    stages, side_failed, training_failed = {}, [], threading.Event()
    started = time.perf_counter()

    def untrained_and_ready():
        # beside the training processes, whose first minutes are compiling on the CPU: before them, these held up
        # the 5-seed sweep's training for 140 s (2026-11-27, one H200, commit a5dcd00; side by side since adc7f25)
        try:
            processes.run_jobs(side_jobs, max(1, slots // 4) if training else slots,
                               results / "logs" / "untrained_and_ready", devices=processes.several_gpus(),
                               stop=training_failed.is_set)
        except XmlmError as error:
            side_failed.append(error)
        stages["untrained_and_ready_s"] = time.perf_counter() - started

    side = threading.Thread(target=untrained_and_ready, name="untrained_and_ready")
    side.start()
    try:
        if training:
            # the validations' products in TF32 on a GPU, as the evaluations' (recipe.evaluate_command)
            processes.train_side_by_side(training, results / "pack", max_group, precision=precision, slots=slots,
                                         compile=compile, lockstep=lockstep, tf32=recipe.has_gpu())
        stages["training_and_evaluation_s"] = time.perf_counter() - started
    except BaseException:
        training_failed.set()  # its untrained runs and evaluations stop too
        raise
    finally:
        side.join()
    if side_failed:
        raise side_failed[0]
    stages["total_s"] = time.perf_counter() - started  # the two stages ran side by side, from the start
    stages.update(runs=len(pending), trained_runs=len(training), precision=precision, device=_device_name(),
                  date=time.strftime("%Y-%m-%d %H:%M"))
    timing = results / "packed_timing.json"  # one record per invocation: a table may take several
    earlier = json.loads(timing.read_text()) if timing.exists() else []
    write_json(timing, (earlier if isinstance(earlier, list) else [earlier]) + [stages])
    log("gpu-pack: " + ", ".join(f"{k} {v:.0f}" if isinstance(v, float) else f"{k} {v}" for k, v in stages.items()))


def _device_name():
    import torch

    count = torch.cuda.device_count()
    return f"{count} x {torch.cuda.get_device_name()}" if count else "cpu"
