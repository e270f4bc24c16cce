"""The plugin registers itself (and the checkpoint allowlist) wherever fairseq runs: --user-dir in both spellings,
fresh spawned processes, and the two ranks of a real CPU (gloo) distributed fairseq-train resume."""
import json
import multiprocessing
import pickle
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from conftest import TIMEOUT
from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig
from test_checkpoints import REPO, TINY_ROBERTA, VENV_BIN, build_tiny_roberta, run_tool

PLUGIN_DIR = str(REPO / "fairseq_xmlm")

# Runs in a fresh interpreter: reports which plugin modules got imported, under which names, and what got registered.
REPORT_PLUGIN = """
import json, sys
from fairseq import checkpoint_utils
from fairseq.models import MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
names_of_file = {}
for name, module in list(sys.modules.items()):
    if (getattr(module, "__file__", None) or "").startswith(sys.argv[1]):
        names_of_file.setdefault(module.__file__, []).append(name)
print(json.dumps({"names_of_file": names_of_file, "models": sorted(MODEL_REGISTRY), "tasks": sorted(TASK_REGISTRY),
                  "safe_load": checkpoint_utils.torch.load.__module__}))
"""


def plugin_report(prelude, stdin=None, cwd=REPO):
    proc = subprocess.run([sys.executable, "-c", prelude + REPORT_PLUGIN, PLUGIN_DIR], input=stdin, cwd=cwd,
                          capture_output=True, check=True, timeout=TIMEOUT)
    return json.loads(proc.stdout.decode().strip().splitlines()[-1])


def assert_plugin_registered_once(report):
    assert report["names_of_file"], "the plugin was not imported"
    for path, names in report["names_of_file"].items():
        assert len(names) == 1 and names[0].startswith("fairseq_xmlm"), (path, names)
    assert "partially_shared_roberta" in report["models"]
    assert {"fake_english", "bilingual_mlm"} <= set(report["tasks"])
    assert report["safe_load"] == "fairseq_xmlm.checkpoints"


def test_user_dir_relative_and_absolute_import_the_package_once():
    # fairseq imports --user-dir DIR as the module named basename(DIR): both spellings must give `fairseq_xmlm`.
    prelude = ("import argparse, sys\nfrom fairseq import utils\n"
               "utils.import_user_module(argparse.Namespace(user_dir='fairseq_xmlm'))\n"
               "utils.import_user_module(argparse.Namespace(user_dir=sys.argv[1]))\n")
    assert_plugin_registered_once(plugin_report(prelude))


def test_fresh_process_unpickling_our_config_registers_the_plugin(tmp_path):
    # What a spawned worker does first: unpickle its arguments. Nothing imports fairseq_xmlm explicitly here,
    # and the process runs outside the repo, so only the installed package can satisfy the reference.
    cfg = OmegaConf.structured(FakeEnglishConfig(tokens_per_sample=64))
    report = plugin_report("import pickle, sys\ncfg = pickle.loads(sys.stdin.buffer.read())\n"
                           "assert cfg.tokens_per_sample == 64\n", stdin=pickle.dumps(cfg), cwd=tmp_path)
    assert_plugin_registered_once(report)


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory):
    return build_tiny_roberta(tmp_path_factory)


def test_spawned_worker_loads_checkpoints_safely(tiny_roberta):
    # torch.multiprocessing.spawn (fairseq's GPU workers) uses the "spawn" start method: a fresh interpreter that
    # unpickles its target by reference, importing fairseq_xmlm and so installing the allowlist.
    worker = multiprocessing.get_context("spawn").Process(
        target=load_checkpoint, args=(str(tiny_roberta / "ckpt" / "checkpoint_last.pt"),))
    worker.start()
    worker.join()
    assert worker.exitcode == 0


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_two_rank_cpu_distributed_resume(tiny_roberta, tmp_path):
    # fairseq cannot spawn CPU workers itself (it spawns one per CUDA device), but it runs one process per rank
    # with --distributed-no-spawn, gloo, and legacy_ddp (pytorch_ddp passes CUDA device_ids). On resume, rank 0
    # reads checkpoint_last.pt and broadcasts it; rank 1 torch.loads the broadcast with weights_only=True, which
    # only works because --user-dir imported the plugin's allowlist in that process too.
    save_dir = tmp_path / "ckpt"
    save_dir.mkdir()
    shutil.copy(tiny_roberta / "ckpt" / "checkpoint_last.pt", save_dir)
    common = [tiny_roberta / "bin", *TINY_ROBERTA, "--save-dir", save_dir, "--max-update", "3",
              "--distributed-world-size", "2", "--distributed-backend", "gloo", "--distributed-no-spawn",
              "--distributed-init-method", f"tcp://127.0.0.1:{free_port()}", "--ddp-backend", "legacy_ddp"]
    rank1 = subprocess.Popen([str(VENV_BIN / "fairseq-train"), *map(str, common),
                              "--distributed-rank", "1", "--user-dir", PLUGIN_DIR],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rank0 = run_tool("fairseq-train", *common, "--distributed-rank", "0", "--user-dir", "fairseq_xmlm",
                     check=False)
    rank1_log = rank1.communicate(timeout=300)[0]
    assert rank0.returncode == 0, rank0.stdout[-3000:]
    assert rank1.returncode == 0, rank1_log[-3000:]
    assert "(epoch 1 @ 2 updates)" in rank0.stdout and "num_updates=3" in rank0.stdout
    assert torch.load(save_dir / "checkpoint_last.pt", weights_only=True)["optimizer_history"][-1]["num_updates"] == 3
