#!/usr/bin/env bash
# Is xmlm-eval-mult slow on a GPU by itself, or only beside training? (In the --gpu-pack sweeps an evaluation took
# 27-36 s, with as much CPU time as wall time.) Evaluates one checkpoint alone on the GPU, then again while a
# Dufter BERT-small fairseq-train runs on the same GPU; eval_speed.py prints each step's wall and CPU time.
#
#   bash benchmarks/eval_beside_training.sh CHECKPOINT DATA_BIN OUT_DIR
set -euo pipefail
checkpoint=$1 data=$2 out=$3
mkdir -p "$out"
python3 benchmarks/eval_speed.py "$checkpoint" --data "$data" --json "$out/alone.json" 2> "$out/eval_alone.txt"
python3 -m fairseq_cli.train "$data" --user-dir fairseq_xmlm --task fake_english --arch xmlm_bert_small \
    --criterion xmlm_masked_lm --batch-size 256 --tokens-per-sample 128 --optimizer xmlm_adamw --lr 2e-3 \
    --fp16 --num-workers 2 --max-update 100000 --no-save --disable-validation --log-format simple \
    --log-interval 100 > "$out/train_beside.log" 2>&1 &
trainer=$!
trap 'kill $trainer 2> /dev/null || true' EXIT
until grep -q "num_updates=100," "$out/train_beside.log"; do  # training, not start-up, is what runs beside
    kill -0 $trainer || { echo "eval-beside: the training run died: $out/train_beside.log" >&2; exit 1; }
    sleep 1
done
python3 benchmarks/eval_speed.py "$checkpoint" --data "$data" --json "$out/beside.json" 2> "$out/eval_beside.txt"
grep -h "num_updates" "$out/train_beside.log" | tail -3
for f in alone beside; do echo "== $f"; grep "eval-" "$out/eval_$f.txt"; done
