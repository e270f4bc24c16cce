#!/usr/bin/env bash
# Bible genre benchmark (zero-shot cross-lingual transfer, offline): fine-tune each pretrained checkpoint on
# English verses of the training books, test on held-out books in the other language, write a table; then
# Conneau et al.'s selection for the first checkpoint (a grid, the best two settings on English dev averaged).
# Usage: examples/zeroshot/genre.sh CHECKPOINT.pt [CHECKPOINT.pt ...]   (LANGS=fr,de,ru,zh,hi to choose columns,
# EPOCHS=3, GRID=ner). Results: results/genre.md, results/genre_sweep.md.
set -euo pipefail
exec python -m fairseq_xmlm.experiments.genre --langs "${LANGS:-fr,de,ru,zh,hi}" --epochs "${EPOCHS:-3}" \
  --grid "${GRID:-ner}" "$@"
