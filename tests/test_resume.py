"""fairseq-train's loop over the plugin's tasks: a run stopped and resumed from checkpoint_last.pt ends with the
weights of the run that was never stopped, and every epoch masks its sentences anew under fairseq's data loader
with worker processes."""
import concurrent.futures
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, TIMEOUT, finished_then_aborted
from fairseq_xmlm.checkpoints import safe_torch_load

TINY = ["--arch", "xmlm_bert_small", "--encoder-layers", "2", "--encoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2"]
TASKS = {  # task -> (its data fixture, its flags)
    "fake_english": ("fake_english_data", ["--task", "fake_english", "--lang-pos"]),
    "bilingual_mlm": ("bible_en_fr_data", ["--task", "bilingual_mlm", "--langs", "en,fr", "--sep-emb",
                                           "--sep-layers", "1-1", "--tokens-per-sample", "64"]),
}
UPDATES = 6


def train(data, task_flags, save_dir, max_update):
    """A tiny fairseq-train run with the plugin, dropout on, a learning-rate schedule over UPDATES updates."""
    command = [str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir", str(REPO / "fairseq_xmlm"),
               *task_flags, *TINY, "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "2e-3",
               "--weight-decay", "0.01", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "2",
               "--total-num-update", str(UPDATES), "--max-update", str(max_update), "--batch-size", "8",
               "--seed", "1", "--cpu", "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints",
               "--save-dir", str(save_dir), "--log-format", "simple", "--log-interval", "1"]
    proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0 or finished_then_aborted(proc.stdout + proc.stderr), proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("task", TASKS)
def test_resumed_run_ends_as_the_uninterrupted_one(task, request, tmp_path):
    fixture, flags = TASKS[task]
    data = request.getfixturevalue(fixture)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        whole, first_half = pool.map(lambda run: train(data, flags, tmp_path / run[0], run[1]),
                                     [("whole", UPDATES), ("stopped", UPDATES // 2)])
    halfway = safe_torch_load(tmp_path / "stopped" / "checkpoint_last.pt")["model"]
    resumed = train(data, flags, tmp_path / "stopped", UPDATES)  # from stopped/checkpoint_last.pt
    assert f"(epoch 1 @ {UPDATES // 2} updates)" in resumed, resumed[-2000:]
    ends = [safe_torch_load(tmp_path / run / "checkpoint_last.pt") for run in ("whole", "stopped")]
    assert [end["optimizer_history"][-1]["num_updates"] for end in ends] == [UPDATES, UPDATES]
    uninterrupted, interrupted = (end["model"] for end in ends)
    assert set(uninterrupted) == set(interrupted)
    differs = [name for name in uninterrupted if not torch.equal(uninterrupted[name], interrupted[name])]
    assert not differs, f"the resumed run ends with other weights: {differs[:5]}"
    assert not all(torch.equal(halfway[name], interrupted[name]) for name in halfway), "the second half did not train"


def mask_positions(batch, pad):
    """{item id: the positions of its targets}."""
    targets = batch["target"]
    return {int(item): tuple(torch.nonzero(row.ne(pad)).flatten().tolist())
            for item, row in zip(batch["id"], targets)}


@pytest.mark.parametrize("task", TASKS)
def test_every_epoch_masks_anew_with_data_loader_workers(task, request):
    """fairseq-train's own calls (fairseq_cli.train): the Trainer's iterator for epoch 1, then for the next epoch,
    with --num-workers 2; the data-loader workers are kept across epochs, the masks must still change."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    fixture, flags = TASKS[task]
    argv = [str(request.getfixturevalue(fixture)), "--user-dir", str(REPO / "fairseq_xmlm"), *flags, *TINY,
            "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "128", "--seed", "1",
            "--cpu", "--num-workers", "2"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task_ = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task_, task_.build_model(cfg.model), task_.build_criterion(cfg.criterion))
    pad = task_.dictionary.pad()
    epoch_itr = trainer.get_train_iterator(epoch=1)
    masks = []
    for epoch in (1, 2):
        iterator = epoch_itr.next_epoch_itr(fix_batches_to_gpus=cfg.distributed_training.fix_batches_to_gpus,
                                            shuffle=epoch_itr.next_epoch_idx > cfg.dataset.curriculum)
        assert epoch_itr.epoch == epoch
        positions = {}
        for batch in iterator:  # a whole epoch: fairseq starts the next one only after it
            positions.update(mask_positions(batch, pad))
        masks.append(positions)
        epoch_itr = trainer.get_train_iterator(epoch_itr.next_epoch_idx, load_dataset=task_.has_sharded_data("train"),
                                               disable_iterator_cache=task_.has_sharded_data("train"))
    both = set(masks[0]) & set(masks[1])  # bilingual_mlm samples its languages: an epoch need not hold every item
    assert len(both) > 1000
    changed = sum(masks[0][item] != masks[1][item] for item in both)
    assert changed > 0.9 * len(both), f"only {changed} of {len(both)} items got other targets in epoch 2"
