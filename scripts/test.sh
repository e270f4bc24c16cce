#!/usr/bin/env bash
# The whole test suite from a fresh clone: set-up first (idempotent), then pytest on real Bible data and real fairseq
# runs (CPU). Every test has a deadline (--timeout, seconds; a subprocess.run in a test that runs past it is killed
# with it) and the 25 slowest are listed. Extra arguments go to pytest (e.g. tests/test_prepare.py -x).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/setup.sh"
cd "$root"
# xmlm-fetch-dict downloads Debian's FreeDict packages with `apt-get download`, which needs the package lists; a
# fresh container has none. Fetched once (as root, or through password-less sudo), while the packages are not in
# the cache yet; where apt-get is absent the FreeDict tests skip and say why.
cache=${XMLM_CACHE:-$HOME/.cache/fairseq-xmlm}
if [ ! -d "$cache/freedict/dict-freedict-eng-fra" ] && command -v apt-get >/dev/null; then
  as_root=""
  [ "$(id -u)" = 0 ] || as_root="sudo -n"
  if [ -z "$as_root" ] || $as_root true 2>/dev/null; then
    timeout 300 $as_root apt-get update -qq ||
      echo "test: apt-get update failed; the FreeDict tests cannot download their package" >&2
  else
    echo "test: neither root nor password-less sudo: no apt-get update; the FreeDict tests need the package lists" >&2
  fi
fi
# One worker per CPU core (XMLM_TEST_WORKERS=0: none), each taking whole test files so that a file's fixtures are
# built once; one thread per process, since the workers and their fairseq-train children already fill the cores.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$root/.venv/bin/python" -m pytest tests -q -p no:cacheprovider --timeout 600 --durations=25 \
  -n "${XMLM_TEST_WORKERS:-auto}" --dist loadfile "$@"
