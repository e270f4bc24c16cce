"""How fast do Dufter's runs train as packed groups (`fairseq_xmlm.packed`), and where does a packed step spend its
time on the GPU?

    python3 benchmarks/packed_speed.py steps --groups 15,16,17 0,1,2,3,4,5,6,7,8,9,30 --variants eager,compile \
        --out DIR/steps
    python3 benchmarks/packed_speed.py sweep --ids 0,2,15 --seeds 5 --updates 300 --out DIR/sweep

steps: each group is a list of run IDs of `python -m fairseq_xmlm.experiments.dufter full`, for the first --seeds of
its seeds, all stacked into one model (each run on its own seed's batches, as the packed trainer does; the recipe's
groups mostly hold one seed). For every group and variant (eager; compile = the stacked layers and the optimizer
step under torch.compile; compile_graphs = compile, and each batch shape's whole update replayed as a CUDA graph) in
this process, one after another: --warmup steps (more than an epoch's batches, 137 under the default schedule, so
every batch shape has been compiled and captured; the time is printed), --steps timed steps (synchronised wall: ms
per step, run-updates/s, tokens/s; peak GPU memory; the runs' mean loss at step 1 and at the last timed step, a
check that the step trains), then --profile-steps under torch.profiler: kernel time per step, by kind of kernel and
by kernel, against the profiled wall (the rest is the GPU waiting on the host). Real batches of epoch 1, in
fairseq's order. Writes DIR/packed_speed.json and, per group and variant, the profiler's operator table by host time
(.txt), every kernel's ms and launches per step (_kernels.tsv) and, with --trace, the profiled steps' timeline
(.trace.json.gz). With --plugin DIR the runs use another fairseq_xmlm tree (an earlier commit, to compare on the
same machine); --inductor KEY=VALUE sets inductor's options. With --beside COMMAND (repeatable) the --steps are
timed again while those shell commands run, e.g. the evaluations that a sweep runs beside a training team:

    EVAL="nice -n 19 env OMP_NUM_THREADS=2 python3 -m fairseq_xmlm.evaluation.eval_mult CHECKPOINT \
        --data data-bin/fake_english --device cpu"
    python3 benchmarks/packed_speed.py steps --groups 15,16,17 --variants compile_graphs --warmup 75 --steps 300 \
        --beside "$EVAL" --beside "$EVAL" --out DIR/beside

Both modes take the recipe's commands under --schedule (default: the recipe's default, `paper-code-padding-specials`:
batches of 128 sentences, clipping at 1.0, padding of random mixed batches attended; `paper-code`: the same with
padding masked in batches of like lengths; `2026-11-28`: batches of 256, unclipped).

sweep: the recipe's fairseq-train commands of the chosen runs (--ids, --seeds; the paper's BERT-small / BERT-base),
each capped at --updates, trained as `--gpu-pack` trains them (`packed.processes.train_side_by_side`:
one process per group, side by side); prints per group its runs, updates, seconds and run-updates/s, then the total
wall time (start-up included) and rates; everything also goes to DIR/packed_speed.json.
"""
import argparse
import ast
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from _common import recipe_commands, synchronise
from _kernels import kernel_kind, kernel_times, stream_times, write_kernel_table

HERE = Path(__file__).resolve().parent


def cycling_steps(group, schedules):
    """A function that makes the group's next step, every run on its own seed's next batch (epoch 1's, cycling), and
    returns what `PackedGroup.step` does (summed losses, target counts, batch ending with the real tokens)."""
    steps = iter(range(10 ** 9))

    def step():
        at = next(steps) % len(schedules[0])
        return group.step([schedule[at] for schedule in schedules])

    return step


def mean_loss(outputs):
    """The runs' mean masked-token loss (nats) of one step; read at once, a CUDA graph's outputs are overwritten
    by its next replay."""
    losses, counts, _ = outputs
    return round(float((losses / counts.clamp(min=1)).mean()), 3)


def profile_group(group, schedules, args, device):
    """Warm-up, timed and profiled steps of one PackedGroup -> (result dict, profiler)."""
    step = cycling_steps(group, schedules)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    first_loss = None  # the fresh models' (the first warm-up step's); the last timed step's shows that they train
    for _ in range(args.warmup):
        outputs = step()
        if first_loss is None:
            first_loss = mean_loss(outputs)
    synchronise(device)
    warmup_s = time.perf_counter() - started
    wall, tokens, outputs = time_steps(step, args.steps, device)
    last_loss = mean_loss(outputs)
    beside = time_beside(step, args, device) if args.beside else {}
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch.profiler.profile(activities=activities) as profiler:
        started = time.perf_counter()
        for _ in range(args.profile_steps):
            step()
        synchronise(device)
        profiled_wall = time.perf_counter() - started
    events = profiler.events()
    kinds, kernels = {}, kernel_times(events)
    for name, us in kernels.items():
        kind = kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + us / 1e3 / args.profile_steps
    n = len(schedules)
    result = {
        "stacked": n, "warmup_s": round(warmup_s, 1), "ms_per_step": round(1e3 * wall / args.steps, 2),
        "run_updates_per_s": round(n * args.steps / wall, 1), "tokens_per_s": round(tokens / wall),
        "loss_first_step": first_loss, "loss_last_timed_step": last_loss,
        "profiled_ms_per_step": round(1e3 * profiled_wall / args.profile_steps, 2),
        "kernel_ms_per_step": round(stream_times(events)[0] / 1e3 / args.profile_steps, 2),
        "peak_gpu_gb": round(torch.cuda.max_memory_allocated() / 1e9, 1) if device.type == "cuda" else None,
        "kernel_ms_per_step_by_kind": {k: round(v, 3) for k, v in sorted(kinds.items(), key=lambda kv: -kv[1])},
        "top_kernels_ms_per_step": {k[:120]: round(v / 1e3 / args.profile_steps, 3)
                                    for k, v in sorted(kernels.items(), key=lambda kv: -kv[1])[:25]}, **beside}
    return result, profiler


def time_steps(step, count, device):
    """`count` steps, synchronised: (wall seconds, their real tokens, the last step's outputs)."""
    started, tokens = time.perf_counter(), 0
    for _ in range(count):
        outputs = step()
        tokens += outputs[2][-1]
    synchronise(device)
    return time.perf_counter() - started, tokens, outputs


def time_beside(step, args, device):
    """--steps more steps while the --beside commands run (started --beside-after seconds before, then waited for):
    ms per step beside them, how many were still running when the steps ended (all: timed beside all of them all
    the way), and their exit codes."""
    others = [subprocess.Popen(["bash", "-c", command]) for command in args.beside]
    try:
        time.sleep(args.beside_after)
        wall, _, _ = time_steps(step, args.steps, device)
        running = sum(other.poll() is None for other in others)
    finally:
        codes = [other.wait() for other in others]
    return {"beside": args.beside, "beside_after_s": args.beside_after,
            "ms_per_step_beside": round(1e3 * wall / args.steps, 2), "beside_running_at_end": running,
            "beside_exit_codes": codes}


def report(result, ids, variant):
    print(f"[packed_speed] runs {ids} ({result['layers_x_hidden']}, {result['stacked']} stacked) {variant}: "
          f"{result['ms_per_step']} ms/step, {result['run_updates_per_s']} run-updates/s, {result['tokens_per_s']} "
          f"tokens/s; loss {result['loss_first_step']} -> {result['loss_last_timed_step']} (mean of the runs, step 1 "
          f"-> last timed step); warm-up {result['warmup_s']}s; profiled {result['profiled_ms_per_step']} ms/step of "
          f"which kernels {result['kernel_ms_per_step']} ms; peak GPU memory {result['peak_gpu_gb']} GB"
          + (f"; {result['cuda_graphs']} CUDA graphs captured in {result['capture_s']}s" if result["cuda_graphs"]
             else ""), flush=True)
    if "beside" in result:
        print(f"[packed_speed]   beside {len(result['beside'])} commands (started {result['beside_after_s']}s before "
              f"the steps; {result['beside_running_at_end']} still running at their end; exit codes "
              f"{result['beside_exit_codes']}): {result['ms_per_step_beside']} ms/step, "
              f"{result['ms_per_step'] / result['ms_per_step_beside']:.3f} of the rate alone", flush=True)
    for kind, ms in result["kernel_ms_per_step_by_kind"].items():
        print(f"[packed_speed]   {ms:7.2f} ms  {kind}", flush=True)
    for name, ms in list(result["top_kernels_ms_per_step"].items())[:8]:
        print(f"[packed_speed]     {ms:7.3f} ms  {name[:100]}", flush=True)

def steps(args):
    """Each group's steps, variant by variant, in this process."""
    for setting in args.inductor:
        key, _, value = setting.partition("=")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass  # a string setting
        setattr(torch._inductor.config, key, value)
    if args.plugin:  # before anything imports this checkout's fairseq_xmlm
        sys.path.insert(0, str(Path(args.plugin).resolve().parent))
    try:
        from fairseq_xmlm.packed.group import PackedGroup
        from fairseq_xmlm.packed.runs import epoch_batches, parse_run
    except ImportError:  # a --plugin tree from before the package: its packed_training module
        from fairseq_xmlm.packed_training import PackedGroup, epoch_batches, parse_run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for ids in args.groups:
        commands = recipe_commands(ids.split(","), args.seeds, Path(args.data), out / "runs", 10 ** 6, args.knn_table,
                                   schedule=args.schedule)
        if args.plugin:
            commands = [[str(Path(args.plugin).resolve()) if word.endswith("fairseq_xmlm") else word for word in c]
                        for c in commands]
        runs = [parse_run(c).build() for c in commands]
        schedules = [epoch_batches(run, 1) for run in runs]
        for variant in args.variants.split(","):
            options = {}
            if variant.startswith("compile"):
                torch._dynamo.reset()  # compiled functions are shared by groups: start their caches afresh for this one
                options["compile"] = True
            if variant == "compile_graphs":
                options["cuda_graphs"] = True
            group = PackedGroup(runs, device, **options)
            if args.no_dropout:
                group.dropouts = (0.0, 0.0, 0.0)
            result, profiler = profile_group(group, schedules, args, device)
            result = {"runs": ids, "seeds": sorted({run.cfg.common.seed for run in runs}), "variant": variant,
                      "schedule": args.schedule or "default", "batch_sentences": runs[0].cfg.dataset.batch_size,
                      "dropout": not args.no_dropout, "inductor": args.inductor,
                      "layers_x_hidden": f"{runs[0].cfg.model.encoder_layers}x{runs[0].cfg.model.encoder_embed_dim}",
                      **result, "cuda_graphs": len(group.graphs) if group.graphs is not None else None,
                      "capture_s": round(group.capture_seconds, 1),
                      "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}
            results.append(result)
            report(result, ids, variant)
            # the host's side: where a step that is not GPU-bound spends its time
            stem = out / f"{ids.replace(',', '-')}_{len(runs)}_{variant}"
            stem.with_suffix(".txt").write_text(
                profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))
            write_kernel_table(profiler.events(), args.profile_steps, Path(f"{stem}_kernels.tsv"))
            if args.trace:
                profiler.export_chrome_trace(f"{stem}.trace.json")
                with open(f"{stem}.trace.json", "rb") as f, gzip.open(f"{stem}.trace.json.gz", "wb") as z:
                    z.write(f.read())
                Path(f"{stem}.trace.json").unlink()
            (out / "packed_speed.json").write_text(json.dumps({"results": results, "argv": sys.argv[1:]}, indent=1))
            del group
            if device.type == "cuda":
                torch.cuda.empty_cache()


def sweep(args):
    """The chosen runs trained as --gpu-pack trains them; their groups' rates and the wall time."""
    from fairseq_xmlm.packed.processes import Job, train_side_by_side

    out = Path(args.out)
    commands = recipe_commands(args.ids.split(","), args.seeds, Path(args.data), out, args.updates, args.knn_table,
                               schedule=args.schedule)
    result = train_side_by_side([Job(command) for command in commands], out / "pack", args.max_group)
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
    (out / "packed_speed.json").write_text(json.dumps({**result, "args": vars(args)}, indent=1))


def main():
    shared = argparse.ArgumentParser(add_help=False)
    shared.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    shared.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    shared.add_argument("--out", required=True)
    shared.add_argument("--schedule", default=None,
                        help="the recipe's schedule the runs train under (default: the recipe's default)")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    modes = parser.add_subparsers(dest="mode", required=True)
    one = modes.add_parser("steps", parents=[shared], help="each group's steps: timed, then profiled")
    one.add_argument("--seeds", type=int, default=1, help="stack the runs of the recipe's first SEEDS seeds")
    one.add_argument("--groups", nargs="+", default=["15,16,17", "0,1,2,3,4,5,6,7,8,9,30"])
    one.add_argument("--variants", default="eager,compile")
    one.add_argument("--warmup", type=int, default=80)
    one.add_argument("--steps", type=int, default=100)
    one.add_argument("--profile-steps", type=int, default=10)
    one.add_argument("--plugin", help="a fairseq_xmlm folder to use instead of this checkout's")
    one.add_argument("--trace", action="store_true", help="also write the profiled steps' timeline (.trace.json.gz)")
    one.add_argument("--no-dropout", action="store_true",
                     help="train without dropout (hidden, attention, activation): what dropout costs a step")
    one.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                     help="set torch._inductor.config.KEY (a Python literal, else a string) before anything "
                          "compiles, e.g. max_autotune=True; repeatable")
    one.add_argument("--beside", action="append", default=[], metavar="COMMAND",
                     help="time --steps more steps while this shell command runs (e.g. an evaluation on the CPU, as "
                          "the sweep runs them beside a training team); repeatable, all run at once")
    one.add_argument("--beside-after", type=float, default=10.0, metavar="SECONDS",
                     help="start the timed steps this long after the --beside commands (their start-up)")
    whole = modes.add_parser("sweep", parents=[shared],
                             help="the runs trained as --gpu-pack trains them, processes side by side")
    whole.add_argument("--seeds", type=int, default=5, help="the runs of the recipe's first SEEDS seeds")
    whole.add_argument("--ids", default="0,2,15", help="run IDs of the recipe, trained ones only")
    whole.add_argument("--updates", type=int, default=300, help="updates per run (cap)")
    whole.add_argument("--max-group", type=int, default=40)
    args = parser.parse_args()
    if args.mode == "steps" and min(args.warmup, args.steps - 1, args.profile_steps - 1) < 0:
        parser.error("--warmup must be >= 0, --steps and --profile-steps >= 1 (they divide the times)")
    (steps if args.mode == "steps" else sweep)(args)


if __name__ == "__main__":
    sys.exit(main())
