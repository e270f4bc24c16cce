"""Dictionary code-switching on real Bible text with the real FreeDict en-fr dictionary."""
import json
import sys
from pathlib import Path

import pytest

from fairseq_xmlm.data import bilingual_dictionary, preparation
from fairseq_xmlm.data.codeswitch import build_switch_dictionary, code_switch, load_switch_dictionary
from fairseq_xmlm.errors import XmlmError

sys.path.insert(0, str(Path(__file__).parent))
from test_data_bible import fetched_bible_dir  # noqa: E402


@pytest.fixture(scope="module")
def dictionary_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("dict") / "en-fr.txt"
    bible_dir = fetched_bible_dir()
    bilingual_dictionary.build_dictionary("en-fr", path, vocab=bible_dir / "en.txt", tgt_vocab=bible_dir / "fr.txt")
    return path


@pytest.fixture(scope="module")
def tokens():
    bible_dir = fetched_bible_dir()
    lines = {lang: (bible_dir / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[23145:27145]
             for lang in ("en", "fr")}  # 4000 verses of the gospels
    return {lang: preparation.moses_tokenize(text, lang, False) for lang, text in lines.items()}


def test_rates_on_real_text(dictionary_file, tokens):
    forward, backward = load_switch_dictionary(dictionary_file)
    for lang, dictionary in (("en", forward), ("fr", backward)):
        switched, stats = code_switch(tokens[lang], dictionary, prob=0.3, max_rate=0.15, seed=3)
        assert len(switched) == len(tokens[lang])
        assert stats["words"] == sum(len(line.split()) for line in tokens[lang])
        changed = sum(a != b for old, new in zip(tokens[lang], switched) for a, b in zip(old.split(), new.split()))
        assert changed <= stats["replaced"] <= 0.15 * stats["words"]
        expected = 0.3 * stats["candidates"] / stats["words"]
        assert stats["candidates"] > 0.1 * stats["words"], lang
        assert abs(stats["rate"] - min(expected, 0.15)) < 0.02, (lang, stats)
        assert changed > 0.8 * stats["replaced"]  # a few translations equal their word after capitalisation


def test_cap_per_chunk(dictionary_file, tokens):
    forward, _ = load_switch_dictionary(dictionary_file)
    switched, stats = code_switch(tokens["en"], forward, prob=1.0, max_rate=0.05, seed=0, chunk_lines=500)
    for start in range(0, len(switched), 500):
        old, new = tokens["en"][start:start + 500], switched[start:start + 500]
        words = sum(len(line.split()) for line in old)
        changed = sum(a != b for o, n in zip(old, new) for a, b in zip(o.split(), n.split()))
        assert changed <= int(0.05 * words)
    assert stats["rate"] <= 0.05 and stats["rate"] > 0.045


def test_weights_direction_and_seed():
    dictionary = build_switch_dictionary([("dog", "chien", 9.0), ("dog", "toutou", 1.0), ("cat", "chat")])
    lines = ["the dog and the cat"] * 400 + ["Dog !"]
    switched, stats = code_switch(lines, dictionary, prob=1.0, max_rate=1.0, seed=7)
    assert switched[0].startswith("the ") and switched[-1] in ("Chien !", "Toutou !")
    dogs = [line.split()[1] for line in switched[:400]]
    assert 0.8 < dogs.count("chien") / 400 < 0.97 and dogs.count("toutou") > 0
    assert stats["replaced"] == 801
    assert code_switch(lines, dictionary, 0.3, 0.15, seed=7) == code_switch(lines, dictionary, 0.3, 0.15, seed=7)
    inverse = build_switch_dictionary([("dog", "chien"), ("cat", "chat")], invert=True)
    assert code_switch(["le chien"], inverse, 1.0, 1.0)[0] == ["le dog"]
    with pytest.raises(XmlmError, match="must lie in"):
        code_switch(lines, dictionary, prob=1.5)


def test_prepare_pair_reports_codeswitch(dictionary_file, tmp_path):
    out = tmp_path / "cs"
    report = preparation.prepare_pair(fetched_bible_dir(), ["en", "fr"], "separate", 500, out, valid_books="Ruth",
                                      test_books="Jonah", train_books="40-43", codeswitch_dict=dictionary_file)
    saved = json.loads((out / "report.json").read_text())
    assert saved["codeswitch"] == report["codeswitch"]
    for lang in ("en", "fr"):
        assert 0.02 < saved["codeswitch"][lang]["rate"] <= 0.15
    assert json.loads((out / "meta.json").read_text())["codeswitch"]["en"]["prob"] == 0.3
