"""What the torch custom ops around our Triton kernels share (`packed.attention_kernels`, `models.dropout_norm`,
`models.bias_gelu`)."""
import hashlib
from pathlib import Path

import torch


def source_version(path):
    """12 hex digits of a file's hash, for the names of its custom ops: inductor's caches know a custom op by its
    name, not its code (pytorch issue 144344), so that with the same name an edited kernel met graphs compiled for
    the old one."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:12]


def multiprocessors(device):
    """Streaming multiprocessors of a CUDA device, for grids of a few programs each; 4 elsewhere (Triton's
    interpreter on the CPU)."""
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
