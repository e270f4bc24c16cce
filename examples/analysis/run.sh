#!/usr/bin/env bash
# Conneau et al. 2020, Section 5: similarity of independently trained monolingual MLMs on the Bible.
#   examples/analysis/run.sh [full|quick] [--dry-run] [--report]
# Monolingual en, fr, de, ru, zh and a second English seed en', then word / sentence / cka analyses of en against
# each (fairseq_xmlm/experiments/similarity). `quick`: a CPU, minutes; `full`: a GPU.
# Results: results/analysis/<pair>/{word,sentence,cka}.{json,png} and results/analysis/summary.md.
set -euo pipefail
cd "$(dirname "$0")/../.." && exec "${BIN:-.venv/bin}/python" -m fairseq_xmlm.experiments.similarity "$@"
