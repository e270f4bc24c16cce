#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up first (idempotent), then pytest on real Bible data and real fairseq
# runs (CPU). Every test has a deadline (--timeout, seconds; a subprocess.run in a test that runs past it is killed
# with it) and the 25 slowest are listed. Extra arguments go to pytest (e.g. tests/test_prepare.py -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
# xmlm-fetch-dict downloads Debian's FreeDict packages with `apt-get download`, which needs the package lists; a
# fresh container has none. Fetched once (as root), while the packages are not in the cache yet; where apt-get is
# absent the FreeDict tests skip and say why.
cache=${XMLM_CACHE:-$HOME/.cache/fairseq-xmlm}
if [ ! -d "$cache/freedict/dict-freedict-eng-fra" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get update -qq || echo "test: apt-get update failed; the FreeDict tests will fail to download" >&2
fi
exec "$root/.venv/bin/python" -m pytest tests -q -p no:cacheprovider --timeout 600 --durations=25 "$@"
