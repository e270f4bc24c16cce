#!/usr/bin/env bash
# One device call of the Dufter Tables 1 + 2 sweep (examples/dufter/run.py full --gpu-pack), as in
# docs/benchmarks.md. Repeat the call until it prints "sweep: complete": each call stops the recipe before the
# call's 10-minute limit (SIGTERM: packed groups save their state and the next call resumes them; every run is
# evaluated as soon as its group has trained) and sends the results folder back without checkpoints as
# $OUT/dufter.tgz.
#
#   device tool: carry [".whl", "data-bin/fake_english", "$RESULTS/knn_table.pt"], plus "$RESULTS/runs" on the
#   first call only (a later carry would replace the machine's newer results);
#   command: bash benchmarks/dufter_sweep_call.sh    (SEEDS=5, SWEEP_SECONDS=540, PACK_SLOTS=0 = CPU cores / 2 by
#   default; RESULTS=results/dufter: another folder keeps a timing sweep apart from the README's results, and its
#   own knn_table.pt is carried)
set -u
start=$SECONDS
source benchmarks/install_quick.sh && source .whl/install_on_device.sh || exit 1
results=${RESULTS:-results/dufter}
mkdir -p "$results"
log=$results/recipe.$(date +%Y%m%d-%H%M%S).log
left=$(( ${SWEEP_SECONDS:-540} - (SECONDS - start) ))
timeout -s TERM "$left" python3 examples/dufter/run.py full --seeds "${SEEDS:-5}" --gpu-pack \
    --pack-slots "${PACK_SLOTS:-0}" --results "$results" > "$log" 2>&1
status=$?
grep -v DEBUG "$log" | tail -15
python3 examples/dufter/run.py full --seeds "${SEEDS:-5}" --results "$results" --status 2>/dev/null
if [ "$status" -eq 0 ]; then echo "sweep: complete"; else echo "sweep: not finished (exit $status); call again"; fi
tar czf "$OUT/dufter.tgz" --exclude='*.pt' "$results"
