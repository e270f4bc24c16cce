"""Attention over rows of at most 128 tokens, each (row, head) in one Triton program, forward and backward.

The stacked encoder lays short sentences side by side in rows of the attention (`stacked.attention_code`): a row
holds G sentences of T tokens, G*T <= 64 (or one sentence of up to 128), and each query may see the real tokens of
its own sentence only. SDPA's memory-efficient kernels did that from a (rows, 1, G*T, G*T) mask in 5.62 of a 3-run
BERT-base step's 40.76 kernel ms; these kernels take 2.69, and the step 34.14 ms instead of 37.38 (2026-11-28, one
H200, commit 39cf41d against 63af558 on the same machine). One program loads its row's q, k and v once, builds the
mask from a byte per token, and keeps the whole score matrix in registers; backward recomputes the scores from q, k
and the saved log-sum-exp, and writes dq, dk and dv without atomics, since no other program touches its row.

Attention dropout draws from Philox, eight draws a call (`dropout_draws`), with a seed that the caller draws with
torch, so CUDA graphs replay new draws; forward keeps the draws as bits for backward. q, k and v come as the
fused (tokens, 3 * dim) output of one product without bias, and their gradient goes back in that layout: no split,
no gather. The kernels add each model's bias as they load q, k and v (its gradient is the sum of theirs), so the
product needs no pass of its own for it.

`tests/test_short_attention.py` runs the kernels in Triton's interpreter (TRITON_INTERPRET=1) on the CPU against
`torch.nn.functional.scaled_dot_product_attention`; `tests/gpu/test_stacked_equal.py` runs them compiled on a GPU.
"""
import math

import torch

import triton
import triton.language as tl

from fairseq_xmlm.dropout_draws import draw_threshold, keep_draws
from fairseq_xmlm.kernel_ops import source_version

LONGEST_ROW = 128  # tokens: Dufter's models have 128 positions
WORDS = LONGEST_ROW // 32  # int32 words of dropout bits a query
_WORDS = tl.constexpr(WORDS)
_VERSION = source_version(__file__)  # in the ops' names


@triton.jit
def _head_at(rows, head, width, HEAD: tl.constexpr):
    """Offsets (len(rows), HEAD) of this head's columns in `rows` of a (rows, width) row-major tensor."""
    return rows[:, None] * width + head * HEAD + tl.arange(0, HEAD)[None, :]


@triton.jit
def _with_bias(qkv, bias, at, model_at, inside):
    """q, k or v of the row's tokens (`at` in qkv) plus their model's bias (`model_at` in bias), added in fp32."""
    value = tl.load(qkv + at, mask=inside, other=0.0).to(tl.float32)
    return (value + tl.load(bias + model_at, mask=inside, other=0.0).to(tl.float32)).to(qkv.dtype.element_ty)


@triton.jit
def _scores(qkv, bias, code, row, head, span, dim, tokens_per_model, scale, BLOCK: tl.constexpr,
            HEAD: tl.constexpr, PRECISION: tl.constexpr):
    """The row's q, k, v (BLOCK, HEAD) for this head, each with its bias, their offsets in qkv (q's; k's and v's are
    dim and 2 * dim further), and the scores (BLOCK, BLOCK), log2-scaled, -inf where a query may not see a key
    (other sentence, padding, or past the row's `span` tokens)."""
    token = tl.arange(0, BLOCK)
    inside = token < span
    at = _head_at(row * span + token, head, 3 * dim, HEAD)
    # a row may hold the last sentences of one model and the first of the next: each token takes its model's bias
    model_at = _head_at((row * span + token) // tokens_per_model, head, 3 * dim, HEAD)
    q = _with_bias(qkv, bias, at, model_at, inside[:, None])
    k = _with_bias(qkv, bias, at + dim, model_at + dim, inside[:, None])
    v = _with_bias(qkv, bias, at + 2 * dim, model_at + 2 * dim, inside[:, None])
    # code: 2 * (sentence within the row) + (1 if a real token); -2 past the row's end
    c = tl.load(code + row * span + token, mask=inside, other=-2).to(tl.int32)
    sentence, real = c >> 1, c & 1
    seen = (sentence[:, None] == sentence[None, :]) & (real[None, :] == 1)
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * (scale * 1.4426950408889634)
    return q, k, v, at, tl.where(seen, s, float("-inf"))


@triton.jit
def _kept_at(kept, program, span, BLOCK: tl.constexpr):
    """Where a program's dropout bits go: WORDS int32 words a query, BLOCK / 32 of them used."""
    token = tl.arange(0, BLOCK)
    return kept + (program * span + token)[:, None] * _WORDS + tl.arange(0, BLOCK // 32)[None, :]


@triton.jit
def _attention_forward_kernel(qkv, bias, code, seed_at, out, lse, kept, span, heads, dim, tokens_per_model, scale,
                              threshold, rescale, BLOCK: tl.constexpr, HEAD: tl.constexpr, DROPOUT: tl.constexpr,
                              PRECISION: tl.constexpr):
    program = tl.program_id(0)
    row, head = program // heads, program % heads
    q, k, v, _, s = _scores(qkv, bias, code, row, head, span, dim, tokens_per_model, scale, BLOCK, HEAD, PRECISION)
    top = tl.max(s, 1)
    top = tl.where(top == float("-inf"), 0.0, top)  # a query that sees nothing (past the row's end): zeros
    p = tl.exp2(s - top[:, None])
    total = tl.sum(p, 1)
    total = tl.where(total == 0.0, 1.0, total)
    token = tl.arange(0, BLOCK)
    inside = token < span
    tl.store(lse + program * span + token, top + tl.log2(total), mask=inside)
    p = p / total[:, None]
    if DROPOUT:
        # backward reads the draws as bits (4 KB a 128-token row) instead of drawing them again
        keep = keep_draws(tl.load(seed_at), program * (BLOCK * BLOCK // 8), threshold, BLOCK, BLOCK)
        bits = tl.reshape(keep.to(tl.int32), (BLOCK, BLOCK // 32, 32)) << tl.arange(0, 32)[None, None, :]
        tl.store(_kept_at(kept, program, span, BLOCK), tl.sum(bits, 2), mask=inside[:, None])
        p = tl.where(keep, p * rescale, 0.0)
    o = tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    tl.store(out + _head_at(row * span + token, head, dim, HEAD), o.to(out.dtype.element_ty), mask=inside[:, None])


@triton.jit
def _attention_backward_kernel(qkv, bias, code, out, lse, kept, grad_out, grad_qkv, span, heads, dim,
                               tokens_per_model, scale, rescale, BLOCK: tl.constexpr, HEAD: tl.constexpr,
                               DROPOUT: tl.constexpr, PRECISION: tl.constexpr):
    program = tl.program_id(0)
    row, head = program // heads, program % heads
    q, k, v, qkv_at, s = _scores(qkv, bias, code, row, head, span, dim, tokens_per_model, scale, BLOCK, HEAD,
                                 PRECISION)
    token = tl.arange(0, BLOCK)
    inside = (token < span)[:, None]
    p = tl.exp2(s - tl.load(lse + program * span + token, mask=token < span, other=0.0)[:, None])
    at = _head_at(row * span + token, head, dim, HEAD)
    do = tl.load(grad_out + at, mask=inside, other=0.0)
    o = tl.load(out + at, mask=inside, other=0.0)
    dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # gradient of the dropped probabilities
    if DROPOUT:
        words = tl.load(_kept_at(kept, program, span, BLOCK), mask=inside, other=0)
        keep = tl.reshape((words[:, :, None] >> tl.arange(0, 32)[None, None, :]) & 1, (BLOCK, BLOCK)) != 0
        dropped = tl.where(keep, p * rescale, 0.0)
        dp = tl.where(keep, dp * rescale, 0.0)
    else:
        dropped = p
    dv = tl.dot(tl.trans(dropped.to(do.dtype)), do, input_precision=PRECISION)
    # softmax backward: sum_j p_ij dp_ij = sum_d o_id do_id, since o = dropped @ v
    ds = p * (dp - tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)[:, None]) * scale
    dq = tl.dot(ds.to(q.dtype), k, input_precision=PRECISION)
    dk = tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    kind = grad_qkv.dtype.element_ty
    tl.store(grad_qkv + qkv_at, dq.to(kind), mask=inside)
    tl.store(grad_qkv + qkv_at + dim, dk.to(kind), mask=inside)
    tl.store(grad_qkv + qkv_at + 2 * dim, dv.to(kind), mask=inside)


def _geometry(qkv, code, heads, dropout):
    """The kernels' grid (a program for every row and head), their shared arguments after the tensors, and their
    compile-time options."""
    rows, span = code.shape
    dim = qkv.size(-1) // 3
    block = max(32, triton.next_power_of_2(span))
    # fp32 (the CPU's tests, fp32 checks on the GPU): exact products, not TF32's; bf16 ignores it
    options = dict(BLOCK=block, HEAD=dim // heads, DROPOUT=dropout > 0, num_warps=4 if block <= 64 else 8,
                   PRECISION="ieee" if qkv.dtype == torch.float32 else "tf32")
    return (rows * heads,), (span, heads, dim, qkv.size(-2), 1 / math.sqrt(dim // heads)), options


def _kept_size(code, heads, dropout):
    return code.numel() * heads * WORDS if dropout > 0 else 0


@torch.library.custom_op(f"xmlm::short_attention_{_VERSION}", mutates_args=())
def _attention(qkv: torch.Tensor, bias: torch.Tensor, code: torch.Tensor, seed: torch.Tensor, heads: int,
               dropout: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    out = qkv.new_empty(qkv.shape[:-1] + (qkv.size(-1) // 3,))
    lse = torch.empty(code.numel() * heads, device=qkv.device, dtype=torch.float32)
    kept = torch.empty(_kept_size(code, heads, dropout), device=qkv.device, dtype=torch.int32)
    grid, shared, options = _geometry(qkv, code, heads, dropout)
    _attention_forward_kernel[grid](qkv, bias, code, seed, out, lse, kept, *shared, *draw_threshold(dropout),
                                    **options)
    return out, lse, kept


@_attention.register_fake
def _(qkv, bias, code, seed, heads, dropout):
    return (qkv.new_empty(qkv.shape[:-1] + (qkv.size(-1) // 3,)),
            qkv.new_empty(code.numel() * heads, dtype=torch.float32),
            qkv.new_empty(_kept_size(code, heads, dropout), dtype=torch.int32))


@torch.library.custom_op(f"xmlm::short_attention_backward_{_VERSION}", mutates_args=())
def _attention_backward(grad_out: torch.Tensor, qkv: torch.Tensor, bias: torch.Tensor, code: torch.Tensor,
                        out: torch.Tensor, lse: torch.Tensor, kept: torch.Tensor, heads: int,
                        dropout: float) -> torch.Tensor:
    grad_qkv = torch.empty_like(qkv)
    grid, shared, options = _geometry(qkv, code, heads, dropout)
    _attention_backward_kernel[grid](qkv, bias, code, out, lse, kept, grad_out.contiguous(), grad_qkv, *shared,
                                     draw_threshold(dropout)[1], **options)
    return grad_qkv


@_attention_backward.register_fake
def _(grad_out, qkv, bias, code, out, lse, kept, heads, dropout):
    return torch.empty_like(qkv)


def _save(ctx, inputs, output):
    qkv, bias, code, _, heads, dropout = inputs
    ctx.save_for_backward(qkv, bias, code, *output)
    ctx.heads, ctx.dropout = heads, dropout


def _backward(ctx, grad_out, _grad_lse, _grad_kept):
    qkv, bias, code, out, lse, kept = ctx.saved_tensors
    grad_qkv = _attention_backward(grad_out, qkv, bias, code, out, lse, kept, ctx.heads, ctx.dropout)
    # the bias adds onto every token of its model: its gradient is their sum
    return grad_qkv, grad_qkv.sum(1), None, None, None, None


_attention.register_autograd(_backward, setup_context=_save)


def short_attention(qkv, bias, code, heads, dropout=0.0):
    """Attention of every row: qkv (N, L, 3 * dim), q, k and v side by side and each `heads` heads wide, before
    their bias (N, 3 * dim), which the kernels add as they load them (the product before needs no pass of its
    own for it); code (N * L / span, span) int8, per token 2 * (its sentence within the row) + (1 if real). Returns
    (N, L, dim), each query's attention over the real tokens of its own sentence, with dropout `dropout` on the
    probabilities (a fresh draw each call)."""
    if code.size(1) > LONGEST_ROW:
        raise ValueError(f"short_attention: rows of {code.size(1)} tokens, at most {LONGEST_ROW}")
    seed = torch.randint(2 ** 31 - 1, (1,), device=qkv.device) if dropout > 0 else qkv.new_zeros(1, dtype=torch.long)
    return _attention(qkv.contiguous(), bias.contiguous(), code, seed, heads, dropout)[0]
