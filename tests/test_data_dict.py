"""xmlm-fetch-dict on the real Debian FreeDict eng-fra package (downloaded once with apt-get into the cache)."""
import shutil
import sys
from pathlib import Path

import pytest

from fairseq_xmlm.data import bilingual_dictionary, freedict
from fairseq_xmlm.data.cache import cache_dir
from fairseq_xmlm.data.muse import load_muse_dictionary
from fairseq_xmlm.errors import XmlmError

sys.path.insert(0, str(Path(__file__).parent))
from test_data_bible import fetched_bible_dir  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None and not
                                (cache_dir() / "freedict" / "dict-freedict-eng-fra").exists(),
                                reason="needs apt-get (or a cached dict-freedict-eng-fra)")


@pytest.fixture(scope="module")
def en_fr_pairs():
    return bilingual_dictionary.parse_freedict(bilingual_dictionary.fetch_package("en-fr"))


def test_dictd_numbers():
    assert bilingual_dictionary.dictd_number("A") == 0
    assert bilingual_dictionary.dictd_number("B") == 1
    assert bilingual_dictionary.dictd_number("BA") == 64
    assert bilingual_dictionary.dictd_number("LOB") == 11 * 64 * 64 + 14 * 64 + 1


def test_entry_parsing():
    entry = "abate /əbeit/\n1. s'abaisser, s'abattre\n2. abaisser, abréger (un texte), amoindrir\n"
    assert bilingual_dictionary.entry_translations(entry) == ["s'abaisser", "s'abattre", "abaisser", "abréger",
                                                              "amoindrir"]
    german = ("hunting animal /x/\nJagdtier <neut>, jagendes Tier <neut>, Jäger <masc> [zool.]\n"
              "   Synonym: {hunter}\n\n see: {hunting animals}\n")
    assert bilingual_dictionary.entry_translations(german) == ["jagdtier", "jäger"]
    hindi = 'voyage /v/ <N>\n1. यात्रा{जल~या~विमान}\n      "The findings take us on a voyage"\n'
    assert bilingual_dictionary.entry_translations(hindi) == ["यात्रा"]


def test_real_en_fr_dictionary(en_fr_pairs):
    pairs = set(en_fr_pairs)
    assert len(pairs) == len(en_fr_pairs) > 10000
    assert {("abbey", "abbaye"), ("abandon", "abandonner"), ("abbot", "abbé")} <= pairs
    assert all(src == src.lower() and tgt == tgt.lower() for src, tgt in pairs)
    assert all(" " not in src and " " not in tgt and src and tgt for src, tgt in pairs)
    assert not any(src.startswith("00database") for src, _ in pairs)


def test_vocab_filter_and_test_split(tmp_path):
    bible_dir = fetched_bible_dir()
    out, test_out = tmp_path / "en-fr.txt", tmp_path / "en-fr.test.txt"
    counts = bilingual_dictionary.build_dictionary("en-fr", out, vocab=bible_dir / "en.txt",
                                                   tgt_vocab=bible_dir / "fr.txt", test_size=100, test_out=test_out)
    train, test = load_muse_dictionary(out), load_muse_dictionary(test_out)
    assert counts["train"] == len(train) > 500 and counts["test"] == len(test)
    english = bilingual_dictionary.word_frequencies(bible_dir / "en.txt")
    french = bilingual_dictionary.word_frequencies(bible_dir / "fr.txt")
    assert all(src in english and tgt in french for src, tgt in train + test)
    test_sources = {src for src, _ in test}
    assert len(test_sources) == 100 and not test_sources & {src for src, _ in train}
    # the test words are the most frequent dictionary words of the corpus
    assert min(english[w] for w in test_sources) >= max(english[src] for src, _ in train)


def test_errors(tmp_path, capsys):
    with pytest.raises(XmlmError, match="no FreeDict package for 'en-xx'.*MUSE"):
        bilingual_dictionary.fetch_package("en-xx")
    with pytest.raises(SystemExit) as exit_info:
        freedict.main(["--pair", "en-fr", "--out", str(tmp_path / "d.txt"), "--test-size", "5"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().endswith("--test-size needs --vocab (the corpus that ranks source "
                                                    "words by frequency)")
    assert not (tmp_path / "d.txt").exists()
