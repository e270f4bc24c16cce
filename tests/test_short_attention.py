"""The stacked encoder's Triton attention kernels (`packed.attention_kernels`), run by Triton's interpreter on the
CPU (conftest sets TRITON_INTERPRET=1), against SDPA with the stacked encoder's mask (`packed.stacked.attention`'s
CPU path)."""
import pytest
import torch

from fairseq_xmlm.packed.attention_kernels import _attention, short_attention
from fairseq_xmlm.packed.stacked import attention, attention_code, attention_mask


def rows_of_attention(sentences, length, seed):
    """`attention_code` of `sentences` sentences of `length` tokens, each a random number of them real."""
    generator = torch.Generator().manual_seed(seed)
    real = torch.randint(1, length + 1, (sentences,), generator=generator)
    real[0] = length
    return attention_code(torch.arange(length) < real.unsqueeze(1))


@pytest.mark.parametrize("sentences, length", [(8, 7), (6, 7), (8, 20), (8, 70)],
                         ids=["8-to-a-row", "a-row-across-two-models", "2-to-a-row", "long"])
def test_attention_and_its_gradients_equal_sdpa(sentences, length):
    code = rows_of_attention(2 * sentences, length, length)  # 2 models
    if length == 7:  # 8 sentences to a row of 56 tokens, or 4 to one of 28, so that row 1 holds both models'
        assert code.shape == ((2, 56) if sentences == 8 else (3, 28))
    heads, dim = 2, 32
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(2, sentences * length, 3 * dim, generator=generator, requires_grad=True)
    bias = torch.randn(2, 3 * dim, generator=generator, requires_grad=True)
    grad = torch.randn(2, sentences * length, dim)
    got = short_attention(qkv, bias, code, heads)
    expected = attention(qkv, bias, code, heads, 0.0)
    assert torch.allclose(got, expected, atol=1e-5)
    # the bias's gradient sums q, k and v's over a model's tokens, and their rounding with them
    for got_grad, expected_grad, atol in zip(torch.autograd.grad(got, (qkv, bias), grad),
                                             torch.autograd.grad(expected, (qkv, bias), grad), (1e-5, 1e-4)):
        assert torch.allclose(got_grad, expected_grad, atol=atol)


def dropped_probabilities(code, heads, dim, dropout, seed):
    """The kernel's attention probabilities after dropout, (rows, heads, span, span), read off its output: with q
    and k zero every key a query sees is equally likely, and with v the identity the output is the probabilities."""
    rows, span = code.shape
    qkv = torch.zeros(rows, span, 3, heads, dim // heads)
    qkv[:, :, 2, :, :span] = torch.eye(span).unsqueeze(1)
    out = _attention(qkv.reshape(1, rows * span, 3 * dim), torch.zeros(1, 3 * dim), code, seed, heads, dropout)[0]
    return out.view(rows, span, heads, dim // heads)[..., :span].transpose(1, 2)


def test_dropout_draws_once_for_forward_and_backward():
    code, heads, dim, dropout = rows_of_attention(64, 7, 0), 2, 2 * 64, 0.25
    rows, span = code.shape
    seed = torch.tensor([1234])
    dropped = dropped_probabilities(code, heads, dim, dropout, seed)
    seen = attention_mask(code).expand_as(dropped)
    kept = dropped > 0
    assert not (kept & ~seen).any()
    share = float(kept.sum() / seen.sum())
    assert 0.7 < share < 0.8  # 1 - dropout, over about 3,500 probabilities
    assert torch.equal(dropped_probabilities(code, heads, dim, dropout, seed), dropped)  # the same seed, the same
    assert not torch.equal(dropped_probabilities(code, heads, dim, dropout, torch.tensor([99])), dropped)
    # forward and backward on random q, k, v with that seed equal autograd through the same kept probabilities
    qkv = torch.randn(1, rows * span, 3 * dim, generator=torch.Generator().manual_seed(2), requires_grad=True)
    grad = torch.randn(1, rows * span, dim)
    out = _attention(qkv, torch.zeros(1, 3 * dim), code, seed, heads, dropout)[0]
    q, k, v = qkv.view(rows, span, 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
    scores = (q @ k.transpose(-1, -2) / (dim // heads) ** 0.5).masked_fill(~seen, float("-inf"))
    expected = (scores.softmax(-1) * kept / (1 - dropout)) @ v
    expected = expected.transpose(1, 2).reshape(1, rows * span, dim)
    assert torch.allclose(out, expected, atol=1e-5)
    got_grad, = torch.autograd.grad(out, qkv, grad)
    expected_grad, = torch.autograd.grad(expected, qkv, grad)
    assert torch.allclose(got_grad, expected_grad, atol=1e-5)


def test_compiled_attention_equals_eager():
    code, heads, dim = rows_of_attention(8, 7, 3), 2, 32
    qkv = torch.randn(2, 4 * 7, 3 * dim, requires_grad=True)
    grad = torch.randn(2, 4 * 7, dim)

    def loss(qkv):
        return (short_attention(qkv, torch.zeros(2, 3 * dim), code, heads) * grad).sum()

    eager, = torch.autograd.grad(loss(qkv), qkv)
    compiled, = torch.autograd.grad(torch.compile(loss, fullgraph=True)(qkv), qkv)
    assert torch.allclose(compiled, eager, atol=1e-6), (compiled - eager).abs().max()


def test_rows_longer_than_the_kernel_takes_are_refused():
    with pytest.raises(ValueError, match="rows of 130 tokens, at most 128"):
        short_attention(torch.zeros(1, 130, 96), torch.zeros(1, 96), torch.ones(1, 130, dtype=torch.int8), 1)
