"""benchmarks/dufter_sweep_flops.py: its FLOPs per sequence agree with the per-token count the MFU figures use, and
length-sorted and random mixed batches pad each sentence to its batch's longest."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import _common  # noqa: E402
import dufter_sweep_flops  # noqa: E402


def test_sequence_flops_is_the_per_token_count_times_the_positions():
    for model in (_common.BERT_SMALL, _common.BERT_BASE):
        for positions in (7, 40, 128):
            expected = positions * _common.train_flops_per_token(**{**model, "tokens": positions},
                                                                 vocab=_common.FAKE_VOCAB)
            assert float(dufter_sweep_flops.sequence_flops([positions], **model)[0]) == pytest.approx(expected)


def test_length_sorted_batches_pad_to_their_longest():
    ordered, padded = dufter_sweep_flops.epoch_positions([3, 1, 2, 5, 4], batch_size=2)
    assert ordered.tolist() == [1, 2, 3, 4, 5] and padded.tolist() == [2, 2, 4, 4, 5]


def test_halving_the_batch_adds_updates_not_flops_and_200_epochs_double_them():
    lengths = np.random.default_rng(0).integers(10, 60, size=4000)
    flops = {name: dufter_sweep_flops.sweep_flops(lengths, name, seeds=1)
             for name in ("batch128", "2026-11-28", "epochs200")}
    assert flops["batch128"]["useful"] == flops["2026-11-28"]["useful"]
    # smaller batches of sorted lengths pad less, a few percent here
    assert flops["batch128"]["padded"] <= flops["2026-11-28"]["padded"] <= 1.05 * flops["batch128"]["padded"]
    assert flops["epochs200"]["useful"] == pytest.approx(2 * flops["2026-11-28"]["useful"])
    assert 0.9 < flops["batch128"]["bert_base"] / flops["batch128"]["padded"] < 1


def test_random_mixed_batches_pad_each_sequence_to_its_batchs_longest_and_more_than_sorted_batches():
    lengths = np.random.default_rng(1).integers(5, 120, size=1000)
    shuffled, padded = dufter_sweep_flops.random_epoch_positions(lengths, 128, np.random.default_rng(0))
    assert sorted(shuffled.tolist()) == sorted(lengths.tolist())
    for start in range(0, 1000, 128):
        assert (padded[start:start + 128] == shuffled[start:start + 128].max()).all()
    assert padded.sum() > dufter_sweep_flops.epoch_positions(lengths, 128)[1].sum()
    # the default attends to the padding of random mixed batches: the same useful work, more executed
    flops = {name: dufter_sweep_flops.sweep_flops(lengths, name, seeds=1)
             for name in ("paper-code", "paper-code-padding-specials")}
    assert flops["paper-code"]["useful"] == flops["paper-code-padding-specials"]["useful"]
    assert flops["paper-code-padding-specials"]["padded"] > 1.2 * flops["paper-code"]["padded"]


def test_overparam_micro_batches_pad_only_the_bert_base_runs_less():
    """paper-code-micro-batches pads the overparam runs to each micro-batch of 16's longest sentence, the others as
    paper-code-padding-specials does."""
    lengths = (5 + np.random.default_rng(2).lognormal(3, 0.5, size=2000)).astype(int)  # a long tail, as sentences
    flops = {name: dufter_sweep_flops.sweep_flops(lengths, name, seeds=1)
             for name in ("paper-code-padding-specials", "paper-code-micro-batches")}
    whole, micro = flops["paper-code-padding-specials"], flops["paper-code-micro-batches"]
    assert micro["useful"] == whole["useful"]
    assert micro["bert_base"] < 0.8 * whole["bert_base"]
    assert micro["padded"] - micro["bert_base"] == pytest.approx(whole["padded"] - whole["bert_base"])
