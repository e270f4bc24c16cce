"""`models.residual_products` (`--residual-grad-in-products`): the products of a layer's input and the residual's
gradient added in their input-gradient product, against plain products and autograd's own sum, in float64 on the
CPU; in a Transformer layer, eager and compiled; compiled, the sums made in place."""
import re
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

from torch._inductor.utils import run_and_get_code

from conftest import fairseq_train
from fairseq_xmlm.models.partially_shared_roberta import TransformerLayer
from fairseq_xmlm.models.residual_products import accumulate_products_grad, linear_products


def parameters(count, dim=6, out=5, bias=True, seed=0):
    generator = torch.Generator().manual_seed(seed)

    def leaf(*shape):
        return torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
    return [leaf(out, dim) for _ in range(count)], [leaf(out) if bias else None for _ in range(count)]


def residual_block(x, weights, biases, through_products):
    """LayerNorm(x + sum of tanh(products)), x feeding both the products and the residual sum."""
    products, residual = linear_products(x, weights, biases, through_products)
    branch = sum(torch.tanh(p) @ torch.ones(p.size(-1), x.size(-1), dtype=x.dtype) for p in products)
    return F.layer_norm(residual + branch, (x.size(-1),))


@pytest.mark.parametrize("count, bias", [(1, True), (3, True), (1, False)])
def test_gradients_equal_autograds_sum(count, bias):
    weights, biases = parameters(count, bias=bias)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    leaves = [x, *weights, *(b for b in biases if b is not None)]
    grad = torch.randn(2, 4, 6, dtype=torch.float64)
    got = residual_block(x, weights, biases, True)
    expected = residual_block(x, weights, biases, False)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    for got_grad, expected_grad in zip(torch.autograd.grad(got, leaves, grad),
                                       torch.autograd.grad(expected, leaves, grad)):
        torch.testing.assert_close(got_grad, expected_grad)


def test_compiled_backward_adds_into_the_residuals_gradient_without_a_copy():
    """Compiled, inductor calls our op on the buffer of the residual's gradient itself: no clone or copy of it first
    (an addmm out of place copies its input, which made the first version of this no faster on a GPU)."""
    weights, biases = parameters(3)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(residual_block)

    def step():
        compiled(x, weights, biases, True).sum().backward()

    _, (forward_code, backward_code) = run_and_get_code(step)
    op = accumulate_products_grad._qualname.replace("::", ".")
    calls = [line for line in backward_code.splitlines() if f"torch.ops.{op}.default(" in line]
    assert len(calls) == 1
    assert "clone" not in backward_code and "copy_" not in backward_code
    expected = torch.autograd.grad(residual_block(x, weights, biases, False).sum(), [x])[0]
    torch.testing.assert_close(x.grad, expected)


def test_the_op_adds_in_place():
    generator = torch.Generator().manual_seed(1)
    grad_x, first, second = (torch.randn(4, n, generator=generator) for n in (6, 5, 3))
    weights = [torch.randn(5, 6, generator=generator), torch.randn(3, 6, generator=generator)]
    expected = grad_x + first @ weights[0] + second @ weights[1]
    address = grad_x.data_ptr()
    accumulate_products_grad(grad_x, [first, second], weights)
    assert grad_x.data_ptr() == address
    torch.testing.assert_close(grad_x, expected)


def test_without_the_residual_or_a_product_in_the_loss():
    """The residual view unused: x's gradient is the products' alone; a product unused: no gradient for its weights,
    and none of it in x's."""
    weights, biases = parameters(2)
    x = torch.randn(3, 6, dtype=torch.float64, requires_grad=True)
    (first, _), residual = linear_products(x, weights, biases, True)
    grads = torch.autograd.grad(first.sum(), [x, weights[0], weights[1]], allow_unused=True, retain_graph=True)
    expected = torch.autograd.grad(F.linear(x, weights[0], biases[0]).sum(), [x, weights[0]])
    torch.testing.assert_close(grads[0], expected[0])
    torch.testing.assert_close(grads[1], expected[1])
    assert grads[2] is None
    (x_grad,) = torch.autograd.grad((residual * 2).sum(), [x])
    torch.testing.assert_close(x_grad, torch.full_like(x, 2.0))


@pytest.mark.parametrize("reached", [(0, 1, 2), (0, 2)])
def test_one_product_in_parts_equals_the_separate_products(reached):
    """Q, K and V from one product (parts=3): the outputs and every gradient as three products of the weight's
    thirds; a part the loss does not reach gets zeros in the joined gradients."""
    (weight,), (bias,) = parameters(1, out=9)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(2, 4, 6, dtype=torch.float64)

    def block(parts):
        if parts == 1:
            products, residual = linear_products(x, weight.chunk(3), bias.chunk(3), True)
        else:
            products, residual = linear_products(x, [weight], [bias], True, parts=3)
        branch = sum(torch.tanh(products[i]) @ torch.ones(3, 6, dtype=x.dtype) for i in reached)
        return F.layer_norm(residual + branch, (6,))
    got, expected = block(3), block(1)
    torch.testing.assert_close(got, expected)  # one GEMM's sums in another order than three's
    for got_grad, expected_grad in zip(torch.autograd.grad(got, [x, weight, bias], grad),
                                       torch.autograd.grad(expected, [x, weight, bias], grad)):
        torch.testing.assert_close(got_grad, expected_grad)


def test_a_frozen_weight_and_a_bias_without_gradient_get_none():
    """A weight frozen in fine-tuning and a constant bias get no gradient, the other leaves the plain products'
    own."""
    weights, biases = parameters(2)
    weights[1].requires_grad_(False)
    biases[0] = torch.zeros(5, dtype=torch.float64)
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    leaves = [x, weights[0], biases[1]]
    got = residual_block(x, weights, biases, True)
    expected = residual_block(x, weights, biases, False)
    for got_grad, expected_grad in zip(torch.autograd.grad(got.sum(), leaves, retain_graph=True),
                                       torch.autograd.grad(expected.sum(), leaves)):
        torch.testing.assert_close(got_grad, expected_grad)
    nodes = [got.grad_fn]
    while nodes and type(nodes[-1]).__name__ != "_ProductsKeepingInputBackward":
        nodes += [node for node, _ in nodes.pop().next_functions if node is not None]
    grads = nodes[-1].apply(*(torch.ones(2, 4, n, dtype=torch.float64) for n in (5, 5, 6)))
    assert [grad is None for grad in grads] == [False, True, False, True, True, False]  # x, parts, w1, b1, w2, b2


def test_under_autocast_the_plain_products():
    weights, biases = parameters(1)
    x = torch.randn(3, 6, dtype=torch.float64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, residual = linear_products(x.float(), [w.float() for w in weights], [b.float() for b in biases], True)
    assert residual._base is None  # x itself, not the function's view


def layer_config(**overrides):
    cfg = dict(encoder_embed_dim=32, encoder_attention_heads=4, encoder_ffn_embed_dim=64, activation_fn="gelu",
               dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, residual_grad_in_products=True)
    return Namespace(**{**cfg, **overrides})


def function_nodes(output):
    """The backward graph's nodes of our function, from `output` down."""
    seen, stack, found = set(), [output.grad_fn], 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        found += type(node).__name__ == "_ProductsKeepingInputBackward"
        stack.extend(next_node for next_node, _ in node.next_functions)
    return found


@pytest.mark.parametrize("compiled, one_qkv_product", [(False, False), (True, False), (False, True), (True, True)])
def test_layer_equals_the_plain_one(compiled, one_qkv_product):
    torch.manual_seed(0)
    plain = TransformerLayer(layer_config(residual_grad_in_products=False)).double()
    carried = TransformerLayer(layer_config(one_qkv_product=one_qkv_product)).double()
    carried.load_state_dict(plain.state_dict())
    assert carried.residual_grad_in_products and not plain.residual_grad_in_products
    x = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    keep = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    keep[1, ..., 3:] = False
    grad = torch.randn(2, 5, 32, dtype=torch.float64)
    run = torch.compile(carried, fullgraph=True) if compiled else carried
    got = run(x, keep)
    expected = plain(x, keep)
    torch.testing.assert_close(got, expected)
    if not compiled:  # the Q, K, V products and the feed-forward's first go through the function
        assert function_nodes(got) == 2 and function_nodes(expected) == 0
    got_grads = torch.autograd.grad(got, [x, *carried.parameters()], grad)
    expected_grads = torch.autograd.grad(expected, [x, *plain.parameters()], grad)
    for (name, _), got_grad, expected_grad in zip([("x", None), *plain.named_parameters()], got_grads, expected_grads):
        torch.testing.assert_close(got_grad, expected_grad, msg=name)


def test_fairseq_train_with_the_option_logs_the_same_losses(fake_english_data, tmp_path):
    """The model option through fairseq-train's command line: the losses of the first updates as without it (fp32,
    where only the order of the input gradient's sums differs)."""
    losses = []
    for name, extra in (("plain", []), ("carried", ["--residual-grad-in-products"])):
        log = fairseq_train(fake_english_data, tmp_path / name, "--task", "fake_english", *extra, updates=4)
        assert f"'residual_grad_in_products': {bool(extra)}" in log  # the model's configuration, as fairseq logs it
        losses.append(re.findall(r"\bloss=([0-9.]+)", log))
    assert len(losses[0]) >= 4 and losses[1] == losses[0]
