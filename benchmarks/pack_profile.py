"""Where one packed-training step (fairseq_xmlm.packed_training) of Dufter's runs spends its time on the GPU.

    python3 benchmarks/pack_profile.py --groups 15,16,17 0,1,2,3,4,5,6,7,8,9,30 --variants eager,compile \
        --out OUT/pack_prof

Each group is a list of run IDs of `examples/dufter/run.py full`, for the first --seeds of its seeds, all stacked
into one model (each run on its own seed's batches, as packed_training does; the recipe's groups mostly hold one
seed). For every group and variant (eager; compile = the stacked layers and the optimizer step under torch.compile;
compile_graphs = compile, and each batch shape's whole update replayed as a CUDA graph) in this process,
one after another: --warmup steps (more than an epoch's 69 batches, so every batch shape has been compiled and
captured; the time is printed), --steps timed steps (synchronised wall: ms per step, run-updates/s,
tokens/s; peak GPU memory; the runs' mean loss at step 1 and at the last timed step, a check that the step
trains), then --profile-steps under torch.profiler: kernel time per step, by kind of kernel and by kernel, against
the profiled wall (the rest is the GPU waiting on the host).
Real batches of epoch 1, in fairseq's order. Writes OUT/pack_profile.json and, per group and variant, the profiler's
operator table by host time (.txt), every kernel's ms and launches per step (_kernels.tsv) and, with --trace, the
profiled steps' timeline (.trace.json.gz, chrome://tracing or Perfetto). With --plugin DIR the runs use another
fairseq_xmlm tree (an earlier commit, to compare in the same call); --inductor KEY=VALUE sets inductor's options
(max_autotune=True: matrix-product templates with fused epilogues). With --beside COMMAND (repeatable) the --steps
are timed again while those shell commands run, e.g. what the 5-seed sweep runs beside a training team (docs/
benchmarks.md, twenty-sixth session: teams 10-40 % slower there than alone):

    python3 examples/dufter/run.py full --ids 18 --seeds 1   # an untrained BERT-small checkpoint, and its eval
    CK=results/dufter/runs/18/seed0/checkpoints/checkpoint_untrained.pt
    EVAL="nice -n 19 env OMP_NUM_THREADS=2 python3 -m fairseq_xmlm.evaluation.eval_mult $CK \
        --data data-bin/fake_english --device cpu"
    python3 benchmarks/pack_profile.py --groups 15,16,17 --variants compile_graphs --warmup 75 --steps 300 \
        --beside "$EVAL" --beside "$EVAL" ... --out OUT/beside

Not a test.
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

HERE = Path(__file__).resolve().parent


def synchronise(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


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
    import profile_step

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
    kinds, kernels = {}, profile_step.kernel_times(events)
    for name, us in kernels.items():
        kind = profile_step.kernel_kind(name)
        kinds[kind] = kinds.get(kind, 0.0) + us / 1e3 / args.profile_steps
    n = len(schedules)
    result = {
        "stacked": n, "warmup_s": round(warmup_s, 1), "ms_per_step": round(1e3 * wall / args.steps, 2),
        "run_updates_per_s": round(n * args.steps / wall, 1), "tokens_per_s": round(tokens / wall),
        "loss_first_step": first_loss, "loss_last_timed_step": last_loss,
        "profiled_ms_per_step": round(1e3 * profiled_wall / args.profile_steps, 2),
        "kernel_ms_per_step": round(profile_step.stream_times(events)[0] / 1e3 / args.profile_steps, 2),
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


def write_kernel_table(events, steps, path):
    """Every kernel of the profiled steps: ms and launches per step, kind, name; the longest first."""
    import profile_step

    times, launches = profile_step.kernel_times(events), {}
    for event in filter(profile_step.is_kernel, events):
        launches[event.name] = launches.get(event.name, 0) + 1
    rows = [f"{us / 1e3 / steps:.4f}\t{launches[name] / steps:g}\t{profile_step.kernel_kind(name)}\t{name}"
            for name, us in sorted(times.items(), key=lambda kv: -kv[1])]
    path.write_text("ms_per_step\tlaunches_per_step\tkind\tkernel\n" + "\n".join(rows) + "\n")


def report(result, ids, variant):
    print(f"[pack_profile] runs {ids} ({result['layers_x_hidden']}, {result['stacked']} stacked) {variant}: "
          f"{result['ms_per_step']} ms/step, {result['run_updates_per_s']} run-updates/s, {result['tokens_per_s']} "
          f"tokens/s; loss {result['loss_first_step']} -> {result['loss_last_timed_step']} (mean of the runs, step 1 "
          f"-> last timed step); warm-up {result['warmup_s']}s; profiled {result['profiled_ms_per_step']} ms/step of "
          f"which kernels {result['kernel_ms_per_step']} ms; peak GPU memory {result['peak_gpu_gb']} GB"
          + (f"; {result['cuda_graphs']} CUDA graphs captured in {result['capture_s']}s" if result["cuda_graphs"]
             else ""), flush=True)
    if "beside" in result:
        print(f"[pack_profile]   beside {len(result['beside'])} commands (started {result['beside_after_s']}s before "
              f"the steps; {result['beside_running_at_end']} still running at their end; exit codes "
              f"{result['beside_exit_codes']}): {result['ms_per_step_beside']} ms/step, "
              f"{result['ms_per_step'] / result['ms_per_step_beside']:.3f} of the rate alone", flush=True)
    for kind, ms in result["kernel_ms_per_step_by_kind"].items():
        print(f"[pack_profile]   {ms:7.2f} ms  {kind}", flush=True)
    for name, ms in list(result["top_kernels_ms_per_step"].items())[:8]:
        print(f"[pack_profile]     {ms:7.3f} ms  {name[:100]}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", nargs="+", default=["15,16,17", "0,1,2,3,4,5,6,7,8,9,30"])
    parser.add_argument("--variants", default="eager,compile")
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--seeds", type=int, default=1, help="stack the runs of the recipe's first SEEDS seeds")
    parser.add_argument("--warmup", type=int, default=80)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--profile-steps", type=int, default=10)
    parser.add_argument("--plugin", help="a fairseq_xmlm folder to use instead of this checkout's")
    parser.add_argument("--trace", action="store_true", help="also write the profiled steps' timeline (.trace.json.gz)")
    parser.add_argument("--no-dropout", action="store_true",
                        help="train without dropout (hidden, attention, activation): what dropout costs a step")
    parser.add_argument("--inductor", action="append", default=[], metavar="KEY=VALUE",
                        help="set torch._inductor.config.KEY (a Python literal, else a string) before anything "
                             "compiles, e.g. max_autotune=True; repeatable")
    parser.add_argument("--beside", action="append", default=[], metavar="COMMAND",
                        help="time --steps more steps while this shell command runs (e.g. an evaluation on the "
                             "CPU, as the sweep runs them beside a training team); repeatable, all run at once")
    parser.add_argument("--beside-after", type=float, default=10.0, metavar="SECONDS",
                        help="start the timed steps this long after the --beside commands (their start-up)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    for setting in args.inductor:
        key, _, value = setting.partition("=")
        try:
            value = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            pass  # a string setting
        setattr(torch._inductor.config, key, value)
    if args.plugin:
        sys.path.insert(0, str(Path(args.plugin).resolve().parent))
    sys.path.insert(1, str(HERE))
    import pack_speed
    from fairseq_xmlm import packed_training

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    results = []
    for ids in args.groups:
        commands = pack_speed.recipe_commands(ids.split(","), args.seeds, Path(args.data), out / "runs", 10 ** 6,
                                              args.knn_table)
        if args.plugin:
            commands = [[str(Path(args.plugin).resolve()) if word.endswith("fairseq_xmlm") else word for word in c]
                        for c in commands]
        runs = [packed_training.parse_run(c).build() for c in commands]
        schedules = [packed_training.epoch_batches(run, 1) for run in runs]
        for variant in args.variants.split(","):
            options = {}
            if variant.startswith("compile"):
                torch._dynamo.reset()  # compiled functions are shared by groups: start their caches afresh for this one
                options["compile"] = True
            if variant == "compile_graphs":
                options["cuda_graphs"] = True
            group = packed_training.PackedGroup(runs, device, **options)
            if args.no_dropout:
                group.dropouts = (0.0, 0.0, 0.0)
            result, profiler = profile_group(group, schedules, args, device)
            result = {"runs": ids, "seeds": sorted({run.cfg.common.seed for run in runs}), "variant": variant,
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
            (out / "pack_profile.json").write_text(json.dumps({"results": results, "argv": sys.argv[1:]}, indent=1))
            del group
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
