"""How fast is a post-LayerNorm layer's residual step, LayerNorm(residual + dropout(x + bias)), on the GPU: our
kernels (`models.dropout_norm`, `--fused-dropout-norm`) against inductor's compiled chain, which draws dropout with
`tl.rand`?

    python3 benchmarks/dropout_norm_speed.py --out DIR

At the Conneau config's size (96 x 256 tokens of 768, bf16, dropout 0.1), each row --repeats calls captured in one
CUDA graph and replayed, timed with CUDA events (`_common.graph_ms`: the host's launches are not timed):
- forward, and forward + backward, of the chain compiled by inductor (default mode), with dropout 0.1 and without
  (what its draws cost);
- our forward kernel and our backward (its kernel and the partial sums' kernel) alone, in several tilings (rows a
  program, warps; and for backward programs per multiprocessor), the module's defaults marked. (Timed call by call
  from Python, before the CUDA graphs, the backward's rows timed the host: 100-135 us a call against 67 us in a
  training step's profile);
- the memory traffic each needs (bytes read and written) over its time, against the card's bandwidth.
Prints a table; writes DIR/dropout_norm_speed.json. Not a test.
"""
import sys

import torch
import torch.nn.functional as F

from _common import graph_ms, run_kernel_benchmark
from fairseq_xmlm.models import dropout_norm

ROWS, DIM, DROPOUT = 96 * 256, 768, 0.1


def chain(x, bias, residual, weight, norm_bias, dropout):
    return F.layer_norm(residual + F.dropout(x + bias, dropout), (x.size(-1),), weight, norm_bias, 1e-5)


def inductor_rows(tensors, grad, repeats):
    compiled = torch.compile(chain)
    rows = {}
    for dropout in (DROPOUT, 0.0):
        def forward():
            with torch.no_grad():
                compiled(*tensors, dropout)

        def both():
            torch.autograd.grad(compiled(*tensors, dropout), tensors, grad)
        rows[f"inductor dropout {dropout}"] = {"forward_ms": graph_ms(forward, repeats),
                                              "forward_backward_ms": graph_ms(both, repeats)}
    return rows


def our_rows(tensors, grad, repeats, bytes_per_value):
    x, bias, residual, weight, norm_bias = (t.detach() for t in tensors)
    seed = torch.tensor([1], device="cuda")
    saved = dropout_norm.launch_forward(x, bias, residual, weight, norm_bias, seed, DROPOUT, 1e-5)
    rows = {}
    for per_program in (1, 2, 4, 8):
        for warps in (2, 4, 8):
            default = (per_program, warps) == (dropout_norm.FORWARD_ROWS, dropout_norm.FORWARD_WARPS)
            ms = graph_ms(lambda: dropout_norm.launch_forward(x, bias, residual, weight, norm_bias, seed, DROPOUT,
                                                              1e-5, per_program, warps), repeats)
            # reads x and the residual, writes the output and the sum
            rows[f"ours forward rows={per_program} warps={warps}" + (" (default)" if default else "")] = {
                "forward_ms": ms, "tb_per_s": 4 * ROWS * DIM * bytes_per_value / ms / 1e9}
    _, summed, mean, rstd = saved
    for per_program in (2, 4, 8):
        for warps in (4, 8):
            for programs in (2, 4, 8):
                default = (per_program, warps, programs) == (dropout_norm.BACKWARD_ROWS, dropout_norm.BACKWARD_WARPS,
                                                            dropout_norm.BACKWARD_PROGRAMS_PER_SM)
                ms = graph_ms(lambda: dropout_norm.launch_backward(grad, summed, weight, mean, rstd, seed, DROPOUT,
                                                                   per_program, warps, programs), repeats)
                # reads the output's gradient and the sum, writes the gradients of x and of the residual
                name = f"ours backward rows={per_program} warps={warps} programs/SM={programs}"
                rows[name + (" (default)" if default else "")] = {
                    "backward_ms": ms, "tb_per_s": 4 * ROWS * DIM * bytes_per_value / ms / 1e9}
    return rows


def measure(repeats):
    generator = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.bfloat16

    def random(*shape):
        return torch.randn(*shape, generator=generator, device="cuda").to(dtype).requires_grad_()
    tensors = (random(ROWS, DIM), random(DIM), random(ROWS, DIM), random(DIM), random(DIM))
    grad = torch.randn(ROWS, DIM, generator=generator, device="cuda").to(dtype)
    rows = inductor_rows(tensors, grad, repeats)
    rows.update(our_rows(tensors, grad, repeats, 2))
    for name, row in rows.items():
        print(f"{name:60s} " + "  ".join(f"{key} {value:.4f}" for key, value in row.items()), flush=True)
    return rows


def main(argv=None):
    return run_kernel_benchmark(__doc__, "dropout_norm_speed", measure, argv, rows=ROWS, dim=DIM, dropout=DROPOUT,
                                dtype="bf16")


if __name__ == "__main__":
    sys.exit(main())
