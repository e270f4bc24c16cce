"""`--residual-grad-in-products` (with and without `--one-qkv-product`) on a GPU: a Conneau-config layer in bf16
with our other kernels, compiled and replayed as a CUDA graph, against the same layer without it, eager: output,
the input's gradient (where the residual's now joins in the products) and the parameters' gradients."""
import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("one_qkv_product", [False, True])
def test_layer_compiled_as_a_cuda_graph_equals_the_plain_one(conneau_layers, one_qkv_product):
    plain, carried, x, keep = conneau_layers("residual_grad_in_products", dropout=0.0)
    for layer in (plain, carried):
        layer.fused_dropout_norm = layer.fused_bias_gelu = True  # as the fastest variant trains
    carried.one_qkv_product = one_qkv_product
    x.requires_grad_()
    direction = torch.randn(16, 256, 768, device="cuda")  # a random direction: LayerNorm's output has a fixed scale
    compiled = torch.compile(carried, mode="reduce-overhead")
    for _ in range(3):  # warm-up, recording, replay, each a training step
        torch.compiler.cudagraph_mark_step_begin()
        carried.zero_grad(set_to_none=True)
        x.grad = None
        got = compiled(x, keep)
        (got.float() * direction).sum().backward()
    got_grads = [x.grad.clone()] + [p.grad.clone() for p in carried.parameters()]
    got = got.detach().clone()
    x.grad = None
    expected = plain(x, keep)
    (expected.float() * direction).sum().backward()
    torch.testing.assert_close(got.float(), expected.float(), rtol=2e-2, atol=5e-2)
    for got_grad, leaf in zip(got_grads, [x, *plain.parameters()]):
        scale = leaf.grad.abs().max().item()
        torch.testing.assert_close(got_grad.float() / scale, leaf.grad.float() / scale, rtol=5e-2, atol=5e-2)
