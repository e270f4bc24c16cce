"""A packed group trains the same beside another group in lockstep (`packed.loop.train_groups`, each group on a
CUDA stream of its own, capturing its CUDA graphs there) as alone."""
import pytest
import torch

from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.experiments.dufter.figures import read_fairseq_log
from fairseq_xmlm.packed.loop import train_group, train_groups

pytestmark = pytest.mark.gpu

GROUPS = (["0", "1"], ["15"])  # two BERT-small runs, one BERT-base run
UPDATES = 75  # beyond the 69 updates of an epoch of Dufter's training set, so that every CUDA graph is replayed


def largest_difference(first, second):
    return max(float((a.float() - b.float()).abs().max()) for a, b in zip(first.values(), second.values()))


@pytest.mark.parametrize("precision, compile", [("fp32", False), ("bf16", True)], ids=["fp32", "bf16-compiled"])
def test_groups_in_lockstep_train_as_alone(recipe_runs, tmp_path, precision, compile):
    """Every group trains alone (twice: bf16 kernels with atomic adds drift between two runs alone), then all
    together in lockstep, from the same commands in fresh folders, with the recipe's dropout and CUDA graphs. Both
    the dropout and the masking draws are the group's own, so in fp32 the weights are the same bit for bit; in bf16
    a run's weights differ from alone by at most twice its drift between its two runs alone. The weights are finite,
    and in fp32 the train losses are the same."""
    device = torch.device("cuda")

    def chunks(folder):
        return [recipe_runs(ids, folder, UPDATES) for ids in GROUPS]

    for folder in ("alone",) if precision == "fp32" else ("alone", "again"):
        for chunk in chunks(folder):
            train_group(chunk, device, precision, compile=compile, cuda_graphs=True)
    assert train_groups(chunks("lockstep"), device, precision, compile=compile, cuda_graphs=True) is not None

    def weights(folder, run_id):
        return load_checkpoint(tmp_path / folder / run_id / "checkpoints" / "checkpoint_last.pt")[0].state_dict()

    def losses(folder, run_id):
        return [record["train_loss"] for record in read_fairseq_log(tmp_path / folder / run_id / "train.log", "train")]

    for run_id in (run_id for ids in GROUPS for run_id in ids):
        alone, lockstep = weights("alone", run_id), weights("lockstep", run_id)
        assert all(bool(torch.isfinite(w).all()) for state in (alone, lockstep) for w in state.values()), run_id
        drift = 0.0 if precision == "fp32" else largest_difference(alone, weights("again", run_id))
        assert largest_difference(alone, lockstep) <= 2 * drift, (run_id, drift)
        if precision == "fp32":
            assert losses("alone", run_id) == losses("lockstep", run_id), run_id
        else:
            assert len(losses("alone", run_id)) == len(losses("lockstep", run_id)) > 0, run_id
