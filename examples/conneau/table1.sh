#!/usr/bin/env bash
# Conneau et al. 2020, Table 1 on the Bible: every row for en-fr, en-ru and en-zh, then the table and Figure 3.
# Usage: examples/conneau/table1.sh [quick|paper] [SETTINGS]   (SETTINGS: all, or e.g. default,sep_emb,sep_l1_3)
# Restartable: finished rows are skipped, interrupted training resumes from checkpoint_last.pt.
# Extra anchors needs a MUSE dictionary per pair: FreeDict has en-fr and en-ru (fetched below); for en-zh put one
# at data/dicts/en-zh.txt (e.g. MUSE's en-zh.txt), otherwise that row is left out for en-zh.
set -euo pipefail
preset=${1:-quick}
settings=${2:-all}
bible=${BIBLE_DIR:-data/bible}
[ -s "$bible/verses.tsv" ] && [ -s "$bible/zh.txt" ] || xmlm-fetch-bible --out "$bible" --versions en,fr,ru,zh
for pair in en-fr en-ru en-zh; do
  dict=data/dicts/$pair.txt
  if [ ! -s "$dict" ] && [ "$pair" != en-zh ]; then
    xmlm-fetch-dict --pair "$pair" --out "$dict" --vocab "$bible/en.txt" --tgt-vocab "$bible/${pair#en-}.txt"
  fi
  rows=$settings dict_args=()
  if [ -s "$dict" ]; then
    dict_args=(--codeswitch-dict "$dict")
  else
    [ "$rows" = all ] && rows=default,no_anchors,default_anchors,sep_emb,sep_l1_3,sep_l1_6,sep_emb_l1_3,sep_emb_l1_6
    rows=$(echo "$rows" | tr ',' '\n' | grep -vx extra_anchors | paste -sd, -)
    echo "no $dict: skipping the extra_anchors row for $pair" >&2
  fi
  python -m fairseq_xmlm.experiments.conneau --pair "${pair/-/,}" --preset "$preset" --settings "$rows" \
    --corpus-dir "$bible" "${dict_args[@]}" ${GENRE:+--genre} ${TRAIN_ARGS:+--train-args "$TRAIN_ARGS"}
done
echo "results/conneau/table1.md and results/conneau/figure3.png written" >&2
