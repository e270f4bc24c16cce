"""Does a faster precision train the Conneau config as fp32 does? Loss curves of the first updates, side by side.

    python3 benchmarks/precision_curves.py --data DATA_ROOT/en_fr_joint --out DIR [--updates 2000]
        [--runs fp32,fp16,bf16_params,bf16_params_seed2,bf16_params_fused_norm,bf16_params_fused_norm_step_gelu,...]

The data is the Default row's (Bible en-fr, one BPE): `python -m fairseq_xmlm.experiments.conneau paper --pairs en-fr
--rows default --prepare-only --data-root DATA_ROOT`. Every run is a real fairseq-train (or xmlm-train) with the
Conneau recipe's paper preset (8 x 768, 256-token streams, batch 96, Adam, inverse square root warm-up), from seed 1,
logging every 10 updates:

- fp32: the reference, fairseq's own trainer, fp32 matrix products (TF32 off: torch's default);
- fp16: the recipe's GPU precision (`--fp16 --memory-efficient-fp16`: loss scaling, xmlm_adamw's fp32 master
  weights) with CUDA graphs and cuDNN's attention;
- bf16_params: `--bf16-params` under xmlm-train (no loss scaler, no host read per update), CUDA graphs, cuDNN's
  attention; bf16_params_seed2 the same from seed 2: what two runs that differ only by their seed differ by;
- bf16_params_fused_norm: bf16_params with our dropout + LayerNorm kernels (`--fused-dropout-norm`);
- bf16_params_fused_norm_step_gelu: that with our AdamW kernel (`--fused-master-step`) and GELU kernels
  (`--fused-bias-gelu`); bf16_params_fused_norm_step_gelu_residual: that with the residual's gradient added in the
  products (`--residual-grad-in-products`); bf16_params_fused_norm_step_gelu_residual_lt_static: that with
  cuBLASLt's statically scheduled kernels (`--cublaslt-no-workspace`); ..._one_qkv: that with Q, K and V from one
  product (`--one-qkv-product`).

Prints, and writes to DIR/summary.json (with the curves), each run's mean logged loss over the last `--tail` updates
and its mean absolute difference to fp32's curve over them, beside the seed-to-seed difference; DIR/curves.png draws
the curves.
A precision trains "the same curve within noise" when its difference to fp32 is no larger than the seeds' difference.
`--reuse docs/results/precision_curves/summary.json` takes the runs measured there (the same command) instead of
training them again, e.g. the 455 s of fp32.
"""
import argparse
import json
import os

import numpy as np

from _common import (BF16_PARAMS, CUDA_GRAPHS_CUDNN, FLAT_MASTER, XMLM_FP32, XMLM_TRAIN, Bench, entry_module, log,
                     parse_train_inner, train_command)

RUNS = {  # name: (precision options, entry variant, seed)
    "fp32": (XMLM_FP32, "", 1),
    "fp16": (FLAT_MASTER + CUDA_GRAPHS_CUDNN, "", 1),
    "bf16_params": (BF16_PARAMS + CUDA_GRAPHS_CUDNN, XMLM_TRAIN, 1),
    "bf16_params_seed2": (BF16_PARAMS + CUDA_GRAPHS_CUDNN, XMLM_TRAIN, 2),
    "bf16_params_fused_norm": (BF16_PARAMS + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm"], XMLM_TRAIN, 1),
    "bf16_params_fused_norm_step_gelu": (
        BF16_PARAMS + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm", "--fused-master-step", "--fused-bias-gelu"],
        XMLM_TRAIN, 1),
    "bf16_params_fused_norm_step_gelu_residual": (
        BF16_PARAMS + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm", "--fused-master-step", "--fused-bias-gelu",
                                           "--residual-grad-in-products"], XMLM_TRAIN, 1),
    "bf16_params_fused_norm_step_gelu_residual_lt_static": (
        BF16_PARAMS + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm", "--fused-master-step", "--fused-bias-gelu",
                                           "--residual-grad-in-products", "--cublaslt-no-workspace"], XMLM_TRAIN, 1),
    "bf16_params_fused_norm_step_gelu_residual_lt_static_one_qkv": (
        BF16_PARAMS + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm", "--fused-master-step", "--fused-bias-gelu",
                                           "--residual-grad-in-products", "--cublaslt-no-workspace",
                                           "--one-qkv-product"], XMLM_TRAIN, 1),
}
REFERENCE, NOISE = "fp32", ("bf16_params", "bf16_params_seed2")


def conneau_args(data):
    """The Conneau recipe's paper-preset training options on `data` (one language pair's data-bin), less the
    precision, the optimizer and the criterion, which each run names."""
    from fairseq_xmlm.experiments.conneau.runs import PRESETS

    langs = os.path.basename(os.path.normpath(data)).split("_")[:2]
    return [data, "--task", "bilingual_mlm", "--langs", ",".join(langs), "--arch", "xmlm_conneau",
            "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--lr-scheduler", "inverse_sqrt",
            "--num-workers", "0", *PRESETS["paper"]["train"]]


def curve(log_path):
    """{update: logged loss} of fairseq's train_inner lines (each the mean over its interval)."""
    return {int(row["num_updates"]): float(row["loss"]) for row in parse_train_inner(log_path)}


def finished_runs(summary_path):
    """{run: (its record, its curve)} of the runs that ended well in an earlier summary.json of this script."""
    if not os.path.isfile(summary_path):
        return {}
    with open(summary_path, encoding="utf-8") as f:
        summary = json.load(f)
    return {name: (run, {int(u): v for u, v in summary["curves"][name].items()})
            for name, run in summary.get("runs", {}).items() if run.get("rc") == 0 and summary["curves"].get(name)}


def mean_abs_difference(a, b, first):
    shared = sorted(u for u in set(a) & set(b) if u > first)
    return float(np.mean([abs(a[u] - b[u]) for u in shared])) if shared else None


def summarise(curves, updates, tail):
    first = updates - tail
    summary = {name: {"tail_loss": float(np.mean([v for u, v in c.items() if u > first]))} for name, c in curves.items()
               if any(u > first for u in c)}
    for name in summary:
        if name != REFERENCE and REFERENCE in curves:
            summary[name]["abs_diff_to_fp32"] = mean_abs_difference(curves[name], curves[REFERENCE], first)
    if all(n in curves for n in NOISE):
        summary["seed_to_seed_abs_diff"] = mean_abs_difference(curves[NOISE[0]], curves[NOISE[1]], first)
    return summary


def plot(curves, path):
    from fairseq_xmlm.plotting import pyplot, save_png

    plt = pyplot()
    figure, axis = plt.subplots(figsize=(7, 4))
    for name, c in curves.items():
        updates = sorted(c)
        axis.plot(updates, [c[u] for u in updates], label=name, linewidth=1)
    axis.set_xlabel("update")
    axis.set_ylabel("training loss (base 2, mean of 10 updates)")
    axis.set_title("Conneau config on Bible en-fr: precisions against fp32")
    axis.legend()
    save_png(figure, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="a Conneau recipe data-bin, e.g. DATA_ROOT/en_fr_joint")
    parser.add_argument("--out", required=True)
    parser.add_argument("--updates", type=int, default=2000)
    parser.add_argument("--tail", type=int, default=500, help="updates at the end that the comparison averages")
    parser.add_argument("--runs", default=",".join(RUNS))
    parser.add_argument("--reuse", help="a summary.json of this script (default: DIR's own, when there is one): its "
                        "finished runs of the same command are taken, not trained again")
    args = parser.parse_args()
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(RUNS))
    if unknown or not os.path.isdir(args.data):
        raise SystemExit(f"error: unknown runs {unknown}" if unknown else f"error: no data directory {args.data}")
    earlier = finished_runs(args.reuse or os.path.join(args.out, "summary.json"))
    bench = Bench(args.out)
    curves = {}
    for name in names:
        options, variant, seed = RUNS[name]
        argv = conneau_args(args.data) + options
        command = " ".join(train_command(argv, args.updates, 10, module=entry_module(variant), seed=seed)[1:])
        if name in earlier and earlier[name][0]["cmd"] == command:
            bench.results["runs"][name], curves[name] = earlier[name]
            log(f"{name}: taken from the earlier summary")
        else:
            bench.train(name, argv, args.updates, 10, module=entry_module(variant), seed=seed)
            curves[name] = curve(os.path.join(bench.logs, f"{name}.log"))
        bench.results["curves"] = curves
        bench.results["comparison"] = summarise(curves, args.updates, args.tail)
        bench.save()
        log(f"comparison: {bench.results['comparison']}")
    plot(curves, os.path.join(args.out, "curves.png"))


if __name__ == "__main__":
    main()
