#!/usr/bin/env bash
# Conneau et al. 2020, Table 1 and Figure 3 on the Bible: every row for en-fr, en-ru and en-zh (restartable).
# Usage: bash examples/conneau/table1.sh [tiny|quick|bible|paper] [--seeds 1] [--rows ...] [--report|--status]
# Fetches the Bibles and dictionaries it lacks, prepares the data, trains side by side, evaluates, writes
# results/conneau/{table1.md,conneau_table1.json,figure3.png,curves.png,layers.png}.
set -euo pipefail
cd "$(dirname "$0")/../.." && bash scripts/setup.sh && exec .venv/bin/python -m fairseq_xmlm.experiments.conneau "$@"
