"""Products of a layer's input whose input gradient also adds the residual connection's gradient
(`--residual-grad-in-products`).

In a post-LayerNorm layer the input x feeds products (the attention's Q, K and V; the feed-forward's first) and the
residual sum LayerNorm(x + ...). Autograd adds the two gradients of x in a kernel of its own once both exist, two a
layer: at the Conneau config on an H200 0.59 ms an update, the products' outputs written and read back
(`docs/performance.md`, the timeline's adds). Here one autograd function makes the products and hands x on again (a
view) for the residual, so that its backward receives both gradients at once: cuBLAS adds the residual's to the
input gradient in the products' epilogue (addmm, beta = 1), dx = g_residual + sum_i g_i W_i, where the products are
bound by their arithmetic, not by memory. Weights' and biases' gradients are the products' as before.

Not under autocast: the function's backward would see the products' gradients in bf16 and the weights in fp32.
"""
import torch
import torch.nn.functional as F


class _ProductsKeepingInput(torch.autograd.Function):
    """forward(x, w_1, b_1, ..., w_n, b_n) = (x w_1^T + b_1, ..., x w_n^T + b_n, x); a bias may be None."""

    @staticmethod
    def forward(ctx, x, *weights_and_biases):
        weights, biases = weights_and_biases[0::2], weights_and_biases[1::2]
        ctx.save_for_backward(x, *weights)
        ctx.with_bias = [bias is not None for bias in biases]
        ctx.set_materialize_grads(False)  # an output the loss does not reach: None, not a product with zeros
        return (*(F.linear(x, weight, bias) for weight, bias in zip(weights, biases)), x.view_as(x))

    @staticmethod
    def backward(ctx, *grads):
        x, *weights = ctx.saved_tensors
        *grad_products, grad_residual = grads
        dim = x.size(-1)
        rows = x.reshape(-1, dim)
        grad_x = None if grad_residual is None else grad_residual.reshape(-1, dim)
        grad_params = []
        for weight, grad, with_bias in zip(weights, grad_products, ctx.with_bias):
            if grad is None:  # a product the loss does not reach
                grad_params += [None, None]
                continue
            grad = grad.reshape(-1, grad.size(-1))
            grad_x = grad @ weight if grad_x is None else torch.addmm(grad_x, grad, weight)
            grad_params += [grad.t() @ rows, grad.sum(0) if with_bias else None]
        return (None if grad_x is None else grad_x.view(x.shape), *grad_params)


def linear_products(x, weights, biases, residual_grad_in_products=False):
    """([F.linear(x, w, b) for each weight and bias], x for the residual sum). With residual_grad_in_products (and
    no autocast) through one autograd function whose input gradient adds the residual's in the products."""
    if residual_grad_in_products and not torch.is_autocast_enabled(x.device.type):
        *products, residual = _ProductsKeepingInput.apply(x, *(t for pair in zip(weights, biases) for t in pair))
        return products, residual
    return [F.linear(x, weight, bias) for weight, bias in zip(weights, biases)], x
