"""Our Triton kernels compile for the GPU machine's Hopper (sm_90): the CPU suite runs them in Triton's interpreter,
which compiles nothing, so `hopper_compile.py` compiles each with Triton's compiler and ptxas in a process without
the interpreter."""
import os
import re
import subprocess
import sys
from pathlib import Path

from conftest import TIMEOUT


def test_kernels_compile_for_hopper():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, str(Path(__file__).with_name("hopper_compile.py"))], env=env,
                            capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    # the stacked attention's forward and backward at two row lengths, dropout + LayerNorm's three kernels, GELU's
    # two with int32 and with int64 offsets, the master step's
    assert result.stdout.count(": sm_90,") == 12
    # The master step: every load 16 bytes wide, per thread 16 values of 4,096 over 256 threads, 2 loads of the bf16
    # gradient and 4 of each fp32 tensor (4-byte loads had made a version of it half as fast on an H200)
    assert re.search(r"_adamw_kernel BLOCK=4096: sm_90, \d+ bytes of shared memory, 14 16-byte loads", result.stdout)
