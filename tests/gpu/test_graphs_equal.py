"""CUDA graphs change nothing of a packed group's training: the same updates replayed as graphs and run as they
are, from the same seed, give the same losses and weights."""
import pytest
import torch

from fairseq_xmlm.packed.group import PackedGroup
from fairseq_xmlm.packed.runs import epoch_batches

pytestmark = pytest.mark.gpu

# batch shapes repeat, so that the graph group replays graphs as well as capturing them
ORDER = [0, 1, 2, 0, 1, 2, 3]
NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0")


def train(runs, schedules, precision, compile, cuda_graphs):
    """The ORDER updates of a fresh group -> (losses of each update (steps, N) on the host, final master weights,
    graphs captured)."""
    group = PackedGroup(runs, torch.device("cuda"), precision, compile, cuda_graphs)
    losses = []
    for at in ORDER:
        step_losses, counts, _ = group.step([schedule[at] for schedule in schedules])
        losses.append((step_losses / counts).cpu())  # a graph's outputs are its own until the next update
    return torch.stack(losses), group.stacked.flat.cpu(), len(group.graphs or {})


@pytest.mark.parametrize("precision, compile, extra, loss_tolerance, weight_tolerance", [
    ("fp32", False, NO_DROPOUT, 1e-5, 1e-5),
    ("fp32", False, (), 1e-5, 1e-5),
    ("bf16", True, (), 2e-3, 1e-3),  # as --gpu-pack trains
], ids=["fp32-no-dropout", "fp32", "bf16-compiled"])
def test_updates_replayed_as_graphs_equal_updates_run_as_they_are(recipe_runs, precision, compile, extra,
                                                                  loss_tolerance, weight_tolerance):
    runs = recipe_runs(["0", "1"], "runs", extra=extra)
    schedules = [epoch_batches(run, 1) for run in runs]
    plain_losses, plain_weights, _ = train(runs, schedules, precision, compile, False)
    graph_losses, graph_weights, graphs = train(runs, schedules, precision, compile, True)
    assert 1 <= graphs <= len(set(ORDER)) < len(ORDER)  # a graph per batch shape: the repeated batches replayed
    assert float(((graph_losses - plain_losses).abs() / plain_losses.abs()).max()) <= loss_tolerance
    assert float((graph_weights - plain_weights).abs().max()) <= weight_tolerance
