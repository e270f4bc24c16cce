"""xmlm_adamw's `--fused-master-step`: one Triton kernel takes the flat low-precision gradient, applies AdamW to the
flat fp32 master weights and writes the low-precision weights the model reads.

Without it an update of `FlatMasterWeights` is six passes over the parameters after the gradients' gathering: the
gradient cast to fp32, multiplied by 1 / sample size, multiplied again when clipped, torch's fused AdamW, the master
cast back to bf16, and that copied into the parameters (1.3 ms an update at the Conneau config on an H200,
`docs/results/profile/`). Here the factors wait as a number and a GPU scalar until the step, the gradient's norm
is taken from the low-precision gradient (the same values), and the parameters are views of the weights the kernel
writes: one pass. Its flat gradient is gathered from the parameters' gradients by one multi-tensor copy
(`FlatMasterWeights.gather_gradients`): at the Conneau config on an H200, gather, norm and step take 0.77 ms, where
reading each gradient in place through a table of their addresses took 0.85 ms (that kernel's programs read their
parameter's place before they can load, and small parameters leave blocks part empty) and a `torch.cat` 0.93
(`benchmarks/master_step_speed.py`, docs/performance.md).

The update is torch's AdamW (`torch.optim.AdamW`, decoupled weight decay; the paper of it: Loshchilov & Hutter 2019,
Algorithm 2), per element with the step count t after its increment:
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
in fp32, b^t as exp2(t log2 b). Its state is torch's own (`step`, `exp_avg`, `exp_avg_sq` of the master tensor), so
checkpoints pass between the two paths. A step flagged as non-finite (the `found_inf` of `step_unless_nonfinite`)
changes nothing, the step count included, as in torch's fused kernel.
"""
import math

import torch

import triton
import triton.language as tl

BLOCK = 4096  # elements a program: 8 warps of 16-byte loads of fp32, four per thread


@triton.jit
def _adamw_kernel(grad, master, exp_avg, exp_avg_sq, weights, factor_at, skip_at, step_at, size, scale, lr,
                  beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay, BLOCK: tl.constexpr, FACTOR: tl.constexpr,
                  SKIP: tl.constexpr):
    if SKIP:
        if tl.load(skip_at) != 0:
            return
    numbers = (factor_at, step_at, scale, lr, beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay)
    block = tl.program_id(0).to(tl.int64)
    at = block * BLOCK + tl.arange(0, BLOCK)
    # A full block unmasked: its loads and stores 16 bytes wide whatever the size (a mask on `at < size` lets the
    # compiler vectorise only where the JIT saw the size divisible by 16); the last block masked.
    if (block + 1) * BLOCK <= size:
        _adamw_elements(grad + at, at, tl.full([BLOCK], 1, tl.int1), master, exp_avg, exp_avg_sq, weights, *numbers,
                        FACTOR)
    else:
        _adamw_elements(grad + at, at, at < size, master, exp_avg, exp_avg_sq, weights, *numbers, FACTOR)


@triton.jit
def _adamw_elements(grad_at, at, inside, master, exp_avg, exp_avg_sq, weights, factor_at, step_at, scale, lr, beta1,
                    beta2, log2_beta1, log2_beta2, eps, weight_decay, FACTOR: tl.constexpr):
    """The update of the elements `at` of the flat tensors, where `inside`."""
    g = tl.load(grad_at, mask=inside, other=0.0).to(tl.float32) * scale
    if FACTOR:
        g = g * tl.load(factor_at).to(tl.float32)
    p = tl.load(master + at, mask=inside, other=0.0)
    m = tl.load(exp_avg + at, mask=inside, other=0.0)
    v = tl.load(exp_avg_sq + at, mask=inside, other=0.0)
    t = tl.load(step_at).to(tl.float32)
    step_size = lr / (1.0 - tl.exp2(t * log2_beta1))
    root_correction2 = tl.sqrt(1.0 - tl.exp2(t * log2_beta2))
    p = p * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / root_correction2 + eps)
    tl.store(master + at, p, mask=inside)
    tl.store(exp_avg + at, m, mask=inside)
    tl.store(exp_avg_sq + at, v, mask=inside)
    tl.store(weights + at, p.to(weights.dtype.element_ty), mask=inside)


def adamw_state(optimizer, master):
    """torch.optim.AdamW's state of `master`, made as its own first step would make it (a fused optimizer keeps the
    step count on the device) where it has none yet."""
    state = optimizer.state[master]
    if not state:
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        state["step"] = torch.zeros((), dtype=torch.float32, device=master.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
    return state


def fused_adamw_step(optimizer, master, grad, weights, scale=1.0, factor=None, skip=None):
    """One AdamW step of the fp32 tensor `master` (torch.optim.AdamW `optimizer`'s only parameter) from the flat
    low-precision gradient `grad` times `scale` (a number) and `factor` (a GPU scalar or None); writes the new master
    rounded to `weights`. `skip`: a scalar tensor, non-zero where the step must change nothing."""
    group = optimizer.param_groups[0]
    if group.get("amsgrad") or group.get("maximize"):
        raise ValueError("the fused master step has no amsgrad or maximize")
    beta1, beta2 = group["betas"]
    state = adamw_state(optimizer, master)
    step = state["step"]
    if step.device != master.device:
        raise ValueError("the fused master step needs the step count beside the weights (torch's fused AdamW)")
    step.add_(1 if skip is None else 1 - skip.to(step.dtype))
    size = master.numel()
    _adamw_kernel[(triton.cdiv(size, BLOCK),)](
        grad, master, state["exp_avg"], state["exp_avg_sq"], weights,
        master if factor is None else factor, master if skip is None else skip, step, size,
        float(scale), float(group["lr"]), beta1, beta2, math.log2(beta1) if beta1 > 0 else -math.inf,
        math.log2(beta2) if beta2 > 0 else -math.inf, group["eps"], group["weight_decay"],
        BLOCK=BLOCK, FACTOR=factor is not None, SKIP=skip is not None, num_warps=8)
