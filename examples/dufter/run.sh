#!/usr/bin/env bash
# Dufter & Schuetze 2020, Tables 1/2 and Figures 4-8 in one restartable command (set-up first, idempotent).
#   examples/dufter/run.sh            # full: 100 epochs x 5 seeds (a GPU)
#   examples/dufter/run.sh quick      # a CPU: 3 epochs x 1 seed, 1000 dev sentences
# Extra options go to `python -m fairseq_xmlm.experiments.dufter` (--seeds N, --ids 0,1,30, --dry-run, --gpu-pack,
# --schedule, --report, --status; --help lists them). Results: results/dufter/SCHEDULE/
# (paper-code-padding-specials by default).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bash "$root/scripts/setup.sh" && exec "$root/.venv/bin/python" -m fairseq_xmlm.experiments.dufter "$@"
