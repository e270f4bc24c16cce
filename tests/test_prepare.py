"""xmlm-prepare on real Bible text: subword modes and anchors, fairseq-readable binaries, fake-english, bad input."""
import json
import sys
from pathlib import Path

import pytest
import sentencepiece as spm
from fairseq.data import Dictionary, data_utils

from fairseq_xmlm.data import prepare, preparation
from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.errors import XmlmError

sys.path.insert(0, str(Path(__file__).parent))
from test_data_bible import fetched_bible_dir  # noqa: E402

# small and fast: the four gospels for training, one short book each for valid and test
SMALL = dict(valid_books="Ruth", test_books="Jonah", train_books="40-43")


@pytest.fixture(scope="module")
def bible_dir():
    return fetched_bible_dir()


@pytest.fixture(scope="module")
def prepared(bible_dir, tmp_path_factory):
    """{mode: data dir} for en-fr in the three subword modes."""
    root = tmp_path_factory.mktemp("data-bin")
    sizes = {"joint": 800, "separate": 500, "prefixed": 500}
    return {mode: _prepare(bible_dir, root / mode, mode, size) for mode, size in sizes.items()}


def _prepare(bible_dir, out, mode, vocab_size):
    preparation.prepare_pair(bible_dir, ["en", "fr"], mode, vocab_size, out, **SMALL)
    return out


def test_layout_meta_and_report(prepared):
    for mode, out in prepared.items():
        names = {path.name for path in out.iterdir()}
        expected = {f"{split}.{lang}.{suffix}" for split in preparation.SPLITS for lang in ("en", "fr")
                    for suffix in ("bin", "idx")}
        assert expected | {"dict.txt", "meta.json", "report.json", "report.md"} <= names, mode
        assert not any(name.startswith(".") for name in names)
        meta = json.loads((out / "meta.json").read_text())
        assert meta["langs"] == ["en", "fr"] and meta["mode"] == mode
        assert meta["splits"] == {"train": [40, 41, 42, 43], "valid": [8], "test": [32]}
        assert all((out / model).exists() for model in meta["spm"].values())
    assert len(set(json.loads((prepared["separate"] / "meta.json").read_text())["spm"].values())) == 2


def test_anchor_counts_by_mode(prepared):
    shared = {mode: json.loads((out / "report.json").read_text())["shared_symbols"] for mode, out in prepared.items()}
    assert shared["joint"] > 100
    assert shared["prefixed"] == 0
    assert 0 < shared["separate"]
    symbols = [line.split()[0] for line in (prepared["prefixed"] / "dict.txt").read_text().splitlines()]
    assert all(symbol.startswith(("en:", "fr:", "madeupword")) for symbol in symbols)
    assert {symbol[:3] for symbol in symbols} >= {"en:", "fr:"}


def test_binaries_are_readable_and_parallel(prepared, bible_dir):
    out = prepared["joint"]
    dictionary = Dictionary.load(str(out / "dict.txt"))
    model = spm.SentencePieceProcessor(model_file=str(out / "spm.joint.model"))
    verse_lines = {lang: read_corpus(bible_dir / f"{lang}.txt") for lang in ("en", "fr")}
    for split in preparation.SPLITS:
        kept = [int(line) for line in (out / f"verses.{split}.txt").read_text().split()]
        for lang in ("en", "fr"):
            dataset = data_utils.load_indexed_dataset(str(out / f"{split}.{lang}"), dictionary, "mmap")
            assert len(dataset) == len(kept), (split, lang)
            if split == "valid":
                # item k is verse kept[k]: decoding its pieces gives back the Moses-tokenized verse
                for k in (0, len(kept) - 1):
                    item = dataset[k]
                    assert item[-1] == dictionary.eos()
                    decoded = model.decode(dictionary.string(item[:-1]).split())
                    expected = preparation.moses_tokenize([verse_lines[lang][kept[k] - 1]], lang, False)[0]
                    assert decoded == expected
    report = json.loads((out / "report.json").read_text())
    assert report["counts"]["en"]["valid"]["sentences"] == report["counts"]["fr"]["valid"]["sentences"] == 85
    assert report["dictionary_size"] == len(dictionary)


def test_fake_english(bible_dir, tmp_path):
    out = tmp_path / "fake_english"
    report = preparation.prepare_fake_english(bible_dir, out, vocab_size=2048, valid_size=300)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["langs"] == ["en"] and meta["task"] == "fake_english"
    dictionary = Dictionary.load(str(out / "dict.txt"))
    assert 1000 < len(dictionary) <= 2048 + 8
    train = data_utils.load_indexed_dataset(str(out / "train.en"), dictionary, "mmap")
    valid = data_utils.load_indexed_dataset(str(out / "valid.en"), dictionary, "mmap")
    assert len(valid) == report["counts"]["en"]["valid"]["sentences"] == 300
    assert len(train) == report["counts"]["en"]["train"]["sentences"] > 7957  # more sentences than NT verses
    assert dictionary.unk() not in train[0]


def _names(folder):
    return sorted(path.name for path in folder.iterdir())


@pytest.mark.parametrize("problem, writer, message", [
    ("missing", None, "corpus file not found"),
    ("empty", lambda path: path.write_text("\n\n"), "corpus file is empty"),
    ("utf8", lambda path: path.write_bytes("good\nline two\nbad \xff\xfe here\n".encode("latin-1")),
     "invalid UTF-8 on line 3"),
])
def test_bad_corpus(bible_dir, tmp_path, problem, writer, message):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "verses.tsv").write_text((bible_dir / "verses.tsv").read_text())
    (corpus / "en.txt").write_text((bible_dir / "en.txt").read_text())
    if writer is not None:
        writer(corpus / "fr.txt")
    with pytest.raises(XmlmError, match=message):
        preparation.prepare_pair(corpus, ["en", "fr"], "joint", 500, tmp_path / "out", **SMALL)
    assert _names(tmp_path) == ["corpus"]


def test_bad_settings_leave_nothing_behind(bible_dir, tmp_path, capsys):
    with pytest.raises(XmlmError, match="unknown language 'xx'"):
        preparation.prepare_pair(bible_dir, ["en", "xx"], "joint", 500, tmp_path / "out", **SMALL)
    with pytest.raises(XmlmError, match=r"--vocab-size 100000 is too large for the en\+fr corpus"):
        preparation.prepare_pair(bible_dir, ["en", "fr"], "joint", 100000, tmp_path / "out", **SMALL)
    with pytest.raises(XmlmError, match="unknown Bible book 'Hezekiah'"):
        preparation.prepare_pair(bible_dir, ["en", "fr"], "joint", 500, tmp_path / "out", valid_books="Hezekiah")
    assert _names(tmp_path) == []
    with pytest.raises(SystemExit) as exit_info:
        prepare.main(["pair", "--corpus-dir", str(bible_dir), "--langs", "en,fr", "--vocab-size", "100000",
                      "--out", str(tmp_path / "out"), "--train-books", "40", "--valid-books", "8",
                      "--test-books", "32"])
    assert exit_info.value.code == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert errors[-1].startswith("error: --vocab-size 100000 is too large")
    assert _names(tmp_path) == []


def test_parse_books():
    assert preparation.parse_books("Ruth, 40-41,john,1") == [1, 8, 40, 41, 43]
    with pytest.raises(XmlmError, match="book number 67"):
        preparation.parse_books("66-70")


def test_read_corpus_errors(tmp_path):
    path = tmp_path / "c.txt"
    path.write_bytes(b"ok\n\xc3\x28 broken\n")
    with pytest.raises(XmlmError, match=r"c.txt: invalid UTF-8 on line 2"):
        read_corpus(path)
    path.write_text("a\n\nb\n")
    assert read_corpus(path) == ["a", "", "b"]
    with pytest.raises(XmlmError, match="empty line 2"):
        read_corpus(path, allow_empty_lines=False)
