#!/usr/bin/env bash
# The whole test suite: set-up first (idempotent), then pytest on real Bible data and real fairseq runs (CPU).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
exec "$root/.venv/bin/python" -m pytest tests -q -p no:cacheprovider "$@"
