"""Real end-to-end: Bible en+fr -> xmlm-prepare -> fairseq-train (sep-emb + sep-layer 1) -> English genre
fine-tuning with language-specific parameters frozen -> zero-shot French evaluation (CPU, a few minutes' worth
of data cut down to seconds)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_xmlm.data.bible import fetch_bible
from fairseq_xmlm.data.prepare import prepare_pair
from fairseq_xmlm.zeroshot import genre
from fairseq_xmlm.zeroshot.finetune import (FinetuneConfig, SentenceClassifier, freeze_language_specific,
                                            load_pretrained, train_sentence_classifier)
from fairseq_xmlm.zeroshot.sweep import average_of_best_two

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def one_thread():
    # Fine-tuning is many tiny ops: on a busy 2-core machine two intra-op threads mostly wait for each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, one_thread):
    root = tmp_path_factory.mktemp("genre")
    fetch_bible(root / "bible", {"en": "3", "fr": "l"})
    # every data-bin split is read by the benchmark; these books put genres on both benchmark sides
    prepare_pair(root / "bible", ["en", "fr"], "joint", 600, root / "data",
                 train_books="Leviticus,Judges,Job,Micah,Acts,Galatians", valid_books="Ruth,Joel,Titus",
                 test_books="Ecclesiastes,Jonah,Ezra,2 Peter,Jude")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([str(VENV_BIN / "fairseq-train"), str(root / "data"), "--user-dir", "fairseq_xmlm",
                    "--task", "bilingual_mlm", "--langs", "en,fr", "--arch", "xmlm_bert_small",
                    "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                    "--encoder-attention-heads", "2", "--sep-emb", "--sep-layers", "1-1",
                    "--tokens-per-sample", "64", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "1e-3",
                    "--batch-size", "16", "--max-update", "60", "--cpu", "--num-workers", "0",
                    "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(root / "ckpt")],
                   cwd=REPO, env=env, check=True, capture_output=True)
    return root / "ckpt" / "checkpoint_last.pt"


def test_language_specific_parameters_stay_bitwise_unchanged(pretrained):
    encoder, task = load_pretrained(pretrained)
    english = genre.genre_sets(task, "en")
    frozen = freeze_language_specific(encoder)
    owned = encoder.language_parameters()
    assert owned[0] and owned[1] and frozen == set(owned[0]) | set(owned[1])
    assert any(name.startswith("token_embeddings.1") for name in frozen)
    assert any(name.startswith("layers.0.1") for name in frozen)
    before = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    classifier = SentenceClassifier(encoder, len(genre.GENRES))
    config = FinetuneConfig(batch_size=16, encoder_lr=1e-3, head_lr=1e-3, epochs=1)
    train_sentence_classifier(classifier, english["train"][:160], english["dev"][:32], 0, task.dictionary.pad(),
                              config)
    after = dict(encoder.named_parameters())
    for name in frozen:
        assert torch.equal(after[name], before[name]), name
    shared = set(before) - frozen
    changed = {name for name in shared if not torch.equal(after[name], before[name])}
    # every shared parameter on the path from the first token to the head moves (lm head: not on that path)
    assert changed == {name for name in shared if not name.startswith("lm_")}


def test_genre_benchmark_end_to_end(pretrained, tmp_path):
    out = tmp_path / "results" / "genre.md"
    genre.main(["--checkpoints", str(pretrained), "--langs", "fr,de", "--out", str(out), "--max-train", "400",
                "--epochs", "2", "--batch-size", "16", "--encoder-lr", "1e-4", "--head-lr", "1e-3"])
    result = json.loads(out.with_suffix(".json").read_text())[str(pretrained)]
    assert set(result["test"]) == {"en", "fr"}  # the checkpoint has no German
    assert result["train_verses"] == 400
    assert result["dev"]["en"] == max(epoch["dev_accuracy"] for epoch in result["history"])
    for lang in ("en", "fr"):
        assert 0 <= result["test"][lang] <= 100 and 0 < result["majority"][lang] < 100
    table = out.read_text()
    assert f"| {pretrained} | {result['dev']['en']:.1f} | " in table
    assert f"{result['test']['fr']:.1f} ({result['majority']['fr']:.1f}) | - |" in table
    assert not list(out.parent.glob(".*.tmp"))


def test_average_of_best_two_selects_on_dev():
    runs = [{"dev": 50, "test_fr": 40}, {"dev": 70, "test_fr": 30}, {"dev": 60, "test_fr": 50},
            {"dev": 40, "test_fr": 90}]
    selected, averages = average_of_best_two(runs, "dev", ["test_fr"])
    assert selected == [runs[1], runs[2]] and averages == {"test_fr": 40}
