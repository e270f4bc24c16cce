"""`models.dropout_norm`'s kernels, LayerNorm(residual + dropout(x + bias)), run by Triton's interpreter on the CPU
(conftest sets TRITON_INTERPRET=1) against the same chain in eager PyTorch."""
from argparse import Namespace

import pytest
import torch
import torch.nn as nn

from fairseq_xmlm.models.dropout_norm import _dropout_add_layer_norm, dropout_add_layer_norm, launch_backward
from fairseq_xmlm.models.partially_shared_roberta import TransformerLayer


def inputs(rows, dim, seed=0):
    """x, bias, residual and a LayerNorm with random affine parameters, the tensors requiring gradients."""
    generator = torch.Generator().manual_seed(seed)
    x, residual = (torch.randn(rows, dim, generator=generator, requires_grad=True) for _ in range(2))
    bias = torch.randn(dim, generator=generator, requires_grad=True)
    norm = nn.LayerNorm(dim)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(dim, generator=generator))
        norm.bias.copy_(torch.randn(dim, generator=generator))
    return x, bias, residual, norm


def gradients(out, x, bias, residual, norm, grad):
    return torch.autograd.grad(out, (x, bias, residual, norm.weight, norm.bias), grad)


# rows not a multiple of a program's rows; widths not a power of 2
@pytest.mark.parametrize("rows, dim", [(37, 48), (8, 768), (3, 20)])
def test_without_dropout_it_equals_eager(rows, dim):
    x, bias, residual, norm = inputs(rows, dim)
    grad = torch.randn(rows, dim, generator=torch.Generator().manual_seed(9))
    got = dropout_add_layer_norm(x, bias, residual, norm, 0.0)
    expected = norm(residual + (x + bias))
    assert torch.allclose(got, expected, atol=1e-5)
    for name, got_grad, expected_grad in zip(("x", "bias", "residual", "weight", "norm bias"),
                                             gradients(got, x, bias, residual, norm, grad),
                                             gradients(expected, x, bias, residual, norm, grad)):
        assert torch.allclose(got_grad, expected_grad, atol=1e-4), (name, (got_grad - expected_grad).abs().max())


def kept_values(rows, dim, dropout, seed):
    """The kernel's keep mask times its scale, read off the sum before the norm: x = 1, bias and residual 0."""
    zeros = torch.zeros(dim)
    return _dropout_add_layer_norm(torch.ones(rows, dim), zeros, torch.zeros(rows, dim), torch.ones(dim), zeros,
                                   torch.tensor([seed]), dropout, 1e-5)[1]


def test_dropout_draws_once_for_forward_and_backward():
    rows, dim, dropout = 64, 48, 0.25
    kept = kept_values(rows, dim, dropout, 1234)
    assert torch.allclose(kept[kept != 0], torch.tensor(1 / 0.75))
    share = float((kept > 0).float().mean())
    assert 0.72 < share < 0.78  # 1 - dropout, over 3,072 values
    assert torch.equal(kept_values(rows, dim, dropout, 1234), kept)  # the same seed, the same mask
    assert not torch.equal(kept_values(rows, dim, dropout, 99), kept)
    # rows drawn apart, not one row's mask repeated
    assert not torch.equal(kept[0], kept[1])
    # forward and backward with that seed equal eager autograd through the same mask: backward draws it again
    x, bias, residual, norm = inputs(rows, dim, seed=3)
    grad = torch.randn(rows, dim, generator=torch.Generator().manual_seed(4))
    got = _dropout_add_layer_norm(x, bias, residual, norm.weight, norm.bias, torch.tensor([1234]), dropout,
                                  norm.eps)[0]
    expected = norm(residual + (x + bias) * kept)
    assert torch.allclose(got, expected, atol=1e-5)
    for got_grad, expected_grad in zip(gradients(got, x, bias, residual, norm, grad),
                                       gradients(expected, x, bias, residual, norm, grad)):
        assert torch.allclose(got_grad, expected_grad, atol=1e-4), (got_grad - expected_grad).abs().max()


def test_backward_kernel_rows_per_program_do_not_change_the_mask():
    """Forward draws in blocks of 4 rows, backward may loop over blocks of another height: the draws follow the
    row, not the block."""
    rows, dim, dropout = 21, 40, 0.5
    x, bias, residual, norm = inputs(rows, dim, seed=5)
    seed = torch.tensor([7])
    _, summed, mean, rstd = _dropout_add_layer_norm(x.detach(), bias.detach(), residual.detach(), norm.weight.detach(),
                                                    norm.bias.detach(), seed, dropout, norm.eps)
    grad = torch.randn(rows, dim)
    results = [launch_backward(grad, summed, norm.weight.detach(), mean, rstd, seed, dropout, rows_per_program=block)
               for block in (1, 4, 8)]
    for other in results[1:]:
        for got, expected in zip(other, results[0]):
            assert torch.allclose(got, expected, atol=1e-5)


def test_compiled_equals_eager():
    x, bias, residual, norm = inputs(6, 32)
    grad = torch.randn(6, 32)

    def loss(x):
        return (dropout_add_layer_norm(x, bias, residual, norm, 0.0) * grad).sum()

    eager, = torch.autograd.grad(loss(x), x)
    compiled, = torch.autograd.grad(torch.compile(loss, fullgraph=True)(x), x)
    assert torch.allclose(compiled, eager, atol=1e-6), (compiled - eager).abs().max()


def test_the_flag_on_the_cpu_keeps_the_eager_layer():
    """`--fused-dropout-norm` asks for the kernels on a GPU only: on the CPU the layer is the eager one, dropout's
    draws included."""
    cfg = Namespace(encoder_embed_dim=32, encoder_attention_heads=4, encoder_ffn_embed_dim=64, activation_fn="gelu",
                    dropout=0.1, attention_dropout=0.1, activation_dropout=0.0, fused_dropout_norm=False)
    plain = TransformerLayer(cfg)
    fused = TransformerLayer(Namespace(**{**vars(cfg), "fused_dropout_norm": True}))
    fused.load_state_dict(plain.state_dict())
    x, keep = torch.randn(2, 5, 32), torch.ones(2, 1, 1, 5, dtype=torch.bool)
    outputs = []
    for layer in (plain, fused):
        torch.manual_seed(0)
        outputs.append(layer(x, keep))
    assert torch.equal(*outputs)
