#!/usr/bin/env bash
# The Dufter Tables 1 + 2 sweep (examples/dufter/run.py full --seeds 5 --gpu-pack) timed from start to tables in one
# uninterrupted run that outlives the device tool's 10-minute calls: `start` launches it in a process session of
# its own (setsid, which the tool leaves running until the machine goes back) from a copy of the tree in
# /tmp/sweep, with inductor's caches emptied first (a cold machine); `wait` follows it for at most WAIT_SECONDS
# (default 570) and prints its progress and the GPU's mean utilisation so far (sampled every 10 s, $OUT/gpu.csv);
# once it has ended, `wait` prints its wall time and exit status and sends the results folder back without
# checkpoints and logs as $OUT/dufter.tgz; every `wait` sends the processes' logs without library chatter as
# $OUT/lines.tgz, and while it waits it refreshes $OUT/progress.txt and gpu.csv every 30 s (what a call cut short
# by the session's device time still brings back). Chain the calls on one warm machine, as in docs/benchmarks.md
# (twentieth, twenty-first, twenty-sixth and twenty-ninth sessions).
#
#   device tool: carry [".whl", "data-bin/fake_english", "results/dufter/knn_table.pt"];
#   commands: bash benchmarks/dufter_sweep_detached.sh start, then bash benchmarks/dufter_sweep_detached.sh wait
#   (PACK_ARGS='--pack-lockstep --pack-eval-cpu' before `start` adds the recipe's options; SWEEP_PRESET=quick runs
#   the recipe's 3-epoch preset instead of the paper's 100 epochs, to try the whole schedule in minutes)
set -u
sweep=/tmp/sweep
results=$sweep/results/dufter
case "${1:-}" in
start)
    installing=$SECONDS
    # install_quick.sh alone: the sweep sets its own PYTHONPATH below, and the shared installer's two imports of
    # fairseq after it took 15 s of a fresh machine's 40 (twenty-eighth session, call 4)
    source benchmarks/install_quick.sh || exit 1
    echo "sweep: the install took $(( SECONDS - installing )) s"
    [ -e "$sweep" ] && { echo "sweep: $sweep exists (started before on this machine)"; exit 1; }
    mkdir -p "$sweep" && cp -a fairseq_xmlm examples benchmarks data-bin "$sweep"/ &&
        mkdir -p "$results" && cp results/dufter/knn_table.pt "$results"/ || exit 1
    rm -rf /tmp/torchinductor_"$(whoami)"
    cd "$sweep" || exit 1
    export PYTHONPATH=/tmp/site:$sweep
    export PACK_ARGS=${PACK_ARGS:-}
    # the GPU's utilisation, memory, clock and power every 10 s, for the whole sweep (it ends with the machine)
    setsid nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used,clocks.sm,power.draw --format=csv,noheader \
        -l 10 > gpu.csv 2>/dev/null < /dev/null &
    export SWEEP_PRESET=${SWEEP_PRESET:-full}
    setsid bash -c 'date +%s > started; python3 examples/dufter/run.py $SWEEP_PRESET --seeds 5 --gpu-pack $PACK_ARGS \
        --results results/dufter > recipe.log 2>&1; echo "$? $(date +%s)" > ended' < /dev/null > /dev/null 2>&1 &
    sleep 5
    echo "sweep: $SWEEP_PRESET started at $(date -u +%H:%M:%S) UTC in $sweep ${PACK_ARGS}"
    ;;
wait)
    progress() {  # the recipe's last lines and each packed process's last line of progress
        grep -v DEBUG "$sweep/recipe.log" | grep -E "gpu-pack|Error|error|failed" | tail -5
        for log in "$results"/pack/logs/*.log; do
            [ -e "$log" ] && echo "${log##*/}: $(grep -E "^pack" "$log" | tail -1)"
        done
        echo "at $(( $(date +%s) - $(cat "$sweep/started") )) s"
    }
    for step in $(seq "$(( ${WAIT_SECONDS:-570} / 5 ))"); do
        [ -e "$sweep/ended" ] && break
        # every 30 s into $OUT: a call cut short by the session's device time still brings back where it was
        (( step % 6 )) || { progress > "$OUT/progress.txt"; cp "$sweep/gpu.csv" "$OUT"/; }
        sleep 5
    done
    progress
    awk -F', ' '{gsub(/ %/, "", $2); n++; u += $2}
        END {if (n) printf "GPU busy %.0f %% on average over %d samples\n", u / n, n}' "$sweep/gpu.csv"
    tail -1 "$sweep/gpu.csv"
    cp "$sweep/gpu.csv" "$OUT"/
    # every process's lines without fairseq's and inductor's chatter: small enough to come back (16 MiB a file)
    # also from a sweep cut short, to lay its processes side by side by their clock times
    rm -rf /tmp/sweep_lines && mkdir /tmp/sweep_lines &&
        for log in "$sweep/recipe.log" "$results"/pack/logs/*.log; do
            [ -e "$log" ] && grep -v -E "^(DEBUG|INFO|WARNING):" "$log" > /tmp/sweep_lines/"${log##*/}"
        done
    tar czf "$OUT/lines.tgz" -C /tmp sweep_lines
    if [ -e "$sweep/ended" ]; then
        read -r status ended < "$sweep/ended"
        echo "sweep: ended with exit $status after $(( ended - $(cat "$sweep/started") )) s"
        cp "$sweep/recipe.log" "$OUT"/
        tar czf "$OUT/dufter.tgz" --exclude='*.pt' --exclude=pack/logs -C "$sweep" results/dufter
    else
        echo "sweep: running for $(( $(date +%s) - $(cat "$sweep/started") )) s; call wait again"
    fi
    ;;
*)
    echo "usage: $0 start|wait"; exit 2 ;;
esac
