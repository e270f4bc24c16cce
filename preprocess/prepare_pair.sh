#!/usr/bin/env bash
# Prepare a Bible language pair for bilingual MLM (Conneau et al.): data-bin/bible_<l1>_<l2>[_<mode>].
set -euo pipefail
usage() {
  cat <<USAGE
usage: $0 [--langs en,fr] [--mode joint|separate|prefixed] [--vocab-size N] [--bible-dir DIR] [--out DIR]
          [--lowercase] [extra xmlm-prepare pair options, e.g. --codeswitch-dict en-fr.txt]
  --langs L1,L2     languages (Bible versions: en=BBE, fr=Segond, de=Schlachter, ru=Synodal, hi=IRV, zh=CNV)
                                                                      default: en,fr
  --mode MODE       joint (shared anchors), separate, prefixed (no anchors)   default: joint
  --vocab-size N    sentencepiece vocabulary per model (joint: total; else per language)   default: 12000
  --bible-dir DIR   verse-aligned Bibles (fetched there if missing)   default: data/bible
  --out DIR         default: data-bin/bible_L1_L2 (joint) or data-bin/bible_L1_L2_MODE
USAGE
}
LANGS=en,fr MODE=joint VOCAB=12000 BIBLE_DIR=data/bible OUT="" EXTRA=()
while [ $# -gt 0 ]; do
  case "$1" in
    --langs) LANGS=$2; shift 2 ;;
    --mode) MODE=$2; shift 2 ;;
    --vocab-size) VOCAB=$2; shift 2 ;;
    --bible-dir) BIBLE_DIR=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) EXTRA+=("$1"); shift ;;
  esac
done
if [ -z "$OUT" ]; then
  OUT=data-bin/bible_${LANGS//,/_}
  [ "$MODE" = joint ] || OUT=${OUT}_$MODE
fi
MISSING=""
for lang in ${LANGS//,/ }; do
  [ -s "$BIBLE_DIR/$lang.txt" ] || MISSING=$MISSING${MISSING:+,}$lang
done
if [ -n "$MISSING" ] || [ ! -s "$BIBLE_DIR/verses.tsv" ]; then
  xmlm-fetch-bible --out "$BIBLE_DIR" --versions "${MISSING:-$LANGS}"
fi
xmlm-prepare pair --corpus-dir "$BIBLE_DIR" --langs "$LANGS" --mode "$MODE" --vocab-size "$VOCAB" --out "$OUT" \
  "${EXTRA[@]}"
