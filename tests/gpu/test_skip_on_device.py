"""xmlm_adamw's step skipped on the GPU when the gradient norm is not finite (xmlm-train's update without host
reads): weights, moments and step count stay as they were, and the next finite step trains."""
import pytest
import torch

from conftest import fairseq_train
from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamW, XmlmAdamWConfig
from test_xmlm_train import logged

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


def test_xmlm_train_reading_nothing_logs_what_fairseq_train_logs(fake_english_data, tmp_path):
    """On the GPU, xmlm-train's update without host reads (the skip flag copied to pinned memory, read one update
    late) takes the steps fairseq's trainer takes with the same bf16 parameters, and logs the same."""
    options = ("--task", "fake_english", "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw",
               "--bf16-params", "--clip-norm", "0.5", "--disable-validation")
    stock, ours = (logged(fairseq_train(fake_english_data, tmp_path / entry, *options, updates=6, entry=entry,
                                        cpu=False))
                   for entry in ("fairseq-train", "xmlm-train"))
    assert len(stock) == 6 and ours == stock
    assert (tmp_path / "xmlm-train" / "checkpoint_last.pt").is_file()
