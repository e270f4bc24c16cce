"""A post-LayerNorm layer's residual step, LayerNorm(residual + dropout(x + bias)), in one Triton kernel forward
and one backward (`--fused-dropout-norm`).

x is a product's output before its bias. Compiled, inductor fuses the same chain into one kernel a call, but draws
dropout with `tl.rand`, one Philox call a value, and writes the mask for backward: at the Conneau config (24,576
tokens x 768, bf16, one H200, training) its kernel took 124 us a call, 16 calls an update; this forward takes 45 us.
Here the draws are eight to a Philox call (`dropout_draws`), and backward draws them again instead of reading a mask.

Forward writes the output, the sum before the norm (rounded to the input's type, as eager keeps it for LayerNorm's
backward) and each row's mean and 1 / std. Backward, in one pass over the rows, returns the gradients of x, the
residual, the product's bias and the norm's weight and bias (those three as per-program partial sums, added up by
a small kernel after).

The arithmetic is fp32 whatever the tensors' type. Eager rounds x + bias, then the dropped value, then the sum, to
bf16 one after another; here only the sum is rounded, so bf16 results differ from eager's by about one rounding.
`tests/test_dropout_norm.py` runs the kernels in Triton's interpreter on the CPU against eager PyTorch;
`tests/gpu/test_dropout_norm_gpu.py` runs them compiled in the model on a GPU.
"""
import torch

import triton
import triton.language as tl

from fairseq_xmlm.dropout_draws import draw_threshold, keep_draws
from fairseq_xmlm.kernel_ops import multiprocessors, source_version

# forward: rows a program (the fastest of `benchmarks/dropout_norm_speed.py`'s tilings at the Conneau config on an
# H200, 45 us); backward: programs per multiprocessor, each looping over blocks of rows (that script's backward
# timings are bound by the host's launches and did not tell the tilings apart; in the training step's profile this
# one takes 67 us a call)
FORWARD_ROWS, FORWARD_WARPS = 4, 4
BACKWARD_ROWS, BACKWARD_WARPS, BACKWARD_PROGRAMS_PER_SM = 4, 8, 2
SUM_COLUMNS = 32  # columns a program of the partial sums' kernel
_VERSION = source_version(__file__)  # in the ops' names


@triton.jit
def _rows(block, rows, dim, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    """The block's rows, its columns, where both are inside the (rows, dim) tensor, and their offsets in it."""
    row = block * ROWS + tl.arange(0, ROWS)
    col = tl.arange(0, BLOCK)
    inside = (row < rows)[:, None] & (col < dim)[None, :]
    return row, col, inside, row[:, None] * dim + col[None, :]


@triton.jit
def _forward_kernel(x, bias, residual, weight, norm_bias, seed_at, out, summed, mean, rstd, rows, dim, eps,
                    threshold, rescale, ROWS: tl.constexpr, BLOCK: tl.constexpr, DROPOUT: tl.constexpr):
    block = tl.program_id(0)
    row, col, inside, at = _rows(block, rows, dim, ROWS, BLOCK)
    value = tl.load(x + at, mask=inside, other=0.0).to(tl.float32)
    value += tl.load(bias + col, mask=col < dim, other=0.0).to(tl.float32)[None, :]
    if DROPOUT:
        keep = keep_draws(tl.load(seed_at), block * (ROWS * BLOCK // 8), threshold, ROWS, BLOCK)
        value = tl.where(keep, value * rescale, 0.0)
    total = (tl.load(residual + at, mask=inside, other=0.0).to(tl.float32) + value).to(summed.dtype.element_ty)
    tl.store(summed + at, total, mask=inside)
    total = total.to(tl.float32)
    mu = tl.sum(total, 1) / dim
    centred = tl.where(inside, total - mu[:, None], 0.0)
    inverse = 1.0 / tl.sqrt(tl.sum(centred * centred, 1) / dim + eps)
    scale = tl.load(weight + col, mask=col < dim, other=0.0).to(tl.float32)
    shift = tl.load(norm_bias + col, mask=col < dim, other=0.0).to(tl.float32)
    y = centred * inverse[:, None] * scale[None, :] + shift[None, :]
    tl.store(out + at, y.to(out.dtype.element_ty), mask=inside)
    tl.store(mean + row, mu, mask=row < rows)
    tl.store(rstd + row, inverse, mask=row < rows)


@triton.jit
def _backward_kernel(grad_out, summed, weight, mean, rstd, seed_at, grad_x, grad_residual, partial_bias,
                     partial_weight, partial_norm_bias, rows, programs, dim, threshold, rescale,
                     TURNS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr, DROPOUT: tl.constexpr):
    """LayerNorm's backward, d summed = rstd * (g - mean(g) - xhat * mean(g * xhat)) with g = dy * weight and xhat
    the normalised sum; then dropout's: d x = d summed where kept, times the scale."""
    program = tl.program_id(0)
    col = tl.arange(0, BLOCK)
    scale = tl.load(weight + col, mask=col < dim, other=0.0).to(tl.float32)
    sum_bias = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    sum_weight = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    sum_norm_bias = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    seed = tl.load(seed_at)
    # blocks program, program + programs, ...; those past the rows load and store nothing. TURNS is a constant: a
    # loop bound that is an argument fails in Triton's interpreter under numpy 2 (one-element arrays to int)
    for turn in range(TURNS):
        block = program + turn * programs
        row, col, inside, at = _rows(block, rows, dim, ROWS, BLOCK)
        dy = tl.load(grad_out + at, mask=inside, other=0.0).to(tl.float32)
        mu = tl.load(mean + row, mask=row < rows, other=0.0)
        inverse = tl.load(rstd + row, mask=row < rows, other=0.0)
        xhat = tl.load(summed + at, mask=inside, other=0.0).to(tl.float32) - mu[:, None]
        xhat = tl.where(inside, xhat * inverse[:, None], 0.0)
        sum_weight += dy * xhat
        sum_norm_bias += dy
        g = dy * scale[None, :]
        d_summed = inverse[:, None] * (g - (tl.sum(g, 1) / dim)[:, None] - xhat * (tl.sum(g * xhat, 1) / dim)[:, None])
        d_summed = tl.where(inside, d_summed, 0.0)
        tl.store(grad_residual + at, d_summed.to(grad_residual.dtype.element_ty), mask=inside)
        d_x = d_summed
        if DROPOUT:
            keep = keep_draws(seed, block * (ROWS * BLOCK // 8), threshold, ROWS, BLOCK)
            d_x = tl.where(keep, d_summed * rescale, 0.0)
        tl.store(grad_x + at, d_x.to(grad_x.dtype.element_ty), mask=inside)
        sum_bias += d_x
    tl.store(partial_bias + program * dim + col, tl.sum(sum_bias, 0), mask=col < dim)
    tl.store(partial_weight + program * dim + col, tl.sum(sum_weight, 0), mask=col < dim)
    tl.store(partial_norm_bias + program * dim + col, tl.sum(sum_norm_bias, 0), mask=col < dim)


@triton.jit
def _sum_partials_kernel(partials, grad_bias, grad_weight, grad_norm_bias, programs, dim, PROGRAMS: tl.constexpr,
                         COLUMNS: tl.constexpr):
    """The three parameters' gradients, each the sum of the backward programs' partial sums (3, programs, dim), in
    the parameters' type: one small kernel where torch took three sums and three casts."""
    which = tl.program_id(0)
    col = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    program = tl.arange(0, PROGRAMS)
    inside = (program < programs)[:, None] & (col < dim)[None, :]
    total = tl.sum(tl.load(partials + (which * programs + program)[:, None] * dim + col[None, :], mask=inside,
                           other=0.0), 0)
    if which == 0:
        tl.store(grad_bias + col, total.to(grad_bias.dtype.element_ty), mask=col < dim)
    elif which == 1:
        tl.store(grad_weight + col, total.to(grad_weight.dtype.element_ty), mask=col < dim)
    else:
        tl.store(grad_norm_bias + col, total.to(grad_norm_bias.dtype.element_ty), mask=col < dim)


def _block(dim):
    """Columns a program holds: the row's width rounded up to a power of 2, at least 8 (a Philox call's draws)."""
    return max(8, triton.next_power_of_2(dim))


def launch_forward(x, bias, residual, weight, norm_bias, seed, dropout, eps, rows_per_program=FORWARD_ROWS,
                   warps=FORWARD_WARPS):
    """The forward kernel on (rows, dim) tensors: (output, sum before the norm, mean, 1 / std)."""
    rows, dim = x.shape
    out, summed = torch.empty_like(x), torch.empty_like(x)
    mean = torch.empty(rows, device=x.device, dtype=torch.float32)
    rstd = torch.empty_like(mean)
    _forward_kernel[(triton.cdiv(rows, rows_per_program),)](
        x, bias, residual, weight, norm_bias, seed, out, summed, mean, rstd, rows, dim, eps, *draw_threshold(dropout),
        ROWS=rows_per_program, BLOCK=_block(dim), DROPOUT=dropout > 0, num_warps=warps)
    return out, summed, mean, rstd


def _programs(device, blocks, per_sm):
    return max(1, min(blocks, multiprocessors(device) * per_sm))


def launch_backward(grad_out, summed, weight, mean, rstd, seed, dropout, rows_per_program=BACKWARD_ROWS,
                    warps=BACKWARD_WARPS, programs_per_sm=BACKWARD_PROGRAMS_PER_SM):
    """The backward kernel: (grad x, grad residual, grad bias, grad weight, grad norm bias), the parameters' in the
    norm weight's type."""
    rows, dim = summed.shape
    grad_x, grad_residual = torch.empty_like(summed), torch.empty_like(summed)
    blocks = triton.cdiv(rows, rows_per_program)
    programs = _programs(summed.device, blocks, programs_per_sm)
    partials = torch.empty(3, programs, dim, device=summed.device, dtype=torch.float32)
    _backward_kernel[(programs,)](
        grad_out, summed, weight, mean, rstd, seed, grad_x, grad_residual, partials[0], partials[1], partials[2], rows,
        programs, dim, *draw_threshold(dropout), TURNS=triton.cdiv(blocks, programs), ROWS=rows_per_program,
        BLOCK=_block(dim), DROPOUT=dropout > 0, num_warps=warps)
    grad_bias, grad_weight, grad_norm_bias = (weight.new_empty(dim) for _ in range(3))
    _sum_partials_kernel[(3, triton.cdiv(dim, SUM_COLUMNS))](
        partials, grad_bias, grad_weight, grad_norm_bias, programs, dim, PROGRAMS=triton.next_power_of_2(programs),
        COLUMNS=SUM_COLUMNS)
    return grad_x, grad_residual, grad_bias, grad_weight, grad_norm_bias


@torch.library.custom_op(f"xmlm::dropout_add_layer_norm_{_VERSION}", mutates_args=())
def _dropout_add_layer_norm(x: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                            norm_bias: torch.Tensor, seed: torch.Tensor, dropout: float,
                            eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return launch_forward(x, bias, residual, weight, norm_bias, seed, dropout, eps)


@_dropout_add_layer_norm.register_fake
def _(x, bias, residual, weight, norm_bias, seed, dropout, eps):
    rows = x.new_empty(x.size(0), dtype=torch.float32)
    return torch.empty_like(x), torch.empty_like(x), rows, torch.empty_like(rows)


@torch.library.custom_op(f"xmlm::dropout_add_layer_norm_backward_{_VERSION}", mutates_args=())
def _dropout_add_layer_norm_backward(grad_out: torch.Tensor, summed: torch.Tensor, weight: torch.Tensor,
                                     mean: torch.Tensor, rstd: torch.Tensor, seed: torch.Tensor,
                                     dropout: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                                              torch.Tensor]:
    return launch_backward(grad_out.contiguous(), summed, weight, mean, rstd, seed, dropout)


@_dropout_add_layer_norm_backward.register_fake
def _(grad_out, summed, weight, mean, rstd, seed, dropout):
    return (torch.empty_like(summed), torch.empty_like(summed), *(weight.new_empty(summed.size(1)) for _ in range(3)))


def _save(ctx, inputs, output):
    x, bias, residual, weight, norm_bias, seed, dropout, eps = inputs
    _, summed, mean, rstd = output
    ctx.save_for_backward(summed, weight, mean, rstd, seed)
    ctx.dropout = dropout
    ctx.types = bias.dtype, weight.dtype, norm_bias.dtype


def _backward(ctx, grad_out, _grad_summed, _grad_mean, _grad_rstd):
    summed, weight, mean, rstd, seed = ctx.saved_tensors
    grad_x, grad_residual, *parameters = _dropout_add_layer_norm_backward(grad_out, summed, weight, mean, rstd, seed,
                                                                          ctx.dropout)
    grad_bias, grad_weight, grad_norm_bias = (grad.to(kind) for grad, kind in zip(parameters, ctx.types))
    return grad_x, grad_bias, grad_residual, grad_weight, grad_norm_bias, None, None, None


_dropout_add_layer_norm.register_autograd(_backward, setup_context=_save)


def dropout_add_layer_norm(x, bias, residual, norm, dropout):
    """norm(residual + dropout(x + bias)) for x and residual (..., dim) of one type, `norm` an nn.LayerNorm of dim,
    with a fresh draw of the dropout mask each call (its seed drawn with torch, so that CUDA graphs replay new
    draws)."""
    dim = residual.size(-1)
    seed = (torch.randint(2 ** 31 - 1, (1,), device=x.device) if dropout > 0
            else torch.zeros(1, device=x.device, dtype=torch.long))
    out = _dropout_add_layer_norm(x.reshape(-1, dim).contiguous(), bias, residual.reshape(-1, dim).contiguous(),
                                  norm.weight, norm.bias, seed, dropout, norm.eps)[0]
    return out.view(residual.shape)
