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
from fairseq_xmlm.optim.master_step import ALIGN, BLOCK, ParameterBlocks, fused_adamw_step

# sizes around the kernel's block, so that a program's tail is masked; the step reads these gradients gathered into
# the flat gradient, and FITTING ones (multiples of ALIGN) where they lie
SHAPES = [(BLOCK // 64, 33), (7,), (3, 5, 2)]
FITTING = [(BLOCK // 64, 33), (8,), (3, 5, 8), (2 * BLOCK + 5,)]  # the last of any size


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
@pytest.mark.parametrize("shapes", [SHAPES, FITTING], ids=["gathered", "in_place"])
def test_fused_master_step_takes_the_unfused_steps(dtype, clip_norm, shapes):
    start, grads = random_updates(4, shapes=shapes)
    expected_params, expected_norms, expected = run_updates(False, dtype, start, grads, clip_norm)
    got_params, got_norms, got = run_updates(True, dtype, start, grads, clip_norm)
    assert (got.master.gradients is not None) == (shapes is FITTING)  # read where they lie
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


def one_fused_step(grad, blocks, master, skip=None):
    """A fused step of a fresh AdamW on a copy of `master`: (master, exp_avg_sq, bf16 weights) after it."""
    master = master.clone()
    optimizer = torch.optim.AdamW([master], lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.1)
    optimizer.defaults["fused"] = True  # the step count kept as a tensor beside the weights, as the fused one does
    weights = torch.empty_like(master, dtype=torch.bfloat16)
    fused_adamw_step(optimizer, master, grad, weights, 0.5, torch.tensor(0.25, device=master.device), skip, blocks)
    return master, optimizer.state[master]["exp_avg_sq"], weights


def test_the_step_reads_each_gradient_where_it_lies_as_it_reads_the_flat_gradient():
    generator = torch.Generator().manual_seed(3)
    shapes = [(BLOCK,)] + FITTING  # whole blocks, and a parameter of three blocks, the last one masked
    grads = [torch.randn(shape, generator=generator).bfloat16() for shape in shapes]
    master = torch.randn(sum(g.numel() for g in grads), generator=generator)
    flat = one_fused_step(torch.cat([g.reshape(-1) for g in grads]), None, master)
    blocks = ParameterBlocks([g.numel() for g in grads], master.device)
    assert blocks.programs == sum(-(-g.numel() // BLOCK) for g in grads)  # no block spans two parameters
    in_place = one_fused_step(grads, blocks, master)
    for got, expected in zip(in_place, flat):
        assert torch.equal(got, expected)
    assert not torch.equal(flat[0], master)  # the step moved every element


def test_the_table_of_gradient_addresses_is_made_once_per_set_of_addresses():
    grads = [torch.zeros(5), torch.zeros(7)]
    blocks = ParameterBlocks([5, 7], grads[0].device)
    table = blocks.address_table(grads)
    assert table.tolist() == [g.data_ptr() for g in grads]
    assert blocks.address_table(grads) is table
    moved = [grads[0], torch.zeros(7)]
    assert blocks.address_table(moved).tolist() == [g.data_ptr() for g in moved]


def test_only_sizes_and_addresses_on_16_bytes_are_read_in_place():
    assert ParameterBlocks.fits([ALIGN, 3 * ALIGN + 1]) and not ParameterBlocks.fits([ALIGN + 1, ALIGN])
    flat = torch.zeros(3 * ALIGN)
    assert ParameterBlocks.aligned([flat[:ALIGN], flat[ALIGN:]]) and not ParameterBlocks.aligned([flat[1:]])
    start, grads = random_updates(1, shapes=FITTING)
    params = [torch.nn.Parameter(p.clone().bfloat16()) for p in start]
    optimizer = adamw(True, params)
    for p, g in zip(params, grads[0]):
        p.grad = torch.cat([torch.zeros(1), g.reshape(-1)]).bfloat16()[1:].view_as(p)  # 2 bytes past a block
    optimizer.clip_grad_norm(0.0)
    assert optimizer.master.gradients is None  # gathered flat


def test_missing_and_strided_gradients_step_as_zeros_and_as_their_values():
    start, grads = random_updates(2, shapes=FITTING)
    grads[1][0] = grads[1][0].t().contiguous().t()  # the same values, not contiguous
    expected, _, _ = run_updates(False, torch.bfloat16, start, grads, 0.0)
    got, _, _ = run_updates(True, torch.bfloat16, start, grads, 0.0)
    for p, q in zip(got, expected):
        torch.testing.assert_close(p.data, q.data, rtol=2 ** -7, atol=0)
    params = [torch.nn.Parameter(p.clone().bfloat16()) for p in start]
    optimizer = adamw(True, params)
    params[0].grad = grads[0][0].bfloat16()  # the other parameters get none
    optimizer.clip_grad_norm(0.0)
    assert optimizer.master.gradients is not None
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
