"""`--fused-bias-gelu` on a GPU: our GELU(x + bias) kernels (`models.bias_gelu`) compiled by Triton, alone and in a
compiled layer replayed as a CUDA graph, against eager PyTorch in fp32."""
import pytest
import torch
import torch.nn.functional as F

from fairseq_xmlm.models.bias_gelu import bias_gelu

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_kernels_equal_eager_in_fp32(dtype):
    torch.manual_seed(0)
    rows, dim = 24_576 // 4, 3072  # a quarter of the Conneau config's batch, its feed-forward width
    x = (2 * torch.randn(rows, dim, device="cuda")).to(dtype).requires_grad_()
    bias = torch.randn(dim, device="cuda").to(dtype).requires_grad_()
    grad = torch.randn(rows, dim, device="cuda").to(dtype)
    got = bias_gelu(x, bias)
    got_grads = torch.autograd.grad(got, (x, bias), grad)
    fp32 = [leaf.detach().float().requires_grad_() for leaf in (x, bias)]
    expected = F.gelu(fp32[0] + fp32[1])
    expected_grads = torch.autograd.grad(expected, fp32, grad.float())
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, **tolerance)
    for name, got_grad, expected_grad in zip(("x", "bias"), got_grads, expected_grads):
        assert got_grad.dtype == dtype, name
        scale = expected_grad.abs().max().item()  # the bias's gradient sums 6,144 rows
        torch.testing.assert_close(got_grad.float() / scale, expected_grad / scale, **tolerance, msg=name)


def test_fused_layer_compiled_as_a_cuda_graph_equals_the_unfused_one(conneau_layers):
    plain, fused, x, keep = conneau_layers("fused_bias_gelu", dropout=0.0)
    # a random direction: LayerNorm's output has a mean square of about 1 whatever its input, so that the square's
    # gradient below the norm is rounding noise
    direction = torch.randn(16, 256, 768, device="cuda")
    compiled = torch.compile(fused, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay, each a training step
        torch.compiler.cudagraph_mark_step_begin()
        fused.zero_grad(set_to_none=True)  # as a trainer does: the last step's gradients are the graph's outputs
        got = compiled(x, keep)
        (got.float() * direction).sum().backward()
    got_grads = [p.grad.clone() for p in fused.parameters()]
    got = got.detach().clone()
    expected = plain(x, keep)
    (expected.float() * direction).sum().backward()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=5e-2)
    for got_grad, p in zip(got_grads, plain.parameters()):
        scale = p.grad.abs().max().item()
        torch.testing.assert_close(got_grad.float() / scale, p.grad.float() / scale, rtol=5e-2, atol=5e-2)
