"""xmlm-untrained saves the model fairseq-train starts from: its update-0 weights, for the papers' untrained rows."""
import concurrent.futures
import subprocess
import sys
from pathlib import Path

import torch

from conftest import REPO, TIMEOUT
from fairseq_xmlm.checkpoints import load_checkpoint, safe_torch_load

TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2"]


def arguments(data, save_dir, seed):
    # --lr 0: fairseq-train's first update leaves every weight as it was (Adam's step and weight decay scale with
    # the learning rate), so the checkpoint it saves after that update holds the model it started from
    return [str(data), "--user-dir", str(REPO / "fairseq_xmlm"), "--task", "fake_english", "--arch",
            "xmlm_bert_small", *TINY, "--lang-pos", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "0",
            "--weight-decay", "0.01", "--batch-size", "8", "--max-update", "1", "--seed", str(seed), "--cpu",
            "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(save_dir)]


def run(tool, *args):
    proc = subprocess.run([str(Path(sys.executable).parent / tool), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0 or "done training" in proc.stdout, proc.stderr[-3000:]
    return proc


def test_untrained_model_is_the_model_fairseq_train_starts_from(fake_english_data, tmp_path):
    """The same command line, seed 3: xmlm-untrained's model is fairseq-train's before its first update; with seed 4
    it is another (so the comparison can fail)."""
    commands = [("xmlm-untrained", "untrained", 3), ("fairseq-train", "trained", 3), ("xmlm-untrained", "other", 4)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(commands)) as pool:
        runs = list(pool.map(lambda c: run(c[0], *arguments(fake_english_data, tmp_path / c[1], c[2])), commands))
    assert runs[0].stdout.strip() == str(tmp_path / "untrained" / "checkpoint_untrained.pt")
    start = safe_torch_load(tmp_path / "untrained" / "checkpoint_untrained.pt")
    after_one_update = safe_torch_load(tmp_path / "trained" / "checkpoint_last.pt")
    other_seed = safe_torch_load(tmp_path / "other" / "checkpoint_untrained.pt")
    assert start["optimizer_history"][-1]["num_updates"] == 0
    assert after_one_update["optimizer_history"][-1]["num_updates"] == 1
    assert set(start["model"]) == set(after_one_update["model"]) == set(other_seed["model"])
    for name, weights in start["model"].items():
        assert torch.equal(weights, after_one_update["model"][name]), name
    assert not all(torch.equal(weights, other_seed["model"][name]) for name, weights in start["model"].items())
    # what the evaluation tools read: the task with its flags, and a model that loads
    assert start["cfg"]["task"]["_name"] == "fake_english" and start["cfg"]["task"]["lang_pos"]
    model, task, _ = load_checkpoint(tmp_path / "untrained" / "checkpoint_untrained.pt")
    assert task.lang_pos and not model.training
