"""xmlm_adamw's step skipped on the GPU when the gradient norm is not finite (xmlm-train's update without host
reads): weights, moments and step count stay as they were, and the next finite step trains."""
import pytest
import torch

from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamW, XmlmAdamWConfig

pytestmark = pytest.mark.gpu


def test_nonfinite_norm_skips_the_step_on_the_gpu():
    params = [torch.nn.Parameter(torch.randn(5, 3, device="cuda").bfloat16()) for _ in range(2)]
    optimizer = XmlmAdamW(XmlmAdamWConfig(lr=[1e-2], weight_decay=0.1), params)
    assert optimizer.skips_on_device

    def step(value):
        for p in params:
            p.grad = torch.full_like(p, value)
        norm = optimizer.clip_grad_norm(0.0)
        skipped = optimizer.step_unless_nonfinite(norm)
        optimizer.zero_grad()
        return skipped.item()

    assert step(0.5) == 0.0
    before = [p.detach().clone() for p in params]
    master = optimizer.master.master.detach().clone()
    state = {k: v.clone() for k, v in optimizer.optimizer.state[optimizer.master.master].items()}
    assert step(float("nan")) == 1.0
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert torch.equal(optimizer.master.master, master)
    after = optimizer.optimizer.state[optimizer.master.master]
    assert all(torch.equal(after[k], v) for k, v in state.items())  # moments and step count
    assert step(0.5) == 0.0 and not torch.equal(params[0], before[0])
