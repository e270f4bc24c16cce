"""xmlm_adamw's `--fused-master-step` (`optim/master_step.py`), its kernel run by Triton's interpreter on the CPU
(conftest sets TRITON_INTERPRET=1), against the unfused path: torch's AdamW over the flat fp32 master weights."""
import math
import sys
from pathlib import Path

import pytest
import torch
from fairseq.optim import build_optimizer
from omegaconf import OmegaConf

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.optim.master_step import BLOCK

# sizes around the kernel's block, so that a program's tail is masked; WITH_WHOLE_BLOCKS: whole blocks (read
# unmasked) too
SHAPES = [(BLOCK // 64, 33), (7,), (3, 5, 2)]
WITH_WHOLE_BLOCKS = [(BLOCK // 64, 33), (8,), (3, 5, 8), (2 * BLOCK + 5,)]  # the last of any size


def adamw(fused_master_step, params):
    cfg = OmegaConf.create({"_name": "xmlm_adamw", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-6,
                            "weight_decay": 0.01, "lr": [2e-3], "fused": True,
                            "fused_master_step": fused_master_step})
    return build_optimizer(cfg, params)


def run_updates(fused_master_step, dtype, start, grads, clip_norm, skipped=()):
    """xmlm-train's order of calls, one update a list of gradients: multiply by 1 / sample size (here a GPU-style
    tensor on odd updates), clip, step (the fused step skipped on the device for updates in `skipped`)."""
    params = [torch.nn.Parameter(p.clone().to(dtype)) for p in start]
    optimizer = adamw(fused_master_step, params)
    norms = []
    for update, update_grads in enumerate(grads):
        optimizer.zero_grad()
        for p, g in zip(params, update_grads):
            p.grad = g.to(dtype)
        optimizer.multiply_grads(torch.tensor(0.5) if update % 2 else 0.5)
        norm = optimizer.clip_grad_norm(clip_norm)
        norms.append(float(norm))
        if fused_master_step:
            optimizer.step_unless_nonfinite(torch.tensor(math.inf) if update in skipped else norm)
        else:  # torch's unfused AdamW (on the CPU) takes no found_inf flag
            optimizer.step()
    return params, norms, optimizer


def random_updates(count, scale=1.0, seed=0, shapes=SHAPES):
    generator = torch.Generator().manual_seed(seed)
    start = [torch.randn(shape, generator=generator) for shape in shapes]
    grads = [[scale * torch.randn(shape, generator=generator) for shape in shapes] for _ in range(count)]
    return start, grads


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("clip_norm", [0.0, 0.5])
@pytest.mark.parametrize("shapes", [SHAPES, WITH_WHOLE_BLOCKS], ids=["around_blocks", "multiples_of_8"])
def test_fused_master_step_takes_the_unfused_steps(dtype, clip_norm, shapes):
    start, grads = random_updates(4, shapes=shapes)
    expected_params, expected_norms, expected = run_updates(False, dtype, start, grads, clip_norm)
    got_params, got_norms, got = run_updates(True, dtype, start, grads, clip_norm)
    assert got_norms == pytest.approx(expected_norms, rel=1e-5)
    if clip_norm:
        assert max(got_norms) > clip_norm  # the clipping factor was applied, not only computed
    expected_state, got_state = (o.optimizer.state[o.master.master] for o in (expected, got))
    for key in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(got_state[key], expected_state[key], rtol=1e-5, atol=1e-7)
    assert float(got_state["step"]) == float(expected_state["step"]) == 4
    torch.testing.assert_close(got.master.master, expected.master.master, rtol=1e-6, atol=1e-7)
    for p, q in zip(got_params, expected_params):
        assert p.dtype == dtype
        # one rounding of nearly the same fp32 value (toward zero in the interpreter, to nearest in torch and on a
        # GPU): at most one unit in the last place apart
        torch.testing.assert_close(p.data, q.data, rtol=2 ** -7, atol=0)


def test_the_parameters_are_views_of_the_weights_the_kernel_writes():
    start, grads = random_updates(1)
    params, _, optimizer = run_updates(True, torch.bfloat16, start, grads, 0.0)
    flat = optimizer.master.low_precision_weights
    assert optimizer.master.master.grad is None  # no fp32 gradient is kept
    offsets = [p.data_ptr() - flat.data_ptr() for p in params]
    assert offsets == [0, *torch.tensor([p.numel() * 2 for p in params[:-1]]).cumsum(0).tolist()]
    written = torch.cat([p.detach().reshape(-1) for p in params])
    assert not torch.equal(written, torch.cat([p.reshape(-1) for p in start]).bfloat16())  # the step moved them
    # the master rounded (the interpreter rounds toward zero where a GPU rounds to nearest: one unit apart at most)
    torch.testing.assert_close(written.float(), optimizer.master.master, rtol=2 ** -7, atol=0)


def test_a_step_skipped_on_the_device_changes_nothing_and_the_next_one_counts_on():
    start, grads = random_updates(3)
    without_skip, _, expected = run_updates(True, torch.bfloat16, start, grads[:1] + grads[2:], 0.0)
    skipping, _, got = run_updates(True, torch.bfloat16, start, grads, 0.0, skipped={1})
    state = got.optimizer.state[got.master.master]
    assert float(state["step"]) == 2
    for p, q in zip(skipping, without_skip):
        assert torch.equal(p.data, q.data)
    assert torch.equal(state["exp_avg_sq"], expected.optimizer.state[expected.master.master]["exp_avg_sq"])


def test_checkpoints_pass_between_the_fused_and_the_unfused_step():
    start, grads = random_updates(4, seed=1)
    expected_params, _, _ = run_updates(False, torch.bfloat16, start, grads, 0.0)
    params, _, fused = run_updates(True, torch.bfloat16, start, grads[:2], 0.0)
    state = fused.state_dict()
    resumed = [torch.nn.Parameter(p.data.clone()) for p in params]
    unfused = adamw(False, resumed)
    unfused.load_state_dict(state)
    unfused.master.master.copy_(fused.master.master)  # what fairseq's checkpoint of the fp32 copy restores
    for update_grads in grads[2:]:
        unfused.zero_grad()
        for p, g in zip(resumed, update_grads):
            p.grad = g.bfloat16()
        unfused.multiply_grads(0.5)
        unfused.clip_grad_norm(0.0)
        unfused.step()
    for p, q in zip(resumed, expected_params):
        torch.testing.assert_close(p.data, q.data, rtol=2 ** -7, atol=0)


def test_fused_master_step_needs_low_precision_parameters():
    with pytest.raises(XmlmError, match="--fused-master-step needs low-precision parameters"):
        adamw(True, [torch.nn.Parameter(torch.zeros(3))])


def test_missing_and_strided_gradients_step_as_zeros_and_as_their_values():
    start, grads = random_updates(2, shapes=WITH_WHOLE_BLOCKS)
    grads[1][0] = grads[1][0].t().contiguous().t()  # the same values, not contiguous
    expected, _, _ = run_updates(False, torch.bfloat16, start, grads, 0.0)
    got, _, _ = run_updates(True, torch.bfloat16, start, grads, 0.0)
    for p, q in zip(got, expected):
        torch.testing.assert_close(p.data, q.data, rtol=2 ** -7, atol=0)
    params = [torch.nn.Parameter(p.clone().bfloat16()) for p in start]
    optimizer = adamw(True, params)
    params[0].grad = grads[0][0].bfloat16()  # the other parameters get none
    optimizer.clip_grad_norm(0.0)
    optimizer.step_unless_nonfinite(torch.tensor(1.0))
    moments = optimizer.optimizer.state[optimizer.master.master]["exp_avg"]
    assert moments[params[0].numel():].count_nonzero() == 0 and moments[:params[0].numel()].count_nonzero() > 0


def test_the_step_benchmark_times_the_parameters_of_the_model():
    """benchmarks/master_step_speed.py's parameters are the Default row's, shapes in the model's order."""
    import test_model
    benchmarks = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import master_step_speed
    shapes = master_step_speed.parameter_shapes(layers=test_model.LAYERS, dim=test_model.D, ffn=test_model.FFN,
                                                tokens=test_model.T, vocab=test_model.V)
    assert shapes == [tuple(p.shape) for p in test_model.make_model().parameters()]
