"""fairseq's own data-parallel training with the plugin: two ranks on the CPU (gloo, fairseq's legacy_ddp, since
torch's DDP wrapper takes GPU device ids only). On GPUs the same code runs over NCCL with `pytorch_ddp`
(`benchmarks/ddp_scaling.py`)."""
import math
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fairseq.distributed import LegacyDistributedDataParallel, ModuleProxyWrapper
from fairseq.optim import MemoryEfficientFP16Optimizer
from omegaconf import OmegaConf

from conftest import REPO
from fairseq_xmlm.optim.xmlm_adamw import start_gradient_all_reduce
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_inner_fields(log):
    """The key=value fields of fairseq's simple-format train_inner lines."""
    return [dict(re.findall(r"(\w+)=([^,\s]+)", line)) for line in log.splitlines() if "| train_inner |" in line]


def train_two_ranks(data, save_dir, *options, updates=6, entry="fairseq-train", validate=False):
    """fairseq-train (or `entry`, e.g. xmlm-train) as two CPU ranks over gloo with legacy_ddp; returns both ranks'
    logs. validate: on 3 dev batches every 3 updates."""
    init = f"tcp://127.0.0.1:{free_port()}"
    save_dir.mkdir(parents=True, exist_ok=True)
    processes = []
    for rank in (0, 1):
        command = [
            str(Path(sys.executable).parent / entry), str(data), "--user-dir",
            str(REPO / "fairseq_xmlm"), "--task", "fake_english", "--arch", "xmlm_bert_small", "--criterion",
            "xmlm_masked_lm", "--lr", "1e-3", "--batch-size", "16", "--max-update", str(updates),
            "--cpu", "--num-workers", "1", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
            "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-init-method", init,
            "--distributed-no-spawn", "--save-dir", str(save_dir / f"rank{rank}"), "--no-epoch-checkpoints",
            *(["--validate-interval-updates", "3", "--max-valid-steps", "3"] if validate else ["--disable-validation"]),
            "--log-format", "simple", "--log-interval", "1", "--seed", "1", *options,
        ]
        with open(save_dir / f"rank{rank}.log", "w") as out:  # files, not pipes: a full pipe would stall its rank
            processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                              env={**os.environ, "PYTHONUNBUFFERED": "1"}))
    for p in processes:
        p.wait(timeout=300)
    logs = [(save_dir / f"rank{rank}.log").read_text() for rank in (0, 1)]
    for rank, (p, log) in enumerate(zip(processes, logs)):
        assert p.returncode == 0, f"rank {rank}:\n{log[-3000:]}"
    return logs


def test_two_ranks_train_one_model_on_half_the_batches_each(fake_english_data, tmp_path):
    logs = train_two_ranks(fake_english_data, tmp_path, "--optimizer", "adam")
    rows = train_inner_fields(logs[0])
    assert rows and all(row["bsz"] == "32" for row in rows)  # statistics summed over both ranks' 16 sentences
    # each rank reads its own shard: half of the epoch's batches ("epoch 001:      2 / 273 loss=...")
    task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=str(fake_english_data)))
    task.load_dataset("train")
    batches = math.ceil(len(task.dataset("train")) / 16)
    first = next(line for line in logs[0].splitlines() if "| train_inner |" in line)
    assert int(first.split(" / ")[1].split()[0]) == math.ceil(batches / 2)
    # only the master saves the one model both ranks trained
    assert (tmp_path / "rank0" / "checkpoint_last.pt").exists()
    assert not (tmp_path / "rank1" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("update_freq", ["1", "2"])
def test_flat_master_weights_average_the_gradients_in_one_all_reduce_as_legacy_ddp_does(fake_english_data,
                                                                                           tmp_path, update_freq):
    """xmlm_adamw's flat fp16 gradient, all-reduced in one piece, trains as legacy_ddp's parameter-by-parameter
    buckets do (under --fp16, xmlm_adamw leaves the reduction to the wrapper): the same losses, update for update.
    Without the all-reduce each rank would follow its own gradients and rank 0's losses would differ. With
    --update-freq 2 the reduction our task starts after each backward must wait for the update's last batch."""
    losses = []
    for name, precision in (("fp16", ["--fp16-no-flatten-grads"]), ("flat", ["--memory-efficient-fp16"])):
        log = train_two_ranks(fake_english_data, tmp_path / name, "--optimizer", "xmlm_adamw", "--fp16",
                              "--update-freq", update_freq, *precision)[0]
        losses.append([row["loss"] for row in train_inner_fields(log)])
    assert len(losses[0]) == 6 and losses[1] == losses[0]


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()


def fp16_cfg(optimizer):
    return OmegaConf.create({
        "optimizer": {"_name": optimizer, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-6, "weight_decay": 0.0,
                      "lr": [1e-3], **({"fused": True} if optimizer == "xmlm_adamw" else {})},
        "common": {"fp16_init_scale": 4, "fp16_scale_window": None, "fp16_scale_tolerance": 0.0,
                   "threshold_loss_scale": None, "min_loss_scale": 1e-4, "bf16": False, "model_parallel_size": 1,
                   "tpu": False},
        "optimization": {"update_freq": [1]},
        "distributed_training": {"distributed_world_size": 1},
    })


def legacy_ddp_after_backward(group, optimizer_name):
    """A small fp16 model under fairseq's legacy_ddp wrapper, its optimizer, and a loss to call backward on."""
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3).half()
    model = ModuleProxyWrapper(LegacyDistributedDataParallel(module, process_group=group))
    optimizer = MemoryEfficientFP16Optimizer.build_optimizer(fp16_cfg(optimizer_name), list(module.parameters()))
    loss = model(torch.randn(2, 4).half()).float().sum()
    return model, optimizer, loss


def test_our_tasks_start_the_flat_gradient_all_reduce_right_after_backward_but_not_inside_no_sync(one_rank_group):
    model, optimizer, loss = legacy_ddp_after_backward(one_rank_group, "xmlm_adamw")
    with model.module.no_sync():  # a batch of --update-freq before the update's last
        optimizer.backward(loss)
        start_gradient_all_reduce(optimizer, model)
    master = optimizer.wrapped_optimizer.master
    assert not master.gathered
    start_gradient_all_reduce(optimizer, model)  # the update's last batch: reduced (over one rank) into master.grad
    expected = torch.cat([p.grad.reshape(-1).float() for p in model.module.module.parameters()])
    assert master.gathered and torch.equal(master.master.grad, expected)


def test_other_optimizers_leave_the_reduction_to_the_trainer(one_rank_group):
    """fairseq's legacy wrapper reduces each time it is asked: a second reduction would sum the sums."""
    model, optimizer, loss = legacy_ddp_after_backward(one_rank_group, "adam")
    optimizer.backward(loss)
    start_gradient_all_reduce(optimizer, model)
    assert model.module.buffer is None  # allocated by the wrapper's first reduction
