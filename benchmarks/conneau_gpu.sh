#!/usr/bin/env bash
# The Conneau config's speed and precision figures of docs/performance.md on one GPU, one part after another:
#   bash benchmarks/conneau_gpu.sh OUT [PARTS]
# PARTS (comma-separated, default all): gpu-tests, speed (B: stock against our fastest variants), curves (the bf16
# loss curves beside the fp32 and fp16 ones kept in docs/results/precision_curves), profile (where an update of the
# bf16 path spends its time), rows (C: the Sep rows against Default), kernels (our kernels alone: GELU, dropout +
# LayerNorm, the master step). A part whose result is in OUT is skipped, so
# the same command goes on where an interrupted one stopped; a part that fails says so and the next one runs.
# BENCH_VARIANTS picks the speed part's variants of ours (default: the three below), BENCH_ROWS the rows beside
# Default.
# Needs the Default row's en-fr data for the curves:
#   python -m fairseq_xmlm.experiments.conneau paper --pairs en-fr --rows default --prepare-only \
#       --data-root data-bin/conneau
# The GPU tests read the test Bibles from $XMLM_CACHE/tests/bible-<key> (a machine with no network cannot fetch
# them: copy that folder from a machine whose test suite has run, and set XMLM_CACHE).
set -euo pipefail
out=${1:?usage: bash benchmarks/conneau_gpu.sh OUT [gpu-tests,speed,curves,profile,rows,kernels]}
parts=${2:-gpu-tests,speed,curves,profile,rows,kernels}
mkdir -p "$out"
wanted() { [[ ",$parts," == *",$1,"* ]]; }
bf16=bf16_params_cudagraphs_cudnn_xmlm_train
# --bf16-params --fused-dropout-norm --fused-master-step --fused-bias-gelu --residual-grad-in-products
# --cublaslt-no-workspace --one-qkv-product: the fastest
fused=bf16_params_fused_norm_step_gelu_residual_lt_static_one_qkv_cudagraphs_cudnn_xmlm_train
fastest=${BENCH_VARIANTS:-fp16_flat_master_cudagraphs_cudnn,$bf16,$fused}
profiled=conneau_ours_flat_master_cudagraphs_cudnn,conneau_ours_$bf16,conneau_ours_$fused

if wanted gpu-tests && [ ! -e "$out/gpu_tests.log" ]; then
    TRITON_INTERPRET=0 python3 -m pytest -q tests/gpu -m gpu -p no:cacheprovider > "$out/gpu_tests.part" 2>&1 || true
    mv "$out/gpu_tests.part" "$out/gpu_tests.log"
    tail -n 1 "$out/gpu_tests.log"
fi
if wanted speed && [ ! -e "$out/speed/done" ]; then
    BENCH_MODELS=conneau BENCH_UPDATES=250 BENCH_VARIANTS=$fastest \
        python3 benchmarks/step_speed.py --out "$out/speed" --sections single > "$out/speed.log" 2>&1 \
        && touch "$out/speed/done" || echo "speed failed: $out/speed.log"
fi
if wanted curves && [ ! -e "$out/curves/curves.png" ]; then
    python3 benchmarks/precision_curves.py --data data-bin/conneau/en_fr_joint --out "$out/curves" \
        --reuse docs/results/precision_curves/summary.json > "$out/curves.log" 2>&1 \
        || echo "curves failed: $out/curves.log"
fi
if wanted profile && [ ! -e "$out/profile/conneau_ours_$fused.json" ]; then
    python3 benchmarks/profile_step.py --out "$out/profile" \
        --runs "$profiled" \
        > "$out/profile.log" 2>&1 || echo "profile failed: $out/profile.log"
fi
if wanted rows && [ ! -e "$out/rows/done" ]; then
    BENCH_UPDATES=250 BENCH_ROWS_VARIANT=$fused \
        python3 benchmarks/step_speed.py --out "$out/rows" --sections rows > "$out/rows.log" 2>&1 \
        && touch "$out/rows/done" || echo "rows failed: $out/rows.log"
fi
if wanted kernels; then
    for kernel in bias_gelu dropout_norm master_step gemm; do
        [ -e "$out/kernels/${kernel}_speed.json" ] || python3 "benchmarks/${kernel}_speed.py" --out "$out/kernels" \
            > "$out/${kernel}_speed.log" 2>&1 || echo "${kernel} failed: $out/${kernel}_speed.log"
    done
fi
