"""The stacked model gives each run's own logits on the GPU, where its attention runs the Triton kernels with
several short sentences to a row (`packed.stacked.attention_code`); tests/test_packed_training.py checks the same
on the CPU's attention."""
import pytest
import torch

from fairseq_xmlm.packed.group import GroupData
from fairseq_xmlm.packed.runs import epoch_batches
from fairseq_xmlm.packed.stacked import StackedEncoder, sentences_per_row

pytestmark = pytest.mark.gpu


def test_stacked_logits_equal_each_models_own_on_every_batch_of_an_epoch(recipe_runs, monkeypatch):
    """IDs 0 and 1 (shared positions and lang-pos), fp32, evaluation mode, every batch of epoch 1: the stacked logits
    at the batch's target positions against each model's forward pass (one sentence to a row), for batches whose
    sentences share rows and for those whose do not."""
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)  # fp32 products on both sides
    device = torch.device("cuda")
    runs = recipe_runs(["0", "1"], "runs")
    models = [run.model.to(device).eval() for run in runs]
    stacked = StackedEncoder(models, device)
    data = GroupData(runs, device)
    schedules = [epoch_batches(run, 1) for run in runs]
    generator = torch.Generator(device=device).manual_seed(0)
    largest = {}  # sentences to a row -> largest difference
    with torch.no_grad():
        for at in range(len(schedules[0])):
            inputs, langs, positions, _, _ = data.batch([schedule[at] for schedule in schedules], generator)
            share = sentences_per_row(inputs.size(0) * inputs.size(1), inputs.size(2))
            logits = stacked.masked_logits(inputs, langs, positions)
            for slot, model in enumerate(models):
                features = model(inputs[slot], langs[slot], features_only=True)[0].flatten(0, 1)
                expected = model.output_logits(features[positions[slot]], langs[slot].new_zeros(positions.size(1)))
                difference = float((logits[slot] - expected).abs().max())
                largest[share] = max(largest.get(share, 0.0), difference)
    assert 1 in largest and len(largest) > 1, largest  # rows of one sentence, and rows shared
    assert max(largest.values()) <= 1e-4, largest
