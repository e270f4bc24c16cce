#!/usr/bin/env bash
# Bible genre benchmark (zero-shot cross-lingual transfer, offline): fine-tune each pretrained checkpoint on
# English verses of the training books, test on held-out books in the other language, write a table.
# Usage: examples/zeroshot/genre.sh CHECKPOINT.pt [CHECKPOINT.pt ...]   (LANGS=fr,de,ru,zh,hi to choose columns)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 CHECKPOINT.pt [CHECKPOINT.pt ...]" >&2; exit 2; }
langs=${LANGS:-fr,de,ru,zh,hi}
xmlm-genre --checkpoints "$@" --langs "$langs" --out results/genre.md --epochs "${EPOCHS:-3}"
# Conneau et al.'s selection for one checkpoint: run a grid, average the best two settings on English dev.
python -m fairseq_xmlm.zeroshot.sweep --checkpoint "$1" --langs "$langs" --grid "${GRID:-ner}" \
  --epochs "${EPOCHS:-3}" --out results/genre_sweep.md
