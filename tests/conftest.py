"""Session fixtures shared by the test modules: real Bible text, prepared data, tiny real training runs."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fairseq_xmlm.data import bible

REPO = Path(__file__).resolve().parents[1]
TEST_VERSIONS = {"en": "3", "en_kjv": "k", "fr": "l", "de": "s", "ru": "r", "hi": "i", "zh": "c"}


def fetched_bible_dir():
    """The test Bibles under the cache dir, fetched on first use (later runs and modules reuse them)."""
    folder = bible.cache_dir() / "tests" / "bible"
    if not all((folder / name).exists() for name in ["verses.tsv", *(f"{lang}.txt" for lang in TEST_VERSIONS)]):
        bible.fetch_bible(folder, TEST_VERSIONS)
    return folder


@pytest.fixture(scope="session")
def bible_dir():
    return fetched_bible_dir()


@pytest.fixture(scope="session")
def fake_english_data(bible_dir, tmp_path_factory):
    """Dufter's data (BBE New Testament, 2048 pieces) with a 1000-sentence KJV dev set."""
    from fairseq_xmlm.data.prepare import prepare_fake_english

    out = tmp_path_factory.mktemp("data-bin") / "fake_english"
    prepare_fake_english(bible_dir, out, vocab_size=2048, valid_size=1000)
    return out


def fairseq_train(data, save_dir, *extra, updates=8, batch_size=32):
    """A real `fairseq-train --user-dir fairseq_xmlm` run on the CPU; returns its log."""
    command = [
        str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir", str(REPO / "fairseq_xmlm"),
        "--arch", "xmlm_bert_small", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "2e-3",
        "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "2",
        "--total-num-update", str(updates), "--batch-size", str(batch_size), "--max-update", str(updates),
        "--save-dir", str(save_dir), "--cpu", "--num-workers", "0", "--log-format", "simple", "--log-interval", "1",
        "--max-valid-steps", "2", "--no-epoch-checkpoints", "--seed", "1", *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0:
        raise AssertionError(f"fairseq-train failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


@pytest.fixture(scope="session")
def fake_english_checkpoint(fake_english_data, tmp_path_factory):
    """A BERT-small trained for a few updates on Fake-English: the tiny real checkpoint other tests evaluate."""
    save_dir = tmp_path_factory.mktemp("checkpoints") / "original"
    fairseq_train(fake_english_data, save_dir, "--task", "fake_english", updates=10)
    return save_dir / "checkpoint_last.pt"
