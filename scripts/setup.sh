#!/usr/bin/env bash
# Idempotent set-up: creates .venv (Python >= 3.11) with the pinned stack and the plugin (editable).
# A second run on a set-up machine only checks a stamp and returns in seconds.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv="$root/.venv"
stamp="$venv/.xmlm-setup-stamp"
want=$(cat scripts/setup.sh setup.py | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$venv/bin/python" -c "import fairseq, fairseq_xmlm" 2>/dev/null; then
  exit 0
fi
py=${PYTHON:-python3}
"$py" -c 'import sys; assert sys.version_info >= (3, 11), "Python >= 3.11 is required"' || {
  echo "setup: Python >= 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 1; }
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# This machine's pip config points at local indexes that do not exist for most packages: drop those warnings.
pip() { "$venv/bin/python" -m pip "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
echo "setup: installing the pinned stack into $venv" >&2
pip install -q pip==26.3
# Every package at the version the tests last passed with (.venv of 2026-11-29, Python 3.11, CPU): a new
# sentencepiece or sacremoses release changes the pieces and tokens, so every data-bin and result, without notice.
# torch: an unpinned one also makes pip fetch a multi-GB CUDA build.
# triton: the packed encoder's attention kernels (fairseq_xmlm/packed/attention_kernels.py; CUDA builds of torch
# bring their own); the CPU's tests run them in Triton's interpreter. 3.6.0 is the GPU machine's.
# jieba: the Chinese word segmenter of the word-level measures (fairseq_xmlm/data/segment.py), pure Python.
# pytest-timeout, pytest-xdist: scripts/test.sh gives every test a deadline and runs a test file per CPU core.
pip install -q torch==2.13.0 numpy==2.4.6 cython==3.3.1 setuptools==80.10.2 wheel==0.48.0 hydra-core==1.3.2 \
  omegaconf==2.3.0 regex==2026.11.19 sacrebleu==2.6.0 tqdm==4.70.1 bitarray==3.12.3 scikit-learn==1.9.1 \
  scipy==1.17.1 matplotlib==3.11.2 sentencepiece==0.2.3 sacremoses==0.2.0 fasttext-numpy2==0.10.4 pytest==9.2.0 \
  pytest-timeout==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2 triton==3.6.0 jieba==0.42.1
# fairseq 0.12.2 does not import on Python >= 3.11; fairseq-fixed is the same API. Build it against the torch
# above (--no-build-isolation) and without its declared deps (--no-deps: they would pull torchaudio).
if ! "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
  echo "setup: building fairseq-fixed==0.12.3.1 (about 2 minutes)" >&2
  pip install -q --no-build-isolation --no-deps fairseq-fixed==0.12.3.1
fi
pip install -q --no-build-isolation --no-deps -e .
echo "$want" > "$stamp"
echo "setup: done ($("$venv/bin/python" -c 'import fairseq_xmlm, fairseq, torch; print("fairseq", fairseq.__version__, "torch", torch.__version__)'))" >&2
