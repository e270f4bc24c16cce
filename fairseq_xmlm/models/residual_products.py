"""Products of a layer's input whose input gradient also adds the residual connection's gradient, in place
(`--residual-grad-in-products`).

In a post-LayerNorm layer the input x feeds products (the attention's Q, K and V; the feed-forward's first) and the
residual sum LayerNorm(x + ...). Autograd adds the gradients of x in a kernel of its own once all exist, two a layer:
at the Conneau config on an H200 0.59 ms an update (`docs/performance.md`, the timeline's adds). Here one autograd
function makes the products and hands x on again (a view) for the residual, so that its backward receives every
gradient of x at once, and cuBLAS adds each product's input gradient to the residual's in its epilogue:
    dx = g_residual + sum_i g_i W_i,   each term an addmm with beta = 1 into g_residual's memory.
An addmm whose output is not its input first copies the input into the output (0.60 ms an update when this ran
out of place); so the sums go through `accumulate_products_grad`, a custom op that mutates g_residual, which the
compiler may make in place where nothing else reads g_residual afterwards (inductor's re-inplacing of mutating
custom ops), and copies otherwise. Eager autograd may hand the same gradient tensor to two inputs (an add's
backward), so outside the compiler g_residual is copied first.

The same function makes Q, K and V as one product's three column blocks (`--one-qkv-product`): one GEMM forward
where there were three, and since each block is an output of its own, their gradients still arrive apart, in the
layout the attention kernel returns them (a split's backward would stack them into one (B, T, 3D) gradient).

Not under autocast: the function's backward would see the products' gradients in bf16 and the weights in fp32.
"""
import torch
import torch.nn.functional as F

from fairseq_xmlm.kernel_ops import source_version

_VERSION = source_version(__file__)


@torch.library.custom_op(f"xmlm::accumulate_products_grad_{_VERSION}", mutates_args=("grad_x",))
def accumulate_products_grad(grad_x: torch.Tensor, grads: list[torch.Tensor], weights: list[torch.Tensor]) -> None:
    """grad_x += sum_i grads[i] @ weights[i], for grad_x (rows, dim), grads[i] (rows, out_i), weights[i] (out_i,
    dim): cuBLAS's beta = 1 in place."""
    for grad, weight in zip(grads, weights):
        grad_x.addmm_(grad, weight)


@accumulate_products_grad.register_fake
def _(grad_x, grads, weights):
    return None


class _ProductsKeepingInput(torch.autograd.Function):
    """forward(x, parts, w_1, b_1, ..., w_n, b_n) = (x w_1^T + b_1, ..., x w_n^T + b_n, x); a bias may be None.
    parts > 1 (one weight and bias): the one product's output in `parts` equal column blocks, each an output of its
    own (Q, K and V from one GEMM), whose gradients arrive apart, so none is stacked."""

    @staticmethod
    def forward(ctx, x, parts, *weights_and_biases):
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.save_for_backward(x, *weights)
        ctx.parts = parts
        # a weight frozen in fine-tuning, or a bias that is None or constant, gets no gradient
        ctx.weight_grad, ctx.bias_grad = ctx.needs_input_grad[2::2], ctx.needs_input_grad[3::2]
        ctx.set_materialize_grads(False)  # an output the loss does not reach: None, not a product with zeros
        products = [F.linear(x, weight, bias) for weight, bias in zip(weights, biases)]
        if parts > 1:
            products = products[0].chunk(parts, -1)
        return (*products, x.view_as(x))

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        *grad_products, grad_residual = grads
        weight_grad, bias_grad = ctx.weight_grad, ctx.bias_grad
        if ctx.parts > 1:
            weights = weights[0].chunk(ctx.parts)
            weight_grad, bias_grad = weight_grad * ctx.parts, bias_grad * ctx.parts
        dim = x.size(-1)
        rows = x.reshape(-1, dim)
        grad_params, reached = [], []
        for grad, weight, with_weight, with_bias in zip(grad_products, weights, weight_grad, bias_grad):
            if grad is None:  # a product the loss does not reach
                grad_params += [None, None]
                continue
            grad = grad.reshape(-1, grad.size(-1))
            reached.append((grad, weight))
            grad_params += [grad.t() @ rows if with_weight else None, grad.sum(0) if with_bias else None]
        if ctx.parts > 1:
            grad_params = [joined_parts(grad_params[0::2], weights), joined_parts(grad_params[1::2], weights, True)]
        grad_x = None if grad_residual is None else grad_residual.reshape(-1, dim)
        if grad_x is not None and not torch.compiler.is_compiling():
            grad_x = grad_x.clone()
        if grad_x is None and reached:
            (grad, weight), *reached = reached
            grad_x = grad @ weight
        if reached:
            accumulate_products_grad(grad_x, [grad for grad, _ in reached], [weight for _, weight in reached])
        return (None if grad_x is None else grad_x.view(x.shape), None, *grad_params)


def joined_parts(grads, weights, bias=False):
    """The one weight's (or with `bias` its bias's) gradient from its parts' `grads`: None where no part has one,
    zeros for a part the loss does not reach."""
    if all(grad is None for grad in grads):
        return None
    return torch.cat([grad if grad is not None else weight.new_zeros(weight.shape[:1] if bias else weight.shape)
                      for grad, weight in zip(grads, weights)])


def linear_products(x, weights, biases, residual_grad_in_products=False, parts=1):
    """([F.linear(x, w, b) for each weight and bias], x for the residual sum); parts > 1 (one weight and bias): that
    product's output in `parts` equal column blocks. With residual_grad_in_products (and no autocast) through one
    autograd function whose input gradient adds the residual's in the products."""
    if residual_grad_in_products and not torch.is_autocast_enabled(x.device.type):
        *products, residual = _ProductsKeepingInput.apply(x, parts, *(t for pair in zip(weights, biases) for t in pair))
        return products, residual
    products = [F.linear(x, weight, bias) for weight, bias in zip(weights, biases)]
    return (list(products[0].chunk(parts, -1)) if parts > 1 else products), x
