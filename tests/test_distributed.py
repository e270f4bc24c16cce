"""fairseq's own data-parallel training with the plugin: two ranks on the CPU (gloo, fairseq's legacy_ddp, since
torch's DDP wrapper takes GPU device ids only). On GPUs the same code runs over NCCL with `pytorch_ddp`
(`benchmarks/gpu_speed.py --sections multigpu`)."""
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

from conftest import REPO
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_inner_fields(log):
    """The key=value fields of fairseq's simple-format train_inner lines."""
    rows = []
    for line in log.splitlines():
        if "| train_inner |" in line:
            rows.append(dict(field.split("=", 1) for field in line.split(":", 3)[-1].split(", ") if "=" in field))
    return rows


def test_two_ranks_train_one_model_on_half_the_batches_each(fake_english_data, tmp_path):
    init = f"tcp://127.0.0.1:{free_port()}"
    processes = []
    for rank in (0, 1):
        command = [
            str(Path(sys.executable).parent / "fairseq-train"), str(fake_english_data), "--user-dir",
            str(REPO / "fairseq_xmlm"), "--task", "fake_english", "--arch", "xmlm_bert_small", "--criterion",
            "xmlm_masked_lm", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "16", "--max-update", "6",
            "--cpu", "--num-workers", "1", "--distributed-backend", "gloo", "--ddp-backend", "legacy_ddp",
            "--distributed-world-size", "2", "--distributed-rank", str(rank), "--distributed-init-method", init,
            "--distributed-no-spawn", "--save-dir", str(tmp_path / f"rank{rank}"), "--no-epoch-checkpoints",
            "--disable-validation", "--log-format", "simple", "--log-interval", "2", "--seed", "1",
        ]
        with open(tmp_path / f"rank{rank}.log", "w") as out:  # files, not pipes: a full pipe would stall its rank
            processes.append(subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                              env={**os.environ, "PYTHONUNBUFFERED": "1"}))
    for p in processes:
        p.wait(timeout=300)
    logs = [(tmp_path / f"rank{rank}.log").read_text() for rank in (0, 1)]
    for rank, (p, log) in enumerate(zip(processes, logs)):
        assert p.returncode == 0, f"rank {rank}:\n{log[-3000:]}"
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
