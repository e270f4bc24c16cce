"""On a GPU: xmlm_adamw's `--fused-master-step` kernel compiled, against torch's fused AdamW over the same flat master
weights; a step skipped on the device; and xmlm-train with it and the encoder compiled as one CUDA graph
(`--compile-scope encoder`) against the plain model."""
import pytest
import torch

from conftest import fairseq_train
from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamW, XmlmAdamWConfig
from test_xmlm_train import logged

pytestmark = pytest.mark.gpu


def updates(fused_master_step, start, grads, clip_norm):
    params = [torch.nn.Parameter(p.clone()) for p in start]
    optimizer = XmlmAdamW(XmlmAdamWConfig(lr=[1e-2], weight_decay=0.1, fused_master_step=fused_master_step), params)
    assert optimizer.skips_on_device
    skipped = []
    for update_grads in grads:
        optimizer.zero_grad()
        for p, g in zip(params, update_grads):
            p.grad = g.clone()
        optimizer.multiply_grads(torch.tensor(0.25, device="cuda"))
        norm = optimizer.clip_grad_norm(clip_norm)
        skipped.append(float(optimizer.step_unless_nonfinite(norm)))
    return params, optimizer, skipped


@pytest.mark.parametrize("clip_norm", [0.0, 1.0])
def test_the_fused_master_step_takes_torchs_steps_and_skips_on_the_device(clip_norm):
    torch.manual_seed(0)
    shapes = [(1000, 77), (3,), (64, 64)]
    start = [torch.randn(shape, device="cuda").bfloat16() for shape in shapes]
    grads = [[torch.randn(shape, device="cuda").bfloat16() for shape in shapes] for _ in range(5)]
    grads[2][1][0] = float("nan")
    expected, unfused, expected_skips = updates(False, start, grads, clip_norm)
    got, fused, skips = updates(True, start, grads, clip_norm)
    assert skips == expected_skips == [0, 0, 1, 0, 0]
    state, expected_state = (o.optimizer.state[o.master.master] for o in (fused, unfused))
    assert float(state["step"]) == float(expected_state["step"]) == 4
    torch.testing.assert_close(fused.master.master, unfused.master.master, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state["exp_avg_sq"], expected_state["exp_avg_sq"], rtol=1e-4, atol=1e-10)
    for p, q in zip(got, expected):  # two roundings of nearly equal fp32 values: one unit apart at most
        torch.testing.assert_close(p.data.float(), q.data.float(), rtol=2 ** -7, atol=1e-5)


def test_xmlm_train_with_the_fused_step_and_one_graph_for_the_encoder_logs_the_plain_losses(fake_english_data,
                                                                                             tmp_path):
    options = ("--task", "fake_english", "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw",
               "--bf16-params", "--clip-norm", "0.5", "--disable-validation", "--dropout", "0",
               "--attention-dropout", "0")
    fast = ("--fused-master-step", "--compile", "--compile-mode", "reduce-overhead", "--compile-scope", "encoder",
            "--fused-dropout-norm")
    plain, ours = (logged(fairseq_train(fake_english_data, tmp_path / name, *options, *extra, updates=6,
                                        entry="xmlm-train", cpu=False))
                   for name, extra in (("plain", ()), ("fast", fast)))
    assert len(plain) == len(ours) == 6
    for a, b in zip(plain, ours):  # bf16: the kernels round in other places than eager PyTorch
        assert float(b["loss"]) == pytest.approx(float(a["loss"]), rel=2e-2)
        assert float(b["gnorm"]) == pytest.approx(float(a["gnorm"]), rel=5e-2)
