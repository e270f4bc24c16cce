#!/usr/bin/env bash
# What the 5-seed sweep runs beside a training team costs it (docs/benchmarks.md, twenty-sixth and twenty-seventh
# sessions). One BERT-base group (IDs 15-17 of seed 0, compiled, CUDA graphs: what a team's GPU time is mostly spent
# on) is timed by benchmarks/pack_profile.py alone and then, in the same process, beside each condition's commands:
#   cpu8  8 evaluations of an untrained BERT-small checkpoint on the CPU at once, as --pack-eval-cpu runs them
#         (nice 19, two threads each)
#   gpu3  3 evaluations of an untrained BERT-base checkpoint on the GPU (a team's overparam runs), three after
#         another in each of 3 slots
#   warm  another process warming up a BERT-base group (its layers from inductor's cache, its CUDA graphs
#         captured), as the next team does beside the one training; timed over 900 steps (about 30 s) from 10 s
#         after its start, so that its first epoch on the GPU falls inside them
# and, beside nothing:
#   tail  what --pack-eval-cpu leaves for the sweep's end: 15 BERT-base evaluations held back while groups trained
#         (3 overparam runs x 5 seeds) and the last team's 11 BERT-small ones, all on the GPU through gpu_pack, 8 at
#         a time (the recipe's slots on a 16-core machine); prints their wall time
# Before them (unless ALONE=0), one evaluation of each checkpoint alone on the GPU, with the time of each of its
# parts. Untrained checkpoints stand in for trained ones: the same shapes, the same work.
# With MPS=1 an MPS control daemon runs for the whole script, so that the processes share the GPU through it.
# EVAL_ARGS adds options to every evaluation (EVAL_ARGS=--tf32: the recipe's GPU evaluations since the
# twenty-eighth session).
#
#   bash benchmarks/beside_costs.sh OUT [CONDITION ...]      (default: cpu8 gpu3 warm; carry data-bin/fake_english
#                                                            and results/dufter/knn_table.pt)
set -euo pipefail
out=$1
shift
conditions=("$@")
[ ${#conditions[@]} -gt 0 ] || conditions=(cpu8 gpu3 warm)
mkdir -p "$out"
data=data-bin/fake_english
checkpoints=/tmp/beside_checkpoints
if [ "${MPS:-0}" = 1 ]; then
    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps_pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps_log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    echo "beside: MPS control daemon started"
fi
untrained() {  # NAME ARCH LR: the update-0 model of seed 0, as the recipe's untrained rows make it
    [ -e "$checkpoints/$1/checkpoint_untrained.pt" ] && return 0
    python3 -m fairseq_xmlm.untrained "$data" --user-dir fairseq_xmlm --task fake_english --criterion xmlm_masked_lm \
        --optimizer adam --adam-eps 1e-6 --weight-decay 0.01 --batch-size 256 --seed 0 --arch "$2" --lr "$3" \
        --save-dir "$checkpoints/$1" > "$out/untrained_$1.log" 2>&1
}
untrained small xmlm_bert_small 2e-3
untrained base xmlm_bert_base 1e-4
evaluation() {  # CHECKPOINT_NAME [eval_mult options]
    local name=$1
    shift
    echo "python3 -m fairseq_xmlm.evaluation.eval_mult $checkpoints/$name/checkpoint_untrained.pt --data $data" \
        "${EVAL_ARGS:-} $*"
}
for name in small base; do
    [ "${ALONE:-1}" = 0 ] && break
    started=$SECONDS
    $(evaluation $name) 2>&1 | grep -E "^eval-mult|checkpoint_untrained" > "$out/eval_alone_$name.txt"
    echo "beside: one evaluation of the untrained $name checkpoint alone on the GPU: $(( SECONDS - started )) s"
    cat "$out/eval_alone_$name.txt"
done
profile="python3 benchmarks/pack_profile.py --groups 15,16,17 --variants compile_graphs --warmup 75"
for condition in "${conditions[@]}"; do
    beside=() steps=300
    case $condition in
    cpu8)
        command="nice -n 19 env OMP_NUM_THREADS=2 $(evaluation small --device cpu) > /dev/null 2>&1"
        for _ in $(seq 8); do beside+=(--beside "$command"); done
        after=20 ;;
    gpu3)
        command="$(evaluation base) > /dev/null 2>&1"
        for _ in $(seq 3); do beside+=(--beside "$command; $command; $command"); done
        after=8 ;;
    warm)
        beside+=(--beside "$profile --steps 1 --profile-steps 1 --out /tmp/beside_warm > /dev/null 2>&1")
        after=10 steps=900 ;;
    tail)
        { for _ in $(seq 15); do evaluation base; done; for _ in $(seq 11); do evaluation small; done; } \
            > "$out/tail_commands.txt"
        started=$SECONDS
        python3 -m fairseq_xmlm.gpu_pack "$out/tail_commands.txt" --slots 8 --log-dir /tmp/beside_tail 2>&1 | tail -1
        echo "beside: 15 BERT-base and 11 BERT-small evaluations on the GPU, 8 at a time: $(( SECONDS - started )) s"
        continue ;;
    *)
        echo "beside: unknown condition $condition (cpu8, gpu3, warm, tail)"; exit 2 ;;
    esac
    # shellcheck disable=SC2086
    $profile --steps $steps --profile-steps 2 "${beside[@]}" --beside-after $after --out "$out/$condition" 2>&1 |
        grep "^\[pack_profile\]" | head -3
done
