"""Safe checkpoint loading: real fairseq checkpoints load with weights_only=True, malicious ones never run."""
import argparse
import datetime
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from omegaconf import DictConfig, OmegaConf

from conftest import TIMEOUT, finished_then_aborted
from fairseq_xmlm.checkpoints import TRUST_ENV, load_checkpoint, trusted_checkpoints
from fairseq_xmlm.errors import XmlmError

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
TINY_ROBERTA = ["--task", "masked_lm", "--arch", "roberta_base", "--criterion", "masked_lm",
                "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                "--encoder-attention-heads", "2", "--tokens-per-sample", "32", "--batch-size", "8",
                "--optimizer", "adam", "--lr", "1e-4", "--cpu", "--num-workers", "0", "--disable-validation",
                "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1"]


def run_tool(tool, *args, env=None, check=True):
    """Run a venv console script from the repo root (so `--user-dir fairseq_xmlm` is relative); output in .stdout."""
    proc = subprocess.run([str(VENV_BIN / tool), *map(str, args)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)
    if check and proc.returncode != 0 and not finished_then_aborted(proc.stdout):
        raise AssertionError(f"{tool} failed:\n{proc.stdout[-3000:]}")
    return proc


def train_tiny_roberta(data, save_dir, max_update, *extra, check=True):
    """fairseq-train a stock tiny RoBERTa with our plugin loaded the documented way (--user-dir fairseq_xmlm)."""
    return run_tool("fairseq-train", data, *TINY_ROBERTA, "--save-dir", save_dir, "--max-update", max_update,
                    "--user-dir", "fairseq_xmlm", *extra, check=check)


def build_tiny_roberta(tmp_path_factory):
    """Once per session: a synthetic corpus, binarized by fairseq-preprocess, and a 2-update roberta checkpoint."""
    root = tmp_path_factory.getbasetemp() / "tiny_roberta"
    checkpoint = root / "ckpt" / "checkpoint_last.pt"
    if checkpoint.exists():
        return root
    root.mkdir()
    rng = random.Random(0)
    words = [f"w{i}" for i in range(60)]
    for split, lines in (("train", 400), ("valid", 40)):
        text = "".join(" ".join(rng.choices(words, k=rng.randint(5, 15))) + "\n" for _ in range(lines))
        (root / f"{split}.txt").write_text(text)
    run_tool("fairseq-preprocess", "--only-source", "--trainpref", root / "train.txt", "--validpref",
             root / "valid.txt", "--destdir", root / "bin", "--workers", "1")
    train_tiny_roberta(root / "bin", root / "ckpt", 2)
    assert checkpoint.exists()
    return root


@pytest.fixture(scope="session")
def tiny_roberta(tmp_path_factory):
    return build_tiny_roberta(tmp_path_factory)


class ShellCommand:
    """Unpickling this runs a shell command: what a malicious checkpoint smuggles in."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture
def malicious_checkpoint(tiny_roberta, tmp_path):
    """A real checkpoint with one extra key whose unpickling would create `marker`."""
    marker = tmp_path / "payload-ran"
    state = torch.load(tiny_roberta / "ckpt" / "checkpoint_last.pt", weights_only=True)
    state["extra_state"]["note"] = ShellCommand(f"touch {marker}")
    path = tmp_path / "checkpoint_last.pt"
    torch.save(state, path)
    return path, marker


def test_stock_torch_load_needs_the_allowlist(tiny_roberta):
    # Control: without fairseq_xmlm, torch's default weights_only=True refuses fairseq's own checkpoint.
    code = "import sys, torch; torch.load(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, tiny_roberta / "ckpt" / "checkpoint_last.pt"],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode != 0 and "argparse.Namespace" in proc.stderr


def test_fairseq_checkpoint_loads_with_weights_only(tiny_roberta):
    path = tiny_roberta / "ckpt" / "checkpoint_last.pt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(path)])
    assert type(models[0]).__name__ == "RobertaModel" and cfg.model.encoder_layers == 2

    model, task, cfg = load_checkpoint(path)
    assert not model.training and len(task.dictionary) == 65  # 60 words, 4 specials, <mask>
    weights = torch.load(path, weights_only=True)["model"]
    for name, param in model.state_dict().items():
        assert torch.equal(param, weights[name]), name


def test_partially_shared_roberta_checkpoint_loads(tiny_roberta, tmp_path):
    # Our own model and task: the corpus in the fake_english layout (dict.txt, {split}.en.{bin,idx}).
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(tiny_roberta / "bin" / "dict.txt", data)
    for split in ("train", "valid"):
        for ext in ("bin", "idx"):
            shutil.copy(tiny_roberta / "bin" / f"{split}.{ext}", data / f"{split}.en.{ext}")
    run_tool("fairseq-train", data, "--user-dir", "fairseq_xmlm", "--task", "fake_english", "--arch",
             "xmlm_bert_small", "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "2", "--tokens-per-sample", "32", "--criterion", "masked_lm",
             "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-4", "--max-update", "2", "--cpu",
             "--num-workers", "0", "--disable-validation", "--no-epoch-checkpoints", "--save-dir", tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "checkpoint_last.pt"
    assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == []
    model, task, cfg = load_checkpoint(path)
    assert type(model).__name__ == "PartiallySharedRoberta" and not model.training
    assert len(task.dictionary) == 2 * 65 and cfg.model.encoder_layers == 2


def test_pickled_dictconfig_checkpoint_loads(tiny_roberta, tmp_path):
    # fairseq 0.10-era checkpoints pickled the hydra config itself (DictConfig holding an argparse Namespace).
    state = torch.load(tiny_roberta / "ckpt" / "checkpoint_last.pt", weights_only=True)
    state["cfg"] = OmegaConf.create(state["cfg"], flags={"allow_objects": True})
    assert isinstance(state["cfg"].model, argparse.Namespace)
    path = tmp_path / "dictconfig.pt"
    torch.save(state, path)
    model, task, cfg = load_checkpoint(path)
    assert isinstance(cfg, DictConfig) and cfg.model.encoder_embed_dim == 32
    assert model.encoder.sentence_encoder.layers[0].fc1.out_features == 64


def test_training_resumes_from_checkpoint_last(tiny_roberta, tmp_path):
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(tiny_roberta / "ckpt" / "checkpoint_last.pt", save_dir)
    proc = train_tiny_roberta(tiny_roberta / "bin", save_dir, 4)
    assert "Loaded checkpoint" in proc.stdout and "(epoch 1 @ 2 updates)" in proc.stdout
    assert "num_updates=3" in proc.stdout and "num_updates=1," not in proc.stdout
    state = torch.load(save_dir / "checkpoint_last.pt", weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 4


def test_malicious_checkpoint_is_refused_and_never_runs(malicious_checkpoint, monkeypatch):
    path, marker = malicious_checkpoint
    # Even the process-wide switch that flips torch.load's default back to full unpickling must not matter.
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    for load in (load_checkpoint, checkpoint_utils.load_checkpoint_to_cpu):
        with pytest.raises(XmlmError) as err:
            load(str(path))
        message = str(err.value)
        assert "\n" not in message and str(path) in message and "posix.system" in message
    assert not marker.exists()


def test_training_refuses_malicious_resume_checkpoint(malicious_checkpoint, tiny_roberta):
    path, marker = malicious_checkpoint
    proc = train_tiny_roberta(tiny_roberta / "bin", path.parent, 4, check=False)
    assert proc.returncode != 0
    assert f"refusing to load checkpoint {path}: it contains the global posix.system" in proc.stdout
    assert not marker.exists()


@pytest.mark.parametrize("damage,reason", [
    ("truncate", "failed reading zip archive"), ("empty", "EOFError"), ("garbage", "UnpicklingError"),
])
def test_corrupt_checkpoint_gives_one_clear_error(tiny_roberta, tmp_path, damage, reason):
    data = (tiny_roberta / "ckpt" / "checkpoint_last.pt").read_bytes()
    path = tmp_path / "checkpoint.pt"
    path.write_bytes({"truncate": data[: len(data) // 2], "empty": b"", "garbage": b"not a checkpoint"}[damage])
    with pytest.raises(XmlmError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"cannot read checkpoint {path}: corrupt") and reason in message
    assert "\n" not in message


def test_missing_checkpoint_and_data_dir(tiny_roberta, tmp_path):
    with pytest.raises(XmlmError, match="does not exist"):
        load_checkpoint(tmp_path / "nope.pt")
    with pytest.raises(XmlmError, match="data directory .* does not exist"):
        load_checkpoint(tiny_roberta / "ckpt" / "checkpoint_last.pt", data=tmp_path / "nowhere")


def test_trusted_legacy_opt_in_is_explicit_and_off_by_default(tiny_roberta, tmp_path, monkeypatch, capsys):
    # A trusted legacy checkpoint that carries a harmless global outside the allowlist.
    state = torch.load(tiny_roberta / "ckpt" / "checkpoint_last.pt", weights_only=True)
    state["extra_state"]["trained_on"] = datetime.date(2020, 5, 1)
    path = tmp_path / "legacy.pt"
    torch.save(state, path)

    monkeypatch.delenv(TRUST_ENV, raising=False)
    with pytest.raises(XmlmError, match="datetime.date"):
        load_checkpoint(path)
    assert "weights_only=False" not in capsys.readouterr().err

    load_checkpoint(path, trust=True)
    assert "warning: loading checkpoint" in capsys.readouterr().err
    with trusted_checkpoints():
        assert checkpoint_utils.load_checkpoint_to_cpu(str(path))["extra_state"]["trained_on"].year == 2020
    with pytest.raises(XmlmError):  # the opt-in ends with its block
        load_checkpoint(path)

    monkeypatch.setenv(TRUST_ENV, "1")
    load_checkpoint(path)
    assert f"{TRUST_ENV}=1" in capsys.readouterr().err
