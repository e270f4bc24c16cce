#!/usr/bin/env bash
# Conneau et al. 2020, Section 5: similarity of independently trained monolingual MLMs on the Bible.
#
#   examples/analysis/run.sh [full|quick]
#
# Monolingual models en, fr, de, ru, zh and a second English seed en' (all trained with the bilingual_mlm task on
# ONE language of a verse-aligned data-bin, so item k of every valid/test split is the same verse), then
#   word      en-fr, en-de, en-ru (FreeDict dictionaries; MUSE-style held-out test words)
#   sentence  en-X for every X (including en')
#   cka       en-X for every X, with a random encoder lower bound
# writing results/analysis/<pair>/{word,sentence,cka}.{json,png} and results/analysis/summary.md.
# Procrustes for `sentence`/`cka` is learned on 200 of the 429 held-out test verses, the rest are retrieved.
# `quick` (CPU, minutes): BERT-small, 200 updates, 2000 sentences. `full` (GPU): xmlm_conneau (8 layers, 768 dims).
set -euo pipefail
PRESET=${1:-full}
cd "$(dirname "$0")/../.."
BIN=${BIN:-.venv/bin}
OUT=results/analysis
DATA=data-bin/bible_mono
LANGS=(en fr de ru zh)

if [[ $PRESET == quick ]]; then
  ARCH=(--arch xmlm_bert_small --lr 2e-3 --batch-size 16 --tokens-per-sample 128)
  UPDATES=200; SENTENCES=2000; NTRAIN=200; DEVICE=(--cpu --num-workers 0); ANALYZE_DEVICE=cpu
  FT=(--fasttext-dim 100 --fasttext-epochs 10)
else
  ARCH=(--arch xmlm_conneau --lr 1e-4 --batch-size 32 --tokens-per-sample 256)
  UPDATES=50000; SENTENCES=10000; NTRAIN=200; DEVICE=(); ANALYZE_DEVICE=cuda
  FT=()
fi

[[ -f data/bible/zh.txt ]] || "$BIN/xmlm-fetch-bible" --out data/bible --versions en:3,fr:l,de:s,ru:r,zh:c
# `separate`: one sentencepiece model per language (a monolingual model sees only its own pieces), verse-aligned
[[ -f $DATA/dict.txt ]] || "$BIN/xmlm-prepare" pair --corpus-dir data/bible --langs "$(IFS=,; echo "${LANGS[*]}")" \
  --mode separate --out "$DATA"

train() {  # train NAME LANG SEED
  local dir=checkpoints/analysis/$1
  [[ -f $dir/checkpoint_best.pt ]] && return
  "$BIN/fairseq-train" "$DATA" --user-dir fairseq_xmlm --task bilingual_mlm --langs "$2" "${ARCH[@]}" \
    --criterion masked_lm --optimizer adam --adam-betas '(0.9,0.98)' --adam-eps 1e-6 --weight-decay 0.01 \
    --lr-scheduler polynomial_decay --warmup-updates $((UPDATES / 20)) --total-num-update "$UPDATES" \
    --max-update "$UPDATES" --valid-subset valid --save-dir "$dir" --seed "$3" --no-epoch-checkpoints \
    --log-format simple --log-interval 50 "${DEVICE[@]}"
}
for lang in "${LANGS[@]}"; do train "$lang" "$lang" 1; done
train en_prime en 2  # the paper's en': same data, another seed

analyze() {  # analyze PAIR MODEL_B [word dictionaries...]
  local dir=$OUT/$1
  local common=(--model-a checkpoints/analysis/en/checkpoint_best.pt --lang-a 0
    --model-b "checkpoints/analysis/$2/checkpoint_best.pt" --lang-b 0 --max-sentences "$SENTENCES"
    --n-train "$NTRAIN" --device "$ANALYZE_DEVICE" --out "$dir")
  mkdir -p "$dir"
  "$BIN/xmlm-analyze" sentence "${common[@]}" --split test
  "$BIN/xmlm-analyze" cka "${common[@]}" --split test
  if [[ $# -gt 2 ]]; then
    "$BIN/xmlm-analyze" word "${common[@]}" --split train --dict-train "$3" --dict-test "$4" "${FT[@]}"
  fi
}
mkdir -p "$OUT/dicts"
for lang in fr de ru zh en_prime; do
  dicts=()
  if [[ $lang =~ ^(fr|de|ru)$ ]]; then
    dict=$OUT/dicts/en-$lang.txt
    [[ -f $dict ]] || "$BIN/xmlm-fetch-dict" --pair "en-$lang" --vocab data/bible/en.txt \
      --tgt-vocab "data/bible/$lang.txt" --test-size 100 --out "$dict"
    dicts=("$dict" "$dict.test")
  fi
  analyze "en-$lang" "$lang" "${dicts[@]}"
done

"$BIN/python" - "$OUT" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
lines = ["# Similarity of monolingual Bible MLMs (Conneau et al. 2020, Section 5)", ""]
pairs = sorted(p for p in out.iterdir() if (p / "cka.json").exists())
def row(name, values):
    return f"| {name} | " + " | ".join(f"{100 * v:.1f}" for v in values) + " |"
for title, load in [("Sentence retrieval P@1 (%), mean of both directions, per layer",
                     lambda p: [(r["a_to_b"] + r["b_to_a"]) / 2 for r in json.loads((p / "sentence.json").read_text())["layers"]]),
                    ("Linear CKA (x100) per layer", lambda p: json.loads((p / "cka.json").read_text())["cka"]),
                    ("Random-encoder CKA (x100) per layer", lambda p: json.loads((p / "cka.json").read_text())["cka_random"])]:
    table = [row(p.name, load(p)) for p in pairs]
    width = table[0].count("|") - 2
    lines += [f"## {title}", "", "| pair | " + " | ".join(f"L{i}" for i in range(width)) + " |",
              "|---" * (width + 1) + "|", *table, ""]
lines += ["## Pearson correlation of CKA and sentence retrieval across layers", "",
          *[f"- {p.name}: {json.loads((p / 'cka.json').read_text())['pearson_cka_retrieval']:.3f}" for p in pairs], ""]
words = [p for p in pairs if (p / "word.json").exists()]
if words:
    lines += ["## Word translation P@1 (%), CSLS", "", "| pair | embeddings | fastText | best contextual layer |",
              "|---|---|---|---|"]
    for p in words:
        w = json.loads((p / "word.json").read_text())
        best = max(range(len(w["contextual"])), key=lambda i: w["contextual"][i]["p1"])
        lines.append(f"| {p.name} | {100 * w['noncontextual']['p1']:.1f} | {100 * w['fasttext']['p1']:.1f} | "
                     f"L{best}: {100 * w['contextual'][best]['p1']:.1f} |")
(out / "summary.md").write_text("\n".join(lines) + "\n")
print(out / "summary.md")
EOF
