"""The feed-forward block's activation, GELU(x + bias), in one Triton kernel forward and one backward
(`--fused-bias-gelu`).

x is the first product's output before its bias. GELU is the exact one of the papers' models (Hendrycks & Gimpel
2016): GELU(h) = h Phi(h), Phi(h) = (1 + erf(h / sqrt 2)) / 2, with the derivative
Phi(h) + h exp(-h^2 / 2) / sqrt(2 pi).

Compiled, inductor writes GELU's output forward, and in backward reads the product's output and the incoming
gradient to compute GELU again (for the second product's weight gradient) with its derivative, then reads both
once more to sum the bias's gradient: at the Conneau config (24,576 tokens x 3,072, bf16, one H200) 2.4 ms an update
in three kernels (`docs/results/profile/`). Here autograd keeps the forward's output for the second product, and
backward reads the gradient and x once, writing x's gradient and per-program partial sums of the bias's.

Both kernels are bound by their instructions, not by memory: with libdevice's erf they ran at 2.7 TB/s in every tile
against a plain copy's 4.2 (`benchmarks/bias_gelu_speed.py`), no faster in the training step than inductor's chain.
So erf is Abramowitz & Stegun's 7.1.26, whose exp is also the normal density of the derivative, with no branch: the
training step ran 2.6 % faster than with inductor's chain, where libdevice's erf gained 0.6 % (`docs/performance.md`).
The tile, 8 x 512 values and 4 warps, was a prototype's fastest. It is within 3e-7 max(1, |h|) of float64 in GELU
and its derivative, where eager fp32's own error reaches 2.5e-7 max(1, |h|) (`tests/test_bias_gelu.py`): below
bf16's rounding of the output by four orders of magnitude.

The arithmetic is fp32 whatever the tensors' type: x + bias is not rounded before GELU as eager rounds the product's
output with its bias. `tests/test_bias_gelu.py` runs the kernels in Triton's interpreter on the CPU against eager
PyTorch; `tests/gpu/test_bias_gelu_gpu.py` on a GPU.
"""
import torch

import triton
import triton.language as tl

from fairseq_xmlm.kernel_ops import multiprocessors, source_version

ROWS, COLUMNS, WARPS = 8, 512, 4  # a program's tile: 4,096 values (a prototype of these kernels' fastest)
PROGRAMS_PER_SM = 4  # backward: programs a multiprocessor, each looping over its column block's rows
_VERSION = source_version(__file__)  # in the ops' names
INVERSE_SQRT_2PI = tl.constexpr(0.3989422804014327)
# Abramowitz & Stegun 7.1.26: erf(z) = 1 - t (a1 + t (a2 + t (a3 + t (a4 + t a5)))) exp(-z^2), t = 1 / (1 + p z),
# for z >= 0, |error| <= 1.5e-7
P, A1, A2, A3, A4, A5 = (tl.constexpr(c) for c in (0.3275911, 0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                                   1.061405429))
# (the kernels' names are their own, apart from dropout_norm's, so that a profile tells them apart)


@triton.jit
def _phi_and_density(h):
    """(Phi(h), exp(-h^2 / 2)). With z = |h| / sqrt 2, A&S's exp(-z^2) is the normal density's exp(-h^2 / 2), which
    the derivative needs too: one exp for both, and no branch (libdevice's erf left the kernels bound by their
    instructions, above)."""
    t = 1.0 / (1.0 + P * tl.abs(h) * 0.7071067811865476)
    density = tl.exp(-0.5 * h * h)
    erf_abs = 1.0 - t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5)))) * density
    return 0.5 + 0.5 * tl.where(h < 0, -erf_abs, erf_abs), density


@triton.jit
def _tile(row_block, col_block, rows, dim, ROWS: tl.constexpr, COLUMNS: tl.constexpr, WIDE: tl.constexpr):
    """The tile's columns, where it is inside the (rows, dim) tensor, and its offsets there (int64 when WIDE: the
    tensor has 2^31 values or more)."""
    row = row_block * ROWS + tl.arange(0, ROWS)
    col = col_block * COLUMNS + tl.arange(0, COLUMNS)
    inside = (row < rows)[:, None] & (col < dim)[None, :]
    if WIDE:
        row = row.to(tl.int64)
    return col, inside, row[:, None] * dim + col[None, :]


@triton.jit
def _gelu_forward_kernel(x, bias, out, rows, dim, ROWS: tl.constexpr, COLUMNS: tl.constexpr, WIDE: tl.constexpr,
                         EVEN: tl.constexpr):
    """EVEN: the tiles cover the tensor exactly, no masks."""
    col, inside, at = _tile(tl.program_id(0), tl.program_id(1), rows, dim, ROWS, COLUMNS, WIDE)
    if EVEN:
        h = tl.load(x + at).to(tl.float32) + tl.load(bias + col).to(tl.float32)[None, :]
    else:
        h = tl.load(x + at, mask=inside, other=0.0).to(tl.float32)
        h += tl.load(bias + col, mask=col < dim, other=0.0).to(tl.float32)[None, :]
    phi, _ = _phi_and_density(h)
    if EVEN:
        tl.store(out + at, (h * phi).to(out.dtype.element_ty))
    else:
        tl.store(out + at, (h * phi).to(out.dtype.element_ty), mask=inside)


@triton.jit
def _gelu_backward_kernel(grad_out, x, bias, grad_x, partial_bias, rows, dim, programs, TURNS: tl.constexpr,
                          ROWS: tl.constexpr, COLUMNS: tl.constexpr, WIDE: tl.constexpr):
    """Row blocks program, program + programs, ... of column block program_id(1); the bias's partial sums of the
    program in row `program` of partial_bias. TURNS is a constant: a loop bound that is an argument fails in
    Triton's interpreter under numpy 2."""
    program, col_block = tl.program_id(0), tl.program_id(1)
    col = col_block * COLUMNS + tl.arange(0, COLUMNS)
    shift = tl.load(bias + col, mask=col < dim, other=0.0).to(tl.float32)
    summed = tl.zeros((ROWS, COLUMNS), dtype=tl.float32)
    for turn in range(TURNS):
        col, inside, at = _tile(program + turn * programs, col_block, rows, dim, ROWS, COLUMNS, WIDE)
        h = tl.load(x + at, mask=inside, other=0.0).to(tl.float32) + shift[None, :]
        phi, density = _phi_and_density(h)
        d_x = tl.load(grad_out + at, mask=inside, other=0.0).to(tl.float32) * (phi + h * density * INVERSE_SQRT_2PI)
        tl.store(grad_x + at, d_x.to(grad_x.dtype.element_ty), mask=inside)
        summed += d_x
    tl.store(partial_bias + program * dim + col, tl.sum(summed, 0), mask=col < dim)


def launch_forward(x, bias, tile=(ROWS, COLUMNS, WARPS)):
    """GELU(x + bias); tile = (rows, columns, warps) of a program (benchmarks/bias_gelu_speed.py tries others)."""
    (rows, dim), (tile_rows, tile_columns, warps) = x.shape, tile
    out = torch.empty_like(x)
    even = rows % tile_rows == 0 and dim % tile_columns == 0
    _gelu_forward_kernel[(triton.cdiv(rows, tile_rows), triton.cdiv(dim, tile_columns))](
        x, bias, out, rows, dim, ROWS=tile_rows, COLUMNS=tile_columns, WIDE=x.numel() >= 2**31, EVEN=even,
        num_warps=warps)
    return out


def launch_backward(grad_out, x, bias, tile=(ROWS, COLUMNS, WARPS), programs_per_sm=PROGRAMS_PER_SM):
    """(grad x, grad bias in fp32)."""
    (rows, dim), (tile_rows, tile_columns, warps) = x.shape, tile
    grad_x = torch.empty_like(x)
    row_blocks, col_blocks = triton.cdiv(rows, tile_rows), triton.cdiv(dim, tile_columns)
    programs = max(1, min(row_blocks, triton.cdiv(multiprocessors(x.device) * programs_per_sm, col_blocks)))
    partial_bias = torch.empty(programs, dim, device=x.device, dtype=torch.float32)
    _gelu_backward_kernel[(programs, col_blocks)](grad_out, x, bias, grad_x, partial_bias, rows, dim, programs,
                                                  TURNS=triton.cdiv(row_blocks, programs), ROWS=tile_rows,
                                                  COLUMNS=tile_columns, WIDE=x.numel() >= 2**31, num_warps=warps)
    return grad_x, partial_bias.sum(0)


@torch.library.custom_op(f"xmlm::bias_gelu_{_VERSION}", mutates_args=())
def _bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return launch_forward(x, bias)


@_bias_gelu.register_fake
def _(x, bias):
    return torch.empty_like(x)


@torch.library.custom_op(f"xmlm::bias_gelu_backward_{_VERSION}", mutates_args=())
def _bias_gelu_backward(grad_out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor,
                                                                                             torch.Tensor]:
    return launch_backward(grad_out.contiguous(), x, bias)


@_bias_gelu_backward.register_fake
def _(grad_out, x, bias):
    return torch.empty_like(x), bias.new_empty(bias.shape, dtype=torch.float32)


def _save(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_out):
    x, bias = ctx.saved_tensors
    grad_x, grad_bias = _bias_gelu_backward(grad_out, x, bias)
    return grad_x, grad_bias.to(bias.dtype)


_bias_gelu.register_autograd(_backward, setup_context=_save)


def bias_gelu(x, bias):
    """GELU(x + bias) for x (..., dim) and bias (dim,)."""
    dim = x.size(-1)
    return _bias_gelu(x.reshape(-1, dim).contiguous(), bias).view(x.shape)
