"""The Table 1 driver end to end on the CPU: two rows of one pair on a few Bible books, restart included."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fairseq_xmlm.data import bible_verses
from fairseq_xmlm.experiments.conneau import report
from fairseq_xmlm.experiments.conneau.evaluate import cka_by_layer
from fairseq_xmlm.experiments.commands import parse_choices
from fairseq_xmlm.experiments.conneau.recipe import parse_pairs
from fairseq_xmlm.experiments.conneau.runs import SETTINGS
from fairseq_xmlm.errors import XmlmError

REPO = Path(__file__).resolve().parents[1]
# Mark trains; the default held-out books (Ruth, Jonah, Philippians; Esther, Lamentations, James) stay.
KEPT_BOOKS = {"Mark", "Ruth", "Jonah", "Philippians", "Esther", "Lamentations", "James"}
DICTIONARY = ["god dieu", "lord seigneur", "king roi", "son fils", "man homme", "day jour", "house maison",
              "land pays", "word parole", "people peuple", "heart coeur", "father père", "city ville"]


@pytest.fixture(scope="module")
def small_corpus(bible_dir, tmp_path_factory):
    """The en and fr Bibles with every verse outside KEPT_BOOKS emptied (a verse empty in one language is left out
    by xmlm-prepare), and a small en-fr MUSE dictionary."""
    root = tmp_path_factory.mktemp("conneau")
    corpus = root / "bible"
    corpus.mkdir()
    books = [bible_verses.BOOKS[book] for book, _, _ in bible_verses.read_verse_table(bible_dir)]
    for lang in ("en", "fr"):
        lines = (bible_dir / f"{lang}.txt").read_text(encoding="utf-8").splitlines()
        kept = [line if book in KEPT_BOOKS else "" for line, book in zip(lines, books)]
        (corpus / f"{lang}.txt").write_text("\n".join(kept) + "\n", encoding="utf-8")
    (corpus / "verses.tsv").write_bytes((bible_dir / "verses.tsv").read_bytes())
    (root / "dicts").mkdir()
    (root / "dicts" / "en-fr.txt").write_text("\n".join(DICTIONARY) + "\n", encoding="utf-8")
    return root


def recipe(root, *extra):
    command = [sys.executable, "-m", "fairseq_xmlm.experiments.conneau", "--pairs", "en-fr", "--preset", "tiny",
               "--corpus-dir", str(root / "bible"), "--dict-dir", str(root / "dicts"), "--data-root",
               str(root / "data-bin"), "--checkpoint-root", str(root / "checkpoints"), "--results",
               str(root / "results"), *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def test_two_rows_train_evaluate_resume_and_report(small_corpus):
    root = small_corpus
    # a first sitting cut short: Default trains 3 of its 6 updates and is evaluated
    recipe(root, "--rows", "default", "--train-args", "--max-update 3")
    first = root / "results" / "en-fr" / "default" / "seed1.json"
    assert json.loads(first.read_text())["curve"][-1]["updates"] == 3
    first.unlink()  # as if the sitting had ended before the evaluation
    log = recipe(root, "--rows", "default,sep_emb")
    train_log = (root / "results" / "logs").glob("*.log")
    assert any("@ 3 updates" in path.read_text() for path in train_log), "Default did not resume from update 3"
    summary = json.loads((root / "results" / "conneau_table1.json").read_text())
    assert summary["preset"] == "tiny" and summary["updates"] == 6 and summary["seeds"] == [1]
    rows = summary["pairs"]["en-fr"]
    assert set(rows) == {"default", "sep_emb"}
    for entry in rows.values():
        assert entry["n_seeds"] == 1 and 0 <= entry["retrieval"] <= 1 and entry["ppl_en"] > 1
        assert 0 <= entry["genre"] <= 1 and 0 <= entry["genre_majority"] <= 1
        assert 0 <= entry["translation"] <= 1 and 0 <= entry["alignment"] <= 1
        assert 0 <= entry["retrieval_aligned"] <= 1 and 0 <= entry["cka"] <= 1
        assert set(entry["cka_random_encoder_by_layer"]) == set(entry["retrieval_by_layer"])
    result = json.loads((root / "results" / "en-fr" / "sep_emb" / "seed1.json").read_text())
    assert result["language_parameters"]["0"] > 0  # Sep Emb: English has its own embeddings
    assert [point["updates"] for point in result["curve"]] == [3, 6]
    assert not list((root / "checkpoints" / "en-fr" / "sep_emb" / "seed1").glob("checkpoint_*_*.pt"))
    assert (root / "results" / "figure3.png").stat().st_size > 0 and (root / "results" / "table1.md").is_file()
    # a third sitting finds everything done: nothing trains, nothing is evaluated again
    before = {path: path.stat().st_mtime_ns for path in (root / "results" / "en-fr").glob("*/seed1.json")}
    log = recipe(root, "--rows", "default,sep_emb")
    assert "conneau: training" not in log
    assert before == {path: path.stat().st_mtime_ns for path in (root / "results" / "en-fr").glob("*/seed1.json")}


def test_report_takes_each_metric_at_its_best_layer():
    by_seed = {1: {"retrieval": {"0": 0.1, "1": 0.5, "2": 0.3}, "ppl_en": 10.0},
               2: {"retrieval": {"0": 0.2, "1": 0.3, "2": 0.4}, "ppl_en": 20.0}}
    entry = report.summarize_row(by_seed)
    assert entry["retrieval_layer"] == 1 and entry["retrieval"] == pytest.approx(0.4)
    assert entry["retrieval_std"] == pytest.approx(0.1414, abs=1e-4) and entry["ppl_en"] == 15.0


def test_cka_by_layer_sees_a_rotation_as_identical_and_unrelated_data_as_dissimilar():
    generator = torch.Generator().manual_seed(0)
    first = [torch.randn(500, 16, generator=generator) for _ in range(2)]
    rotation, _ = torch.linalg.qr(torch.randn(16, 16, generator=generator))
    rotated = cka_by_layer(first, [layer @ rotation for layer in first])
    unrelated = cka_by_layer(first, [torch.randn(500, 16, generator=generator) for _ in range(2)])
    assert set(rotated) == {"0", "1"} and all(value == pytest.approx(1.0) for value in rotated.values())
    assert all(value < 0.1 for value in unrelated.values())


def test_seeds_of_the_report_are_those_with_results():
    found = {"en-fr": {"default": {1: {"ppl_en": 1.0}, 2: {"ppl_en": 2.0}}, "sep_emb": {2: {"ppl_en": 3.0}}}}
    assert report.of_seeds(found, [1]) == {"en-fr": {"default": {1: {"ppl_en": 1.0}}}}
    assert report.summarize(report.of_seeds(found, [1, 3]), "tiny", 6)["seeds"] == [1]


def test_bad_pairs_and_rows():
    assert parse_pairs("en,fr") == ["en-fr"] and parse_pairs("en-fr,en-zh") == ["en-fr", "en-zh"]
    for text in ("fr-en", "en-en", "en", ""):
        with pytest.raises(XmlmError):
            parse_pairs(text)
    assert parse_choices(" default , sep_emb", SETTINGS, "rows") == ["default", "sep_emb"]
    assert parse_choices("all", SETTINGS, "rows") == list(SETTINGS)
    for text in ("default,sep_everything", ","):
        with pytest.raises(XmlmError, match="unknown rows"):
            parse_choices(text, SETTINGS, "rows")
