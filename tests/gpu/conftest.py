"""The GPU checks: tests marked `gpu` run on a CUDA GPU with Triton's compiler (not its interpreter, which
tests/conftest.py switches on for the CPU suite) and skip elsewhere, saying why:

    TRITON_INTERPRET=0 python -m pytest tests/gpu -m gpu

They train the recipe's real runs (`recipe_runs`) on the test suite's Fake-English data.
"""
import os
from argparse import Namespace

import pytest
import torch

from fairseq_xmlm.experiments.dufter.recipe import train_command
from fairseq_xmlm.experiments.dufter.runs import PRESETS, SEEDS
from fairseq_xmlm.packed.runs import parse_run


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU and Triton's compiler (TRITON_INTERPRET=0)")


def why_not_here():
    """Why the GPU checks cannot run in this process, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "Triton's interpreter is on: run with TRITON_INTERPRET=0 to check the compiled kernels"
    return None


def pytest_collection_modifyitems(config, items):
    reason = why_not_here()
    if reason:
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def recipe_runs(fake_english_data, tmp_path):
    """build(ids, folder, updates, extra) -> the Dufter recipe's runs of these IDs, first seed, with its full preset
    (without the multilinguality hook: these checks are of training), capped at `updates` updates, `extra` flags
    added, saving under tmp_path/folder/ID; parsed and built."""
    def build(ids, folder, updates=10 ** 6, extra=()):
        runs = []
        for run_id in ids:
            run_dir = tmp_path / folder / run_id
            command = [str(word) for word in train_command(run_id, SEEDS[0], fake_english_data,
                                                            run_dir / "checkpoints", PRESETS["full"],
                                                            tmp_path / "knn_table.pt")]
            if "--eval-multilinguality" in command:
                command.remove("--eval-multilinguality")
            command += ["--max-update", str(updates), "--log-file", str(run_dir / "train.log"), *extra]
            runs.append(parse_run(command).build())
        return runs

    return build


@pytest.fixture
def conneau_layers():
    return make_conneau_layers


def make_conneau_layers(flag, dropout):
    """`conneau_layers`: two Transformer layers of the Conneau config in bf16 on the GPU with the same weights, without and with the
    model option `flag` (e.g. fused_bias_gelu), and an input batch of 16 full 256-token rows with its key mask."""
    from fairseq_xmlm.models.partially_shared_roberta import TransformerLayer

    torch.manual_seed(0)
    cfg = dict(encoder_embed_dim=768, encoder_attention_heads=12, encoder_ffn_embed_dim=3072, activation_fn="gelu",
               dropout=dropout, attention_dropout=0.0, activation_dropout=0.0, cudnn_attention=False)
    plain, fused = (TransformerLayer(Namespace(**cfg, **{flag: on})).cuda().to(torch.bfloat16) for on in (False, True))
    fused.load_state_dict(plain.state_dict())
    x = torch.randn(16, 256, 768, device="cuda", dtype=torch.bfloat16)
    return plain, fused, x, torch.ones(16, 1, 1, 256, dtype=torch.bool, device="cuda")
