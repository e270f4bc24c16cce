"""Real end-to-end: Bible en+fr -> xmlm-prepare -> fairseq-train (sep-emb + sep-layer 1) -> English genre
fine-tuning with language-specific parameters frozen -> zero-shot French evaluation (CPU, a few minutes' worth
of data cut down to seconds)."""
import json

import pytest
import torch

from fairseq_xmlm.zeroshot import bible_genre, genre
from fairseq_xmlm.zeroshot.finetune import (FinetuneConfig, SentenceClassifier, freeze_language_specific,
                                            load_pretrained, train_sentence_classifier)
from fairseq_xmlm.zeroshot.sweep import average_of_best_two

pytestmark = pytest.mark.usefixtures("one_thread")


def test_language_specific_parameters_stay_bitwise_unchanged(en_fr_checkpoint):
    encoder, task = load_pretrained(en_fr_checkpoint)
    english = bible_genre.genre_sets(task, "en")
    frozen = freeze_language_specific(encoder)
    owned = encoder.language_parameters()
    assert owned[0] and owned[1] and frozen == set(owned[0]) | set(owned[1])
    assert any(name.startswith("token_embeddings.1") for name in frozen)
    assert any(name.startswith("layers.0.1") for name in frozen)
    before = {name: p.detach().clone() for name, p in encoder.named_parameters()}
    classifier = SentenceClassifier(encoder, len(bible_genre.GENRES))
    config = FinetuneConfig(batch_size=16, encoder_lr=1e-3, head_lr=1e-3, epochs=1)
    train_sentence_classifier(classifier, english["train"][:160], english["dev"][:32], 0, config)
    after = dict(encoder.named_parameters())
    for name in frozen:
        assert torch.equal(after[name], before[name]), name
    shared = set(before) - frozen
    changed = {name for name in shared if not torch.equal(after[name], before[name])}
    # every shared parameter on the path from the first token to the head moves (lm head: not on that path)
    assert changed == {name for name in shared if not name.startswith("lm_")}


def test_genre_benchmark_end_to_end(en_fr_checkpoint, tmp_path):
    out = tmp_path / "results" / "genre.md"
    genre.main(["--checkpoints", str(en_fr_checkpoint), "--langs", "fr,de", "--out", str(out), "--max-train", "400",
                "--epochs", "2", "--batch-size", "16", "--encoder-lr", "1e-4", "--head-lr", "1e-3"])
    result = json.loads(out.with_suffix(".json").read_text())[str(en_fr_checkpoint)]
    assert set(result["test"]) == {"en", "fr"}  # the checkpoint has no German
    assert result["train_verses"] == 400
    assert result["dev"]["en"] == max(epoch["dev_accuracy"] for epoch in result["history"])
    for lang in ("en", "fr"):
        assert 0 <= result["test"][lang] <= 100 and 0 < result["majority"][lang] < 100
    table = out.read_text()
    assert f"| {en_fr_checkpoint} | {result['dev']['en']:.1f} | " in table
    assert f"{result['test']['fr']:.1f} ({result['majority']['fr']:.1f}) | - |" in table
    assert not list(out.parent.glob(".*.tmp"))


def test_average_of_best_two_selects_on_dev():
    runs = [{"dev": 50, "test_fr": 40}, {"dev": 70, "test_fr": 30}, {"dev": 60, "test_fr": 50},
            {"dev": 40, "test_fr": 90}]
    selected, averages = average_of_best_two(runs, "dev", ["test_fr"])
    assert selected == [runs[1], runs[2]] and averages == {"test_fr": 40}
