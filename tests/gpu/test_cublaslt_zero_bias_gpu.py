"""`--cublaslt-zero-bias` on a GPU: a Conneau-config layer in bf16 with our other kernels, compiled and replayed as a
CUDA graph, against the same layer without it, eager; and the three products whose bias our kernels add now run
GEMM kernels with a bias epilogue, as Q, K and V do."""
import pytest
import torch
from torch.profiler import ProfilerActivity, profile

pytestmark = pytest.mark.gpu

OUR_KERNELS = ("fused_dropout_norm", "fused_bias_gelu", "residual_grad_in_products")


def with_our_kernels(layers):
    for layer in layers:
        for flag in OUR_KERNELS:
            setattr(layer, flag, True)


def bias_epilogue_gemms(layer, x, keep):
    """How many GEMM kernels of one forward pass have a bias in their name (cuBLASLt's nvjet kernels do)."""
    with torch.no_grad(), profile(activities=[ProfilerActivity.CUDA]) as trace:
        layer(x, keep)
        torch.cuda.synchronize()
    names = [event.name for event in trace.events() if event.device_type.name == "CUDA"]
    return sum("gemm" in name.lower() or "nvjet" in name for name in names if "bias" in name)


def test_layer_compiled_as_a_cuda_graph_equals_the_plain_one(conneau_layers):
    plain, zero_bias, x, keep = conneau_layers("cublaslt_zero_bias", dropout=0.0)
    with_our_kernels((plain, zero_bias))
    assert zero_bias.zero_bias_dim.dtype == torch.bfloat16 and "zero_bias_dim" not in zero_bias.state_dict()
    plain_bias, zero_bias_bias = (bias_epilogue_gemms(layer, x, keep) for layer in (plain, zero_bias))
    if plain_bias == 0:
        pytest.skip("this GPU's GEMM kernels do not name their bias epilogue")
    assert zero_bias_bias == plain_bias + 3  # the attention's output and the feed-forward's two
    x.requires_grad_()
    direction = torch.randn(16, 256, 768, device="cuda")
    compiled = torch.compile(zero_bias, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay, each a training step
        torch.compiler.cudagraph_mark_step_begin()
        zero_bias.zero_grad(set_to_none=True)
        x.grad = None
        got = compiled(x, keep)
        (got.float() * direction).sum().backward()
    got_grads = [x.grad.clone()] + [p.grad.clone() for p in zero_bias.parameters()]
    got = got.detach().clone()
    x.grad = None
    expected = plain(x, keep)
    (expected.float() * direction).sum().backward()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=5e-2)
    for got_grad, leaf in zip(got_grads, [x, *plain.parameters()]):
        scale = leaf.grad.abs().max().item()
        torch.testing.assert_close(got_grad.float() / scale, leaf.grad.float() / scale, rtol=5e-2, atol=5e-2)
    assert (zero_bias.zero_bias_dim == 0).all() and (zero_bias.zero_bias_ffn == 0).all()
