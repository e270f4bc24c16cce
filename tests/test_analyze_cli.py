"""xmlm-analyze sentence|cka end to end on the tiny real Fake-English checkpoint of conftest."""
import json
import os
import stat

import numpy as np
import pytest

from fairseq_xmlm.analysis import cli
from fairseq_xmlm.analysis.sentence_retrieval import sentence_retrieval
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.vocabulary import WORD_START

SMALL = ["--max-sentences", "300", "--n-train", "200", "--device", "cpu"]


def test_sentence_retrieval_recovers_a_rotated_copy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 32))
    q, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    result = sentence_retrieval(a, a @ q + 0.01 * rng.standard_normal((300, 32)), n_train=100)
    assert result == {"a_to_b": 1.0, "b_to_a": 1.0}
    unrelated = sentence_retrieval(a, rng.standard_normal((300, 32)), n_train=100)
    assert unrelated["a_to_b"] < 0.1
    with pytest.raises(XmlmError, match="held-out"):
        sentence_retrieval(a, a, n_train=300)


def test_sentence_and_cka_on_a_real_checkpoint(fake_english_checkpoint, tmp_path):
    ckpt = str(fake_english_checkpoint)
    umask = os.umask(0o022)  # results are for the group to read, as a plain open() would make them
    try:
        sentence = cli.run(["sentence", "--model-a", ckpt, "--lang-a", "0", "--lang-b", "1", "--out", str(tmp_path),
                             *SMALL])
    finally:
        os.umask(umask)
    assert {stat.S_IMODE((tmp_path / name).stat().st_mode) for name in ("sentence.json", "sentence.png")} == {0o644}
    written = json.loads((tmp_path / "sentence.json").read_text())
    assert written == json.loads(json.dumps(sentence))
    assert (tmp_path / "sentence.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    layers = written["layers"]
    assert len(layers) >= 2 and written["n_test"] == 100
    assert all(0 <= r["a_to_b"] <= 1 and 0 <= r["b_to_a"] <= 1 for r in layers)

    # English against English under the same model: identical vectors, perfect scores at every layer
    same = cli.run(["cka", "--model-a", ckpt, "--lang-a", "0", "--lang-b", "0", "--out", str(tmp_path), *SMALL])
    assert same["cka"] == pytest.approx([1.0] * len(layers))
    assert min(same["retrieval_p1"]) > 0.95
    assert max(same["cka_random"][1:]) < 0.999  # a random encoder is not the trained one
    assert (tmp_path / "cka.png").exists()

    bilingual = cli.run(["cka", "--model-a", ckpt, "--out", str(tmp_path), *SMALL])
    assert len(bilingual["cka"]) == len(layers) and all(0 <= v <= 1 for v in bilingual["cka"])
    assert json.loads((tmp_path / "cka.json").read_text())["pearson_cka_retrieval"] == \
        pytest.approx(bilingual["pearson_cka_retrieval"], nan_ok=True)


def test_bad_language_index_is_one_clear_error(fake_english_checkpoint, tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main(["sentence", "--model-a", str(fake_english_checkpoint), "--lang-b", "5", "--out", str(tmp_path),
                  *SMALL])
    assert capsys.readouterr().err.strip().splitlines()[-1] == \
        f"error: language index 5 does not exist in {fake_english_checkpoint} (its task has 2)"


def write_identity_dictionaries(checkpoint, folder):
    """English -> Fake-English is the identity: frequent one-piece words, the 40 most frequent held out for test."""
    from fairseq_xmlm.checkpoints import load_checkpoint

    _, task, _ = load_checkpoint(checkpoint)
    english = task.english
    words = [english[i][1:] for i in sorted(range(english.nspecial, len(english)), key=lambda i: -english.count[i])
             if english[i].startswith(WORD_START) and english[i][1:].isalpha()]
    (folder / "test.txt").write_text("".join(f"{w} {w}\n" for w in words[:40]))
    (folder / "train.txt").write_text("".join(f"{w} {w}\n" for w in words[40:400]))
    (folder / "unknown.txt").write_text("qqqzzz xxxyyy\n")


def test_word_translation_on_a_real_checkpoint(fake_english_checkpoint, tmp_path, capsys):
    write_identity_dictionaries(fake_english_checkpoint, tmp_path)
    common = ["--model-a", str(fake_english_checkpoint), "--out", str(tmp_path), "--fasttext-dim", "32",
              "--fasttext-epochs", "5", "--max-sentences", "300", "--device", "cpu"]
    result = cli.run(["word", *common, "--dict-train", str(tmp_path / "train.txt"),
                       "--dict-test", str(tmp_path / "test.txt")])
    assert json.loads((tmp_path / "word.json").read_text())["contextual"] == result["contextual"]
    assert (tmp_path / "word.png").exists()
    assert result["noncontextual"]["test_pairs"] > 20 and result["noncontextual"]["train_pairs"] > 200
    assert len(result["contextual"]) >= 2 and result["contextual"][0]["test_pairs"] > 20
    for scores in [result["noncontextual"], result["fasttext"], *result["contextual"]]:
        assert 0 <= scores["p1"] <= 1

    with pytest.raises(SystemExit):
        cli.main(["word", *common, "--dict-train", str(tmp_path / "unknown.txt"),
                  "--dict-test", str(tmp_path / "test.txt")])
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith(
        "error: non-contextual (single-piece words): no dictionary pair has both words in the vocabulary")
