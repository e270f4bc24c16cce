"""`--fused-dropout-norm` on a GPU: our dropout + residual + LayerNorm kernels (`models.dropout_norm`) compiled by
Triton, alone and inside a compiled layer replayed as a CUDA graph, against eager PyTorch in fp32."""
import pytest
import torch
import torch.nn as nn

from fairseq_xmlm.models.dropout_norm import _dropout_add_layer_norm, dropout_add_layer_norm

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernels_equal_eager_in_fp32(dtype):
    torch.manual_seed(0)
    rows, dim = 24_576 // 4, 768  # a quarter of the Conneau config's batch
    x, residual = (torch.randn(rows, dim, device="cuda").to(dtype).requires_grad_() for _ in range(2))
    bias = torch.randn(dim, device="cuda").to(dtype).requires_grad_()
    norm = nn.LayerNorm(dim, device="cuda", dtype=dtype)
    with torch.no_grad():
        norm.weight.normal_(1, 0.5), norm.bias.normal_()
    grad = torch.randn(rows, dim, device="cuda").to(dtype)
    leaves = (x, bias, residual, norm.weight, norm.bias)
    got = dropout_add_layer_norm(x, bias, residual, norm, 0.0)
    got_grads = torch.autograd.grad(got, leaves, grad)
    fp32 = [leaf.detach().float().requires_grad_() for leaf in leaves]
    expected = nn.functional.layer_norm(fp32[2] + fp32[0] + fp32[1], (dim,), fp32[3], fp32[4], norm.eps)
    expected_grads = torch.autograd.grad(expected, fp32, grad.float())
    tolerance = dict(rtol=0, atol=1e-4) if dtype == torch.float32 else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(got.float(), expected, **tolerance)
    for name, got_grad, expected_grad in zip(("x", "bias", "residual", "weight", "norm bias"), got_grads,
                                             expected_grads):
        assert got_grad.dtype == dtype, name
        # the parameters' gradients sum 6,144 rows
        scale = 1 if name in ("x", "residual") else expected_grad.abs().max().item()
        torch.testing.assert_close(got_grad.float() / scale, expected_grad / scale, **tolerance, msg=name)


def test_dropout_rate_and_fresh_draws():
    rows, dim = 4096, 768
    ones, zeros = torch.ones(rows, dim, device="cuda", dtype=torch.bfloat16), torch.zeros(dim, device="cuda")
    summed = [_dropout_add_layer_norm(ones, zeros, torch.zeros_like(ones), torch.ones(dim, device="cuda"), zeros,
                                      torch.tensor([seed], device="cuda"), 0.1, 1e-5)[1] for seed in (1, 1, 2)]
    kept = summed[0] != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.002  # over 3.1M draws
    assert torch.equal(summed[0], summed[1]) and not torch.equal(summed[0], summed[2])
    # the columns and rows each keep 90 %: no stripe of the tile left undrawn
    assert kept.float().mean(0).min().item() > 0.85 and kept.float().mean(1).min().item() > 0.85


def test_fused_layer_compiled_as_a_cuda_graph_equals_the_unfused_one(conneau_layers):
    plain, fused, x, keep = conneau_layers("fused_dropout_norm", dropout=0.1)
    compiled = torch.compile(fused, mode="reduce-overhead")
    plain.eval(), fused.eval()
    for _ in range(3):  # warm-up, recording, replay
        got = compiled(x, keep).clone()
    torch.testing.assert_close(got.float(), plain(x, keep).float(), rtol=2e-2, atol=5e-2)
    # training: a replay draws a new mask, and the gradient reaches every parameter
    fused.train()
    first, second = (compiled(x, keep).clone() for _ in range(2))
    assert not torch.equal(first, second)
    compiled(x, keep).float().square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in fused.parameters())
