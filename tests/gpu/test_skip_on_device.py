"""xmlm_adamw's step skipped on the GPU when the gradient norm is not finite (xmlm-train's update without host
reads): weights, moments and step count stay as they were, and the next finite step trains."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamW, XmlmAdamWConfig

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


def test_nonfinite_norm_skips_the_step_on_the_gpu():
    params = [torch.nn.Parameter(torch.randn(5, 3, device="cuda").bfloat16()) for _ in range(2)]
    optimizer = XmlmAdamW(XmlmAdamWConfig(lr=[1e-2], weight_decay=0.1), params)
    assert optimizer.skips_on_device

    def step(value):
        for p in params:
            p.grad = torch.full_like(p, value)
        norm = optimizer.clip_grad_norm(0.0)
        skipped = optimizer.step_unless_nonfinite(norm)
        optimizer.zero_grad()
        return skipped.item()

    assert step(0.5) == 0.0
    before = [p.detach().clone() for p in params]
    master = optimizer.master.master.detach().clone()
    state = {k: v.clone() for k, v in optimizer.optimizer.state[optimizer.master.master].items()}
    assert step(float("nan")) == 1.0
    assert all(torch.equal(p, b) for p, b in zip(params, before))
    assert torch.equal(optimizer.master.master, master)
    after = optimizer.optimizer.state[optimizer.master.master]
    assert all(torch.equal(after[k], v) for k, v in state.items())  # moments and step count
    assert step(0.5) == 0.0 and not torch.equal(params[0], before[0])


def train_on_the_gpu(entry, data, save_dir, updates=6):
    """fairseq-train or xmlm-train of BERT-small on the GPU with --bf16-params; returns the train_inner rows without
    the timings."""
    command = [str(Path(sys.executable).parent / entry), str(data), "--user-dir", str(REPO / "fairseq_xmlm"), "--task",
               "fake_english", "--arch", "xmlm_bert_small", "--criterion", "xmlm_masked_lm", "--optimizer",
               "xmlm_adamw", "--bf16-params", "--lr", "2e-3", "--clip-norm", "0.5", "--batch-size", "32",
               "--max-update", str(updates), "--save-dir", str(save_dir), "--num-workers", "0", "--log-format",
               "simple", "--log-interval", "1", "--disable-validation", "--seed", "1"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [dict(re.findall(r"(\w+)=([^,\s]+)", line)) for line in result.stdout.splitlines()
            if "| train_inner |" in line]
    return [{k: v for k, v in row.items() if k not in ("wps", "ups", "wall", "train_wall", "gb_free")}
            for row in rows]


def test_xmlm_train_reading_nothing_logs_what_fairseq_train_logs(fake_english_data, tmp_path):
    """On the GPU, xmlm-train's update without host reads (the skip flag copied to pinned memory, read one update
    late) takes the steps fairseq's trainer takes with the same bf16 parameters, and logs the same."""
    stock = train_on_the_gpu("fairseq-train", fake_english_data, tmp_path / "stock")
    ours = train_on_the_gpu("xmlm-train", fake_english_data, tmp_path / "ours")
    assert len(stock) == 6 and ours == stock
    assert (tmp_path / "ours" / "checkpoint_last.pt").is_file()
