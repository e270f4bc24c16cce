"""The optimiser of a packed group: fairseq's `adam` (or torch's AdamW for `--optimizer xmlm_adamw`) with decoupled
weight decay and per-run `--clip-norm`, over every run's flat weights at once, and fairseq's `polynomial_decay`
schedule as its trainer steps it.

`tests/test_packed_training.py` checks a packed update against fairseq's own Trainer (fairseq's formula) and
`AdamState` against torch's AdamW loop with `clip_grad_norm_` (torch's formula).
"""
import math

import torch

from fairseq_xmlm.optim.xmlm_adamw import parse_betas


def adam_betas(optimizer_cfg):
    """--adam-betas as a tuple of floats."""
    betas = optimizer_cfg.adam_betas
    return parse_betas(betas) if isinstance(betas, str) else tuple(float(b) for b in betas)  # fairseq: a list


def learning_rate(update, sched, peak):
    """The rate fairseq's trainer uses for update `update` (1-based): polynomial_decay at update - 1."""
    done = update - 1
    if sched.warmup_updates > 0 and done <= sched.warmup_updates:
        return peak * done / sched.warmup_updates
    if done >= sched.total_num_update:
        return sched.end_learning_rate
    remaining = 1 - (done - sched.warmup_updates) / (sched.total_num_update - sched.warmup_updates)
    return (peak - sched.end_learning_rate) * remaining ** sched.power + sched.end_learning_rate


def clip_scales(grads, clip_norm):
    """(N, 1) factors that clip each run's gradients (a list of (N, ...) tensors) to norm `clip_norm`, as fairseq's
    --clip-norm does for one run."""
    norms = torch.stack([g.float().reshape(g.size(0), -1).square().sum(1) for g in grads]).sum(0).sqrt()
    return (clip_norm / (norms + 1e-6)).clamp(max=1.0).unsqueeze(1)


def adam_update(flat, grad, exp_avg, exp_avg_sq, compute, hyper, beta1, beta2, weight_decay, scale):
    """One AdamW step of every run, in place, in one pass over some columns of the (N, P) buffers: the moments,
    decoupled weight decay, the step and the low-precision copy `compute` (None in fp32), from the gradients `grad`
    (N, columns, any dtype) times `scale` (None, or `clip_scales`).
    hyper = (lr, eps, 1 - beta1^t, sqrt(1 - beta2^t)) as a tensor, so that compiled it serves every step."""
    g = grad.float()
    if scale is not None:
        g = g * scale
    lr, eps, bias_correction1, bias_correction2_sqrt = hyper.unbind()
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    flat.mul_(1 - lr * weight_decay)
    flat.sub_(lr / bias_correction1 * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))
    if compute is not None:
        compute.copy_(flat)


class AdamState:
    """Adam over the flat (N, P) master weights `flat`, whose gradients come as one tensor for each (start, end) of
    `columns` (`StackedEncoder.gradients`): torch's AdamW formula, one `adam_update` a segment, compiled with
    `compile` into one elementwise kernel each (after a reduction when clipping). Where torch's fused AdamW needs the
    gradients widened to fp32 first and the bf16 copy refreshed after, this reads and writes each buffer once. For
    fairseq's `adam`, which adds eps before the bias correction, that is the same update with eps / sqrt(1 -
    beta2^t), given at each step; `xmlm_adamw` is torch's own."""

    def __init__(self, flat, columns, betas, eps, weight_decay, torch_style, clip_norm=0.0, compute=None,
                 compile=False):
        self.flat, self.compute = flat, (None if compute is flat else compute)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        # each segment's columns of flat, exp_avg, exp_avg_sq and compute, as views made once
        self.segments = [tuple(None if buffer is None else buffer[:, start:end]
                               for buffer in (flat, self.exp_avg, self.exp_avg_sq, self.compute))
                         for start, end in columns]
        self.betas, self.eps, self.weight_decay, self.torch_style = betas, eps, weight_decay, torch_style
        self.clip_norm = clip_norm
        self.update = torch.compile(adam_update) if compile else adam_update
        self.clip_scales = torch.compile(clip_scales) if compile else clip_scales
        self.step_count = 0
        # this step's (lr, eps, 1 - beta1^t, sqrt(1 - beta2^t)), in one place on the device: a CUDA graph of the
        # step reads it there at every replay
        self.hyper = torch.zeros(4, device=flat.device)

    def schedule(self, lr):
        """Count the step and queue its rate and bias corrections for `apply`."""
        self.step_count += 1
        bias_correction2_sqrt = math.sqrt(1 - self.betas[1] ** self.step_count)
        eps = self.eps if self.torch_style else self.eps / bias_correction2_sqrt
        hyper = torch.tensor([lr, eps, 1 - self.betas[0] ** self.step_count, bias_correction2_sqrt])
        if self.flat.is_cuda:  # pinned: the copy queues behind the GPU's work instead of waiting for it
            hyper = hyper.pin_memory()
        self.hyper.copy_(hyper, non_blocking=True)

    def apply(self, grads):
        """The update with the last `schedule`d values and `grads`, one tensor a segment."""
        scale = self.clip_scales(grads, self.clip_norm) if self.clip_norm > 0 else None
        for (flat, exp_avg, exp_avg_sq, compute), grad in zip(self.segments, grads, strict=True):
            # every gradient as (N, columns): one compiled version serves weights of any shape
            self.update(flat, grad.reshape(grad.size(0), -1), exp_avg, exp_avg_sq, compute, self.hyper, *self.betas,
                        self.weight_decay, scale)

    def step(self, lr, grads):
        self.schedule(lr)
        self.apply(grads)

    def state_dict(self):
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "adam_steps": self.step_count}

    def load_state_dict(self, state):
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count = state["adam_steps"]
