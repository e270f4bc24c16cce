"""`models.bias_gelu`'s kernels, GELU(x + bias), run by Triton's interpreter on the CPU (conftest sets
TRITON_INTERPRET=1) against eager PyTorch's exact GELU."""
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

from fairseq_xmlm.models.bias_gelu import COLUMNS, ROWS, bias_gelu, launch_backward
from fairseq_xmlm.models.partially_shared_roberta import TransformerLayer


def inputs(rows, dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(rows, dim, generator=generator)).requires_grad_()
    bias = torch.randn(dim, generator=generator, requires_grad=True)
    return x, bias, torch.randn(rows, dim, generator=generator)


# tiles cut at both edges (rows and columns not multiples of the tile's); more row blocks than backward programs
@pytest.mark.parametrize("rows, dim", [(ROWS + 5, COLUMNS + 24), (3, 20), (ROWS * 9, 64)])
def test_forward_and_gradients_equal_eager(rows, dim):
    x, bias, grad = inputs(rows, dim)
    got = bias_gelu(x, bias)
    expected = F.gelu(x + bias)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for name, got_grad, expected_grad in zip(("x", "bias"), torch.autograd.grad(got, (x, bias), grad),
                                             torch.autograd.grad(expected, (x, bias), grad)):
        torch.testing.assert_close(got_grad, expected_grad, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("shape", [(1, 4097), (ROWS, COLUMNS)])  # masked tiles, and one tile exactly (no masks)
def test_erf_approximation_is_within_its_bound_of_float64(shape):
    """A&S 7.1.26's |error| <= 1.5e-7 in erf is <= 7.5e-8 |h| in GELU and about that in its derivative; with fp32's
    rounding, within 3e-7 max(1, |h|) of float64 for both (eager fp32 GELU's own error is up to 2.5e-7 max(1, |h|))."""
    x = torch.linspace(-8, 8, shape[0] * shape[1]).view(shape).requires_grad_()
    h = x.detach().double()
    got = bias_gelu(x, torch.zeros(shape[1]))
    got_slope, = torch.autograd.grad(got, x, torch.ones_like(got))
    exact = h * (1 + torch.special.erf(h / 2 ** 0.5)) / 2
    exact_slope = (1 + torch.special.erf(h / 2 ** 0.5)) / 2 + h * torch.exp(-h * h / 2) / (2 * torch.pi) ** 0.5
    bound = 3e-7 * h.abs().clamp(min=1)
    assert ((got.double() - exact).abs() <= bound).all()
    assert ((got_slope.double() - exact_slope).abs() <= bound).all()


def test_backward_sums_the_bias_gradient_over_every_row_block():
    """More row blocks than programs: each program loops, and the partial sums of all of them make the gradient."""
    rows, dim = ROWS * 40 + 3, 32
    x, bias, grad = inputs(rows, dim, seed=1)
    grad_x, grad_bias = launch_backward(grad, x.detach(), bias.detach())
    torch.testing.assert_close(grad_bias, grad_x.sum(0), rtol=1e-5, atol=1e-4)


def test_compiled_equals_eager():
    x, bias, grad = inputs(6, 32)

    def loss(x):
        return (bias_gelu(x, bias) * grad).sum()

    eager, = torch.autograd.grad(loss(x), x)
    compiled, = torch.autograd.grad(torch.compile(loss, fullgraph=True)(x), x)
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=1e-6)


def test_the_flag_on_the_cpu_keeps_the_eager_layer():
    """`--fused-bias-gelu` asks for the kernels on a GPU only, and for GELU with no activation dropout only."""
    cfg = Namespace(encoder_embed_dim=32, encoder_attention_heads=4, encoder_ffn_embed_dim=64, activation_fn="gelu",
                    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, fused_bias_gelu=True)
    plain = TransformerLayer(Namespace(**{**vars(cfg), "fused_bias_gelu": False}))
    fused = TransformerLayer(cfg)
    fused.load_state_dict(plain.state_dict())
    x, keep = torch.randn(2, 5, 32), torch.ones(2, 1, 1, 5, dtype=torch.bool)
    assert torch.equal(plain(x, keep), fused(x, keep))
    assert fused.fused_bias_gelu
    assert not TransformerLayer(Namespace(**{**vars(cfg), "activation_fn": "relu"})).fused_bias_gelu
    assert not TransformerLayer(Namespace(**{**vars(cfg), "activation_dropout": 0.1})).fused_bias_gelu
