"""`--optimizer xmlm_adamw`: torch's AdamW, fused into one CUDA kernel launch per step when the parameters live on
the GPU (fairseq's own `adam` steps parameter by parameter in Python unless apex is installed).

Same options and the same decoupled weight decay as fairseq's `adam` (`--adam-betas`, `--adam-eps`,
`--weight-decay`), so recipes switch by changing the optimizer name only.
"""
import ast
from dataclasses import dataclass, field
from typing import List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II

from fairseq_xmlm.errors import XmlmError


@dataclass
class XmlmAdamWConfig(FairseqDataclass):
    adam_betas: str = field(default="(0.9, 0.999)", metadata={"help": "betas for AdamW"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for AdamW"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay"})
    fused: bool = field(default=True, metadata={"help": "one fused CUDA kernel per step when parameters are on GPU"})
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


@register_optimizer("xmlm_adamw", dataclass=XmlmAdamWConfig)
class XmlmAdamW(FairseqOptimizer):
    def __init__(self, cfg, params):
        super().__init__(cfg)
        self._optimizer = build_adamw(params, **self.optimizer_config)

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
