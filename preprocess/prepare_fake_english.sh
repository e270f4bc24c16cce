#!/usr/bin/env bash
# Prepare Dufter & Schuetze's English data: data-bin/fake_english (BBE New Testament sentences for training,
# the first 10k KJV Old Testament sentences for validation, sentencepiece vocabulary 2048).
set -euo pipefail
usage() {
  cat <<USAGE
usage: $0 [--bible-dir DIR] [--out DIR] [--vocab-size N]
  --bible-dir DIR   verse-aligned Bibles (fetched there if missing)   default: data/bible
  --out DIR         output data directory                             default: data-bin/fake_english
  --vocab-size N    sentencepiece vocabulary size                     default: 2048
USAGE
}
BIBLE_DIR=data/bible OUT=data-bin/fake_english VOCAB=2048
while [ $# -gt 0 ]; do
  case "$1" in
    --bible-dir) BIBLE_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --vocab-size) VOCAB=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "error: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
if [ ! -s "$BIBLE_DIR/en.txt" ] || [ ! -s "$BIBLE_DIR/en_kjv.txt" ] || [ ! -s "$BIBLE_DIR/verses.tsv" ]; then
  xmlm-fetch-bible --out "$BIBLE_DIR" --versions en:3,en_kjv:k
fi
xmlm-prepare fake-english --bible-dir "$BIBLE_DIR" --out "$OUT" --vocab-size "$VOCAB"
