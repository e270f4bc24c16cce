"""`--optimizer xmlm_adamw`: torch's AdamW, fused into one CUDA kernel launch per step when the parameters live on
the GPU (fairseq's own `adam` steps parameter by parameter in Python unless apex is installed).

Same options and the same decoupled weight decay as fairseq's `adam` (`--adam-betas`, `--adam-eps`,
`--weight-decay`), so recipes switch by changing the optimizer name only.

With `--memory-efficient-fp16` fairseq hands this optimizer the fp16 parameters themselves; it then keeps their fp32
master copy as one flat tensor (`FlatMasterWeights`): the same arithmetic as `--fp16` (fairseq's FP16Optimizer:
fp32 master weights, AdamW in fp32, dynamic loss scaling), but gradients come in and weights go back in a few
whole-buffer kernels, where FP16Optimizer copies each parameter on its own, twice per update (at the Conneau
config its ~220 copy calls per update were where the GPU waited for the host: profiled on one H100 80GB, 2026-11-26).

Under `--ddp-backend legacy_ddp` (or `no_c10d`) with those flat master weights, the gradients are averaged over the
data-parallel ranks as that one flat low-precision buffer, in a single all-reduce, in place of the wrapper's
parameter-by-parameter copies into and out of its bucket.

`--fused-master-step` (with those flat master weights) takes the update's gradient factors (1 / sample size, the
clipping, a loss scale) into one Triton kernel of ours with AdamW and the low-precision copy of the weights
(`optim/master_step.py`), and makes the parameters views of that copy.
"""
import ast
from dataclasses import dataclass, field
from typing import List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.distributed import LegacyDistributedDataParallel, ModuleProxyWrapper
from fairseq.distributed import utils as distributed_utils
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.optim.master_step import fused_adamw_step


@dataclass
class XmlmAdamWConfig(FairseqDataclass):
    adam_betas: str = field(default="(0.9, 0.999)", metadata={"help": "betas for AdamW"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for AdamW"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    fused: bool = field(default=True, metadata={"help": "one fused CUDA kernel per step when parameters are on GPU"})
    fused_master_step: bool = field(
        default=False,
        metadata={"help": "with low-precision parameters (--bf16-params, --memory-efficient-fp16): gradient scaling, "
                          "AdamW on the fp32 master weights and their low-precision copy in one Triton kernel of ours "
                          "(optim/master_step.py); the parameters become views of that copy"},
    )
    lr: List[float] = II("optimization.lr")


def parse_betas(text):
    """"(0.9, 0.98)" or "0.9,0.98" -> (0.9, 0.98)."""
    try:
        betas = ast.literal_eval(text if text.strip().startswith("(") else f"({text})")
        betas = tuple(float(b) for b in betas)
    except (ValueError, SyntaxError, TypeError):
        raise XmlmError(f"--adam-betas must look like '(0.9, 0.98)', got {text!r}")
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise XmlmError(f"--adam-betas needs two numbers in [0, 1), got {text!r}")
    return betas


def build_adamw(params, lr, betas, eps, weight_decay, fused):
    """torch.optim.AdamW, fused when asked and every parameter is on CUDA (the fused kernel needs that)."""
    params = list(params)
    on_cuda = all(p.is_cuda for group in params for p in (group["params"] if isinstance(group, dict) else [group]))
    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             fused=bool(fused and on_cuda))


class FlatMasterWeights:
    """fp32 master copy of low-precision parameters as one flat tensor, with a flat fp32 gradient.

    `parameters_as_views` (the fused master step): the parameters' storage becomes the flat low-precision weights,
    which the step writes directly, and the gradient stays in low precision (no fp32 copy of it is made)."""

    def __init__(self, params, parameters_as_views=False):
        self.params = params
        self.parameters_as_views = parameters_as_views
        with torch.no_grad():
            self.master = torch.cat([p.reshape(-1).float() for p in params])
        self.master.grad = None if parameters_as_views else torch.zeros_like(self.master)
        self.low_precision_grad = torch.empty_like(self.master, dtype=params[0].dtype)
        self.low_precision_weights = torch.empty_like(self.low_precision_grad)
        sizes = [p.numel() for p in params]
        self.weight_views = [v.view_as(p) for v, p in zip(self.low_precision_weights.split(sizes), params)]
        if parameters_as_views:
            with torch.no_grad():
                torch._foreach_copy_(self.weight_views, params)
            for p, view in zip(params, self.weight_views):
                p.data = view
        self.grad_views = [v.view_as(p) for v, p in zip(self.low_precision_grad.split(sizes), params)]
        self.gathered = False

    def gather_gradients(self, process_group=None):
        """Once per update (zero_grad starts the next): the parameters' gradients -> master.grad, in fp32; with a
        process group, averaged over its ranks on the way. Like fairseq's legacy_ddp, the low-precision gradient is
        divided by the number of ranks before it is summed, so that the sum cannot overflow where one rank's
        gradient does not. The gradients come in by one multi-tensor copy into views of the flat gradient (a
        `torch.cat` into it took twice as long: 0.29 against 0.13 ms at the Conneau config on an H200,
        `benchmarks/master_step_speed.py`)."""
        if self.gathered:
            return
        reached = [(view, p.grad) for p, view in zip(self.params, self.grad_views) if p.grad is not None]
        unreached = [view for p, view in zip(self.params, self.grad_views) if p.grad is None]
        with torch.no_grad():
            if reached:
                torch._foreach_copy_([view for view, _ in reached], [grad for _, grad in reached])
            if unreached:  # parameters the loss did not reach: zero gradient
                torch._foreach_zero_(unreached)
        if process_group is not None:
            self.low_precision_grad.div_(distributed_utils.get_world_size(process_group))
            distributed_utils.all_reduce(self.low_precision_grad, process_group)
        if not self.parameters_as_views:
            self.master.grad.copy_(self.low_precision_grad)
        self.gathered = True

    def scatter_weights(self):
        """master -> the parameters: one cast, one multi-tensor copy."""
        with torch.no_grad():
            self.low_precision_weights.copy_(self.master)
            torch._foreach_copy_(self.params, self.weight_views)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
        self.gathered = False


LOW_PRECISION = (torch.float16, torch.bfloat16)


@register_optimizer("xmlm_adamw", dataclass=XmlmAdamWConfig)
class XmlmAdamW(FairseqOptimizer):
    def __init__(self, cfg, params):
        super().__init__(cfg)
        params = list(params)
        self.master = None
        self.fused_master_step = getattr(cfg, "fused_master_step", False)  # configurations saved before it have none
        if any(isinstance(p, torch.Tensor) and p.dtype in LOW_PRECISION for p in params):
            if not all(isinstance(p, torch.Tensor) and p.dtype == params[0].dtype for p in params):
                raise XmlmError("xmlm_adamw: low-precision parameters must be one dtype and not in parameter groups")
            self.master = FlatMasterWeights(params, parameters_as_views=self.fused_master_step)
            params = [self.master.master]
        elif self.fused_master_step:
            raise XmlmError("--fused-master-step needs low-precision parameters (--bf16-params or "
                            "--memory-efficient-fp16)")
        self._optimizer = build_adamw(params, **self.optimizer_config)
        if self.fused_master_step and self.master.master.is_cuda and not self._optimizer.defaults["fused"]:
            raise XmlmError("--fused-master-step on a GPU needs xmlm_adamw's fused optimizer")
        # the fused master step's gradient factors, applied in its kernel: a number and a GPU scalar (or None)
        self._pending_scale, self._pending_factor = 1.0, None

    @property
    def optimizer_config(self):
        """What fairseq re-applies to the param groups when a checkpoint is loaded (learning rate etc.)."""
        return {
            "lr": self.cfg.lr if isinstance(self.cfg.lr, (int, float)) else self.cfg.lr[0],
            "betas": parse_betas(self.cfg.adam_betas),
            "eps": self.cfg.adam_eps,
            "weight_decay": self.cfg.weight_decay,
            "fused": self.cfg.fused,
        }

    @property
    def supports_flat_params(self):
        return True

    @property
    def supports_memory_efficient_fp16(self):
        return True

    # With fp16 parameters every fairseq entry point works on the fp32 master copy (self.params is the master);
    # the first one of an update gathers the gradients into it.
    def _gather_gradients(self):
        if self.master is not None:
            self.master.gather_gradients()

    def all_reduce_grads(self, module):
        """fairseq's trainer calls this once per update, before any other gradient entry point; xmlm-train's
        trainer calls it earlier (`start_gradient_all_reduce`). Inside legacy_ddp's no_sync (a micro-batch of
        --update-freq before the last) the gradients are still being summed and are left alone."""
        wrapper = module.module if isinstance(module, ModuleProxyWrapper) else module  # how fairseq wraps legacy_ddp
        if self.master is not None and isinstance(wrapper, LegacyDistributedDataParallel):
            if not wrapper.accumulate_grads:
                self.master.gather_gradients(wrapper.process_group)
        else:  # one process, or torch's DDP, which reduced the gradients during backward
            super().all_reduce_grads(module)

    def multiply_grads(self, c):
        self._gather_gradients()
        if self.fused_master_step:
            self._defer_factor(c)
        else:
            super().multiply_grads(c)

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        self._gather_gradients()
        if not self.fused_master_step:
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        # fairseq's utils.clip_grad_norm_ on the gradient as the step will see it: the low-precision values (which
        # the fp32 copy holds exactly) times the factors waiting for the step
        norm = torch.linalg.vector_norm(self.master.low_precision_grad, dtype=torch.float32) * self._pending_scale
        if self._pending_factor is not None:
            norm = norm * self._pending_factor
        if aggregate_norm_fn is not None:
            norm = aggregate_norm_fn(norm)
        if max_norm > 0:
            self._defer_factor((float(max_norm) / (norm + 1e-6)).clamp_(max=1))
        return norm

    def _defer_factor(self, c):
        if torch.is_tensor(c):  # the kernel reads it beside the weights
            c = c.to(self.master.master.device, torch.float32)
            self._pending_factor = c if self._pending_factor is None else self._pending_factor * c
        else:
            self._pending_scale *= c

    def step(self, closure=None, scale=1.0, groups=None):
        self._gather_gradients()
        if self.fused_master_step:
            if scale != 1.0:  # as fairseq's step for optimizers without a scaled step
                self._defer_factor(1.0 / scale)
            fused_adamw_step(self._optimizer, self.master.master, self.master.low_precision_grad,
                             self.master.low_precision_weights, self._pending_scale, self._pending_factor,
                             getattr(self._optimizer, "found_inf", None))
            self._pending_scale, self._pending_factor = 1.0, None
            return
        super().step(closure, scale, groups)
        if self.master is not None:
            self.master.scatter_weights()

    @property
    def skips_on_device(self):
        """Whether `step_unless_nonfinite` decides on the GPU: the fused CUDA kernel reads a found_inf flag."""
        return bool(self._optimizer.defaults.get("fused")) and next(iter(self.params)).is_cuda

    def step_unless_nonfinite(self, grad_norm):
        """The update's step, left out where `grad_norm` is not finite, without the host reading the norm: the fused
        kernel takes the flag as its `found_inf` input (the one torch's GradScaler gives it) and then leaves weights,
        moments and step count as they were. Needs `skips_on_device`. Returns the flag (1.0: skipped) on the GPU."""
        skipped = torch.isfinite(grad_norm).logical_not().float().reshape(())  # the shape of the step counts
        self._optimizer.found_inf = skipped
        try:
            self.step()
        finally:
            del self._optimizer.found_inf
        return skipped

    def zero_grad(self):
        self._pending_scale, self._pending_factor = 1.0, None
        if self.master is None:
            super().zero_grad()
        else:  # master.grad is overwritten by the next gather, not freed
            self.master.zero_grad()


def start_gradient_all_reduce(optimizer, module):
    """xmlm-train's trainer (`train.XmlmTrainer`) calls this right after an update's last backward. fairseq's
    trainer all-reduces the gradients only after it has all-reduced the update's logged values, which first waits on
    the host for the whole backward to finish; queued here, the gradients' all-reduce follows the backward directly
    on the GPU. Only xmlm_adamw's flat gradient (--memory-efficient-fp16) is reduced this early: it is reduced once
    per update, so the trainer's own call does nothing, where fairseq's legacy wrapper would reduce a second time."""
    inner = getattr(optimizer, "wrapped_optimizer", None)  # MemoryEfficientFP16Optimizer's
    if isinstance(inner, XmlmAdamW) and inner.master is not None:
        inner.all_reduce_grads(module)
