#!/usr/bin/env bash
# The main job on a fresh clone, on a small real default (2 CPU cores, about 10 minutes):
#   0. set up .venv (scripts/setup.sh, idempotent),
#   1. fetch the BBE and KJV Bibles and prepare Dufter & Schuetze's English data (2048 pieces),
#   2. train the original Fake-English BERT-small (run 0) for 3 epochs and save its untrained twin (run 18),
#   3. evaluate both with xmlm-eval-mult (mu, alignment F1, retrieval rho, translation tau, perplexity),
#   4. print them side by side with the paper's rows 0 and 18.
# Results: results/quickstart/ (table1.md, runs/*/seed0/eval.json). A rerun skips what is already done.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh" && exec "$root/.venv/bin/python" -m fairseq_xmlm.experiments.dufter quickstart \
  --results "$root/results/quickstart" "$@"
