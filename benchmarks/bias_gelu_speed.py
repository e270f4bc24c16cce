"""How fast is the feed-forward block's GELU(x + bias) on the GPU: our kernels (`models.bias_gelu`,
`--fused-bias-gelu`) in several tiles, against inductor's compiled chain and a plain copy of the same tensor?

    python3 benchmarks/bias_gelu_speed.py --out DIR [--repeats 100]

At the Conneau config's size (96 x 256 tokens of 3,072, bf16). Each row is `repeats` calls captured in one CUDA
graph and replayed, timed with CUDA events: the host's launches are not in the figures (a kernel of ~100 us launched
from Python one at a time would time the host). The rows:
- `copy`: x.clone(), the memory-bound floor (reads and writes one tensor);
- inductor's GELU(x + bias), forward alone and forward + backward;
- our forward and backward kernels for each tile (rows, columns, warps), backward also for programs per
  multiprocessor, the module's defaults marked;
- each row's memory traffic over its time: forward reads x and writes the output (2 tensors); backward reads the
  output's gradient and x, writes x's gradient (3 tensors).
Prints a table; writes DIR/bias_gelu_speed.json. Not a test.
"""
import sys

import torch
import torch.nn.functional as F

from _common import graph_ms, run_kernel_benchmark
from fairseq_xmlm.models import bias_gelu

ROWS, DIM = 96 * 256, 3072
TILES = [(8, 256, 4), (16, 256, 4), (16, 256, 8), (32, 256, 8), (8, 512, 4), (8, 512, 8), (16, 512, 8),
         (4, 1024, 4), (4, 1024, 8), (8, 1024, 8), (32, 128, 4), (64, 128, 8)]
PROGRAMS_PER_SM = (1, 2, 4, 8)


def rate(tensors, ms):
    """TB/s of moving `tensors` (ROWS x DIM bf16) in `ms`."""
    return tensors * ROWS * DIM * 2 / ms / 1e9


def reference_rows(x, bias, grad, repeats):
    rows = {"copy": {"ms": graph_ms(lambda: x.clone(), repeats)}}
    rows["copy"]["tb_per_s"] = rate(2, rows["copy"]["ms"])
    compiled = torch.compile(lambda x, bias: F.gelu(x + bias))
    leaf_x, leaf_bias = x.detach().requires_grad_(), bias.detach().requires_grad_()

    def forward():
        with torch.no_grad():
            compiled(x, bias)

    def both():
        torch.autograd.grad(compiled(leaf_x, leaf_bias), (leaf_x, leaf_bias), grad)
    ms = graph_ms(forward, repeats)
    rows["inductor forward"] = {"ms": ms, "tb_per_s": rate(2, ms)}
    ms = graph_ms(both, repeats)
    rows["inductor forward + backward"] = {"ms": ms, "tb_per_s": rate(5, ms)}
    return rows


def our_rows(x, bias, grad, repeats):
    rows = {}
    default = (bias_gelu.ROWS, bias_gelu.COLUMNS, bias_gelu.WARPS)
    for tile in TILES:
        ms = graph_ms(lambda: bias_gelu.launch_forward(x, bias, tile), repeats)
        name = "ours forward rows={} columns={} warps={}".format(*tile)
        rows[name + (" (default)" if tile == default else "")] = {"ms": ms, "tb_per_s": rate(2, ms)}
    for tile in TILES:
        for programs in PROGRAMS_PER_SM:
            ms = graph_ms(lambda: bias_gelu.launch_backward(grad, x, bias, tile, programs), repeats)
            name = "ours backward rows={} columns={} warps={} programs/SM={}".format(*tile, programs)
            marked = tile == default and programs == bias_gelu.PROGRAMS_PER_SM
            rows[name + (" (default)" if marked else "")] = {"ms": ms, "tb_per_s": rate(3, ms)}
    return rows


def measure(repeats):
    generator = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(ROWS, DIM, generator=generator, device="cuda").to(torch.bfloat16)
    bias = torch.randn(DIM, generator=generator, device="cuda").to(torch.bfloat16)
    grad = torch.randn(ROWS, DIM, generator=generator, device="cuda").to(torch.bfloat16)
    rows = reference_rows(x, bias, grad, repeats)
    rows.update(our_rows(x, bias, grad, repeats))
    for name, row in rows.items():
        print(f"{name:64s} {row['ms'] * 1e3:7.1f} us  {row['tb_per_s']:5.2f} TB/s", flush=True)
    return rows


def main(argv=None):
    return run_kernel_benchmark(__doc__, "bias_gelu_speed", measure, argv, rows=ROWS, dim=DIM, dtype="bf16",
                                timing="CUDA graph of repeats calls")


if __name__ == "__main__":
    sys.exit(main())
