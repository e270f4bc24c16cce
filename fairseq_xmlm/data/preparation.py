"""Bible text -> Moses tokens -> sentencepiece pieces -> fairseq binary data in data-bin/NAME/ (the library of
xmlm-prepare, data/prepare.py).

`pair` prepares two (or more) real languages for Conneau et al.'s bilingual MLM in one of three subword modes,
their anchor conditions:
  joint     one sentencepiece model over all languages: shared pieces are anchors ("Default");
  separate  one model per language, vocabularies united: only pieces that happen to coincide are shared
            ("Default anchors" removed only by chance);
  prefixed  separate + a language prefix on every piece (`en:▁the`): no symbol is shared ("No anchors").
`fake-english` prepares Dufter & Schuetze's English data (BBE New Testament sentences; KJV Old Testament dev);
`fake-english-clauses` and `fake-english-indomain` derive from it a data-bin with the training sentences cut into
clauses, and one with an in-domain (BBE Old Testament) dev set.

Splits are by Bible book, one verse per item; only verses non-empty in every language are kept, so item k of
`valid.en` and of `valid.fr` is the same verse (its line number is line k of `verses.valid.txt`).
Everything is built in a temporary directory next to the target and renamed into place at the end.
"""
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from fairseq_xmlm.data import bible_verses
from fairseq_xmlm.data.codeswitch import code_switch, load_switch_dictionary
from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.data.sentences import split_sentences
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log, read_meta

MODES = ("joint", "separate", "prefixed")
SPLITS = ("train", "valid", "test")
# languages sacremoses has no rules for, or that have no spaces between words: sentencepiece segments them
UNTOKENIZED = {"zh", "ja"}
DEFAULT_VALID_BOOKS = "Ruth,Jonah,Philippians"
DEFAULT_TEST_BOOKS = "Esther,Lamentations,James"


# --- book ranges --------------------------------------------------------------------------------------------
def parse_books(spec: str) -> list[int]:
    """'Ruth,40-43,Jonah' -> sorted book numbers. Items: a number, a range a-b, or an English book name."""
    by_name = {name.lower(): number for number, name in bible_verses.BOOKS.items()}
    books = set()
    for item in filter(None, (part.strip() for part in spec.split(","))):
        if re.fullmatch(r"\d+-\d+", item):
            first, last = map(int, item.split("-"))
            numbers = range(first, last + 1)
        elif item.isdigit():
            numbers = [int(item)]
        elif item.lower() in by_name:
            numbers = [by_name[item.lower()]]
        else:
            raise XmlmError(f"unknown Bible book '{item}' (give a number 1-66, a range like 40-43, or a name)")
        for number in numbers:
            if number not in bible_verses.BOOKS:
                raise XmlmError(f"unknown Bible book number {number} (expected 1..66)")
            books.add(number)
    return sorted(books)


def split_verses(verse_books: list[int], texts: dict[str, list[str]], split_books: dict[str, list[int]]):
    """{split: [0-based verse indices]}: verses of the split's books that are non-empty in every language."""
    owner = {}
    for split, books in split_books.items():
        for book in books:
            if book in owner:
                raise XmlmError(f"book {bible_verses.BOOKS[book]} is in both {owner[book]} and {split}")
            owner[book] = split
    indices = {split: [] for split in split_books}
    for index, book in enumerate(verse_books):
        split = owner.get(book)
        if split is not None and all(lines[index].strip() for lines in texts.values()):
            indices[split].append(index)
    for split, kept in indices.items():
        if not kept:
            raise XmlmError(f"the {split} split has no verse non-empty in all languages")
    return indices


# --- tokenization -------------------------------------------------------------------------------------------
def moses_tokenize(lines: list[str], lang: str, lowercase: bool) -> list[str]:
    """Moses-tokenize (not for Chinese/Japanese) and optionally lowercase each line."""
    if lang in UNTOKENIZED:
        tokenized = [" ".join(line.split()) for line in lines]
    else:
        from sacremoses import MosesTokenizer

        tokenizer = MosesTokenizer(lang=lang)
        tokenized = [tokenizer.tokenize(line, escape=False, return_str=True) for line in lines]
    return [line.lower() for line in tokenized] if lowercase else tokenized


# A vocabulary smaller than the characters sentencepiece must keep (character_coverage: 99.95 % of a CJK text's
# character occurrences, every character of an alphabetic one) cannot be trained. Chinese needs about 2,800
# characters for the Bible alone, more than a small preset's vocabulary: such a vocabulary is raised to those
# characters plus CHARACTER_MARGIN of them for merges (frequent two-character words), with a logged note. Lowering
# the coverage instead would make hundreds of characters <unk> (2,000 symbols cover 99.5 % of the Chinese Bible's
# characters, 500 only 88 %), so verses would lose words; a vocabulary of characters and a few frequent words is
# also what Chinese BERT models use.
CHARACTER_MARGIN = 0.1


def train_sentencepiece(lines: list[str], model_prefix: Path, vocab_size: int, label: str,
                        model_type: str = "bpe") -> Path:
    """Train a sentencepiece model; an impossible vocabulary size becomes a clear XmlmError, one below the
    corpus's characters is raised to fit them (see CHARACTER_MARGIN).

    BPE is the default: both papers use BPE-like subwords (XLM's fastBPE; BERT's WordPiece), and on the small
    Basic-English New Testament a unigram model cannot even reach Dufter & Schuetze's 2048 pieces.
    """
    import sentencepiece as spm

    cjk = any(re.search(r"[\u3040-\u30ff\u3400-\u9fff]", line) for line in lines[:200])

    def train(size):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_prefix=str(model_prefix), vocab_size=size,
            model_type=model_type, character_coverage=0.9995 if cjk else 1.0, bos_id=-1, eos_id=-1,
            pad_id=-1, unk_id=0, num_threads=2, input_sentence_size=2_000_000, shuffle_input_sentence=True,
            minloglevel=2)

    size = vocab_size
    try:
        try:
            train(size)
        except RuntimeError as err:
            required = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
            if required is None:
                raise
            size = math.ceil(int(required.group(1)) * (1 + CHARACTER_MARGIN))
            log(f"sentencepiece: the {label} corpus needs {required.group(1)} symbols for its characters alone; "
                f"its vocabulary is raised from {vocab_size} to {size}")
            train(size)
    except RuntimeError as err:
        message = str(err).strip().splitlines()[-1]
        limit = re.search(r"Vocabulary size too high.*<= (\d+)", message)
        if limit:
            asked = f"--vocab-size {vocab_size}" if size == vocab_size else f"the raised vocabulary {size}"
            raise XmlmError(f"{asked} is too large for the {label} corpus "
                            f"(sentencepiece allows at most {limit.group(1)})") from None
        raise XmlmError(f"sentencepiece failed on the {label} corpus: {message}") from None
    return Path(f"{model_prefix}.model")


def vocabulary_size(model: Path) -> int:
    """Pieces of a trained sentencepiece model (more than asked for when its characters needed more)."""
    import sentencepiece as spm

    return spm.SentencePieceProcessor(model_file=str(model)).get_piece_size()


def encode_pieces(model: Path, lines: list[str], prefix: str = "") -> list[str]:
    """Lines of space-separated pieces; with `prefix` every piece becomes prefix+piece (no shared symbols)."""
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=str(model))
    return [" ".join(prefix + piece for piece in pieces) for pieces in processor.encode(lines, out_type=str)]


# --- binarization -------------------------------------------------------------------------------------------
def fairseq_preprocess_command() -> list[str]:
    """fairseq-preprocess run as a module of this interpreter: installs without console scripts (a --target
    install, a copied source tree) have the module but no `fairseq-preprocess` on PATH."""
    return [sys.executable, "-m", "fairseq_cli.preprocess"]


def run_fairseq_preprocess(arguments: list[str]) -> None:
    result = subprocess.run([*fairseq_preprocess_command(), *arguments], capture_output=True, text=True)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise XmlmError(f"fairseq-preprocess failed: {last}")


def binarize(work: Path, out: Path, pieces: dict[str, dict[str, list[str]]]) -> None:
    """pieces[lang][split] -> out/dict.txt (one dictionary over all train data) and out/<split>.<lang>.{bin,idx}.

    fairseq-preprocess starts slowly (it imports torch), so languages are binarized two per call with
    --joined-dictionary, which for one or two languages also builds the shared dictionary from their train data;
    with more languages the dictionary is built first over all of them (--dict-only) and passed as --srcdict.
    """
    text_dir = work / "pieces"
    text_dir.mkdir()
    for lang, by_split in pieces.items():
        for split, lines in by_split.items():
            (text_dir / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    langs = list(pieces)
    splits = list(pieces[langs[0]])
    dictionary = None
    if len(langs) > 2:
        log("fairseq-preprocess: building the shared dictionary")
        all_train = text_dir / "train.all"
        all_train.write_text("".join(line + "\n" for by_split in pieces.values() for line in by_split["train"]),
                             encoding="utf-8")
        run_fairseq_preprocess(["--only-source", "--dict-only", "--trainpref", str(all_train),
                                "--destdir", str(work / "dict"), "--workers", "1"])
        dictionary = out / "dict.txt"
        shutil.copy(work / "dict" / "dict.txt", dictionary)
    for first in range(0, len(langs), 2):
        group = langs[first:first + 2]
        log(f"fairseq-preprocess: binarizing {', '.join(group)} ({', '.join(splits)})")
        destination = work / f"bin.{'-'.join(group)}"
        arguments = ["--destdir", str(destination), "--dataset-impl", "mmap", "--workers", "2"]
        arguments += ["--srcdict", str(dictionary)] if dictionary else []
        if len(group) == 2:
            arguments += ["--source-lang", group[0], "--target-lang", group[1], "--joined-dictionary"]
            arguments += [arg for split in splits for arg in (f"--{split}pref", str(text_dir / split))]
            outputs = {(split, lang): f"{split}.{group[0]}-{group[1]}.{lang}" for split in splits for lang in group}
        else:
            arguments += ["--only-source"]
            arguments += [arg for split in splits for arg in (f"--{split}pref", str(text_dir / f"{split}.{group[0]}"))]
            outputs = {(split, group[0]): split for split in splits}
        run_fairseq_preprocess(arguments)
        for (split, lang), name in outputs.items():
            for suffix in ("bin", "idx"):
                os.replace(destination / f"{name}.{suffix}", out / f"{split}.{lang}.{suffix}")
        if dictionary is None:
            dictionary = out / "dict.txt"
            built = destination / ("dict.txt" if len(group) == 1 else f"dict.{group[0]}.txt")
            shutil.copy(built, dictionary)


# --- reports ------------------------------------------------------------------------------------------------
def count_dictionary(path: Path) -> int:
    """Symbols of the fairseq dictionary: the dict.txt entries plus the 4 specials <s> <pad> </s> <unk>."""
    with open(path, encoding="utf-8") as handle:
        return 4 + sum(1 for _ in handle)


def shared_symbols(pieces: dict[str, dict[str, list[str]]]) -> int:
    """Number of symbols that occur in the training data of every language (the anchor points)."""
    vocabularies = [{piece for line in by_split["train"] for piece in line.split()} for by_split in pieces.values()]
    return len(set.intersection(*vocabularies))


def write_reports(out: Path, name: str, pieces, extra: dict) -> dict:
    counts = {lang: {split: {"sentences": len(lines), "tokens": sum(len(line.split()) for line in lines)}
                     for split, lines in by_split.items()} for lang, by_split in pieces.items()}
    report = {"counts": counts, "dictionary_size": count_dictionary(out / "dict.txt"), **extra}
    if len(pieces) > 1:
        report["shared_symbols"] = shared_symbols(pieces)
    (out / "report.json").write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    rows = ["| lang | split | sentences | tokens |", "|---|---|---|---|"]
    rows += [f"| {lang} | {split} | {c['sentences']} | {c['tokens']} |"
             for lang, by_split in counts.items() for split, c in by_split.items()]
    summary = [f"- dictionary size (with the 4 fairseq specials): {report['dictionary_size']}"]
    if "shared_symbols" in report:
        summary.append(f"- symbols shared by all languages' training data (anchors): {report['shared_symbols']}")
    if "codeswitch" in report:
        summary.append(f"- code-switching: {json.dumps(report['codeswitch'])}")
    markdown = "\n".join([f"# Data report: {name}", "", *rows, "", *summary]) + "\n"
    (out / "report.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    return report


class OutputDirectory:
    """Build into a temporary sibling of `target`; rename into place on success, delete it on any error."""

    def __init__(self, target):
        self.target = Path(target)

    def __enter__(self) -> Path:
        self.target.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=self.target.parent))
        self.tmp.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary data directory
        return self.tmp

    def __exit__(self, exc_type, exc, tb):
        work = self.tmp / ".work"
        if work.exists():
            shutil.rmtree(work)
        if exc_type is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            return False
        if self.target.exists():
            old = self.target.with_name(f".{self.target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.target, old)
            os.replace(self.tmp, self.target)
            shutil.rmtree(old)
        else:
            os.replace(self.tmp, self.target)
        return False


# --- pair -----------------------------------------------------------------------------------------------------
def subword_pieces(out: Path, tokens: dict[str, dict[str, list[str]]], mode: str, vocab_size: int,
                   model_type: str = "bpe") -> tuple[dict, dict]:
    """Train sentencepiece (joint / per language) on train tokens, encode all splits; returns spm file names."""
    if mode == "joint":
        log(f"sentencepiece: joint model, vocabulary {vocab_size}")
        joint_train = [line for by_split in tokens.values() for line in by_split["train"]]
        model = train_sentencepiece(joint_train, out / "spm.joint", vocab_size, "+".join(tokens), model_type)
        models = {lang: model for lang in tokens}
    else:
        models = {}
        for lang, by_split in tokens.items():
            log(f"sentencepiece: {lang} model, vocabulary {vocab_size}")
            models[lang] = train_sentencepiece(by_split["train"], out / f"spm.{lang}", vocab_size, lang, model_type)
    pieces = {lang: {split: encode_pieces(models[lang], lines, f"{lang}:" if mode == "prefixed" else "")
                     for split, lines in by_split.items()} for lang, by_split in tokens.items()}
    return pieces, {lang: model.name for lang, model in models.items()}


def prepare_pair(corpus_dir, langs: list[str], mode: str, vocab_size: int, out, lowercase: bool = False,
                 valid_books: str = DEFAULT_VALID_BOOKS, test_books: str = DEFAULT_TEST_BOOKS,
                 train_books: str | None = None, codeswitch_dict=None, codeswitch_prob: float = 0.3,
                 codeswitch_max: float = 0.15, seed: int = 1, spm_type: str = "bpe") -> dict:
    """Prepare data-bin/NAME for bilingual MLM from verse-aligned corpus_dir/<lang>.txt; returns the report."""
    if mode not in MODES:
        raise XmlmError(f"unknown mode '{mode}' (expected one of {', '.join(MODES)})")
    if len(langs) < 2 or len(set(langs)) != len(langs):
        raise XmlmError(f"need at least two distinct languages, got {','.join(langs)}")
    for lang in langs:
        if lang not in {language for language, _ in bible_verses.VERSIONS.values()}:
            raise XmlmError(f"unknown language '{lang}' (see xmlm-fetch-bible --list)")
    if vocab_size < 10:
        raise XmlmError(f"--vocab-size {vocab_size} is too small")
    corpus_dir = Path(corpus_dir)
    texts = {lang: read_corpus(corpus_dir / f"{lang}.txt") for lang in langs}
    verse_books = [book for book, _, _ in bible_verses.read_verse_table(corpus_dir)]
    for lang, lines in texts.items():
        if len(lines) != len(verse_books):
            raise XmlmError(f"{corpus_dir / (lang + '.txt')} has {len(lines)} lines, verses.tsv {len(verse_books)}")
    held_out = {"valid": parse_books(valid_books), "test": parse_books(test_books)}
    train = parse_books(train_books) if train_books else [
        book for book in bible_verses.BOOKS if book not in held_out["valid"] + held_out["test"]]
    split_books = {"train": train, **held_out}
    indices = split_verses(verse_books, texts, split_books)
    # read before the slow steps, so that a broken dictionary is refused at once
    switch = load_switch_dictionary(codeswitch_dict) if codeswitch_dict is not None else None

    with OutputDirectory(out) as tmp:
        work = tmp / ".work"
        work.mkdir()
        for split, kept in indices.items():
            (tmp / f"verses.{split}.txt").write_text("".join(f"{index + 1}\n" for index in kept))
        tokens = {}
        for lang in langs:
            log(f"moses: tokenizing {lang}")
            tokens[lang] = {split: moses_tokenize([texts[lang][i] for i in kept], lang, lowercase)
                            for split, kept in indices.items()}
        extra = {}
        if switch is not None:
            extra["codeswitch"] = apply_codeswitching(tokens, switch, codeswitch_prob, codeswitch_max, seed)
        pieces, spm_files = subword_pieces(tmp, tokens, mode, vocab_size, spm_type)
        binarize(work, tmp, pieces)
        meta = {"langs": langs, "task": "bilingual_mlm", "mode": mode, "vocab_size": vocab_size,
                "vocab_size_per": "all languages" if mode == "joint" else "language", "spm_type": spm_type,
                "spm_vocab_sizes": {lang: vocabulary_size(tmp / name) for lang, name in spm_files.items()},
                "lowercase": lowercase,
                "spm": spm_files, "splits": {split: books for split, books in split_books.items()},
                "split_books": {split: [bible_verses.BOOKS[b] for b in books] for split, books in split_books.items()},
                "verses": {split: f"verses.{split}.txt" for split in SPLITS}, **extra}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        report = write_reports(tmp, Path(out).name, pieces, {"langs": langs, "mode": mode, **extra})
    return report


def apply_codeswitching(tokens, switch, prob: float, max_rate: float, seed: int) -> dict:
    """Code-switch the training tokens of the first two languages in place, both directions, with the switch
    dictionaries (first->second, second->first) of `load_switch_dictionary`; returns the stats."""
    first, second = list(tokens)[:2]
    forward, backward = switch
    stats = {}
    for lang, dictionary in ((first, forward), (second, backward)):
        log(f"code-switching {lang} training text (p={prob}, max {max_rate:.0%} of the words per chunk)")
        tokens[lang]["train"], stats[lang] = code_switch(tokens[lang]["train"], dictionary, prob, max_rate, seed,
                                                         lang=lang)
    return stats


# --- fake english -----------------------------------------------------------------------------------------------
def bible_sentences(lines: list[str], verse_books: list[int], books) -> list[str]:
    return [sentence for line, book in zip(lines, verse_books) if book in books for sentence in split_sentences(line)]


def prepare_fake_english(bible_dir, out, vocab_size: int = 2048, train_file: str = "en.txt",
                         valid_file: str = "en_kjv.txt", valid_size: int = 10000, lowercase: bool = False,
                         spm_type: str = "bpe") -> dict:
    """Dufter & Schuetze's English: BBE New Testament sentences (train), first KJV Old Testament sentences (dev)."""
    bible_dir = Path(bible_dir)
    verse_books = [book for book, _, _ in bible_verses.read_verse_table(bible_dir)]
    train_text = read_corpus(bible_dir / train_file)
    valid_text = read_corpus(bible_dir / valid_file)
    sentences = {"train": bible_sentences(train_text, verse_books, bible_verses.NEW_TESTAMENT),
                 "valid": bible_sentences(valid_text, verse_books, bible_verses.OLD_TESTAMENT)[:valid_size]}
    with OutputDirectory(out) as tmp:
        work = tmp / ".work"
        work.mkdir()
        log("moses: tokenizing en")
        tokens = {split: moses_tokenize(lines, "en", lowercase) for split, lines in sentences.items()}
        log(f"sentencepiece: en model, vocabulary {vocab_size}")
        model = train_sentencepiece(tokens["train"], tmp / "spm.en", vocab_size, "English New Testament", spm_type)
        pieces = {"en": {split: encode_pieces(model, lines) for split, lines in tokens.items()}}
        binarize(work, tmp, pieces)
        meta = {"langs": ["en"], "task": "fake_english", "vocab_size": vocab_size, "spm_type": spm_type,
                "lowercase": lowercase,
                "spm": {"en": model.name},
                "sources": {"train": f"{train_file}: New Testament, sentence-split",
                            "valid": f"{valid_file}: Old Testament, first {valid_size} sentences"}}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        report = write_reports(tmp, Path(out).name, pieces, {"langs": ["en"], "task": "fake_english"})
    return report


# Dufter & Schuetze's corpus has 17k sentences of median 12 words where BBE's New Testament has 8,732 of median 25
# (about the same words). Cut at clause punctuation into units of at least 8 words, BBE's gives 17,486 units of
# median 12 words (2026-11-29, the 2048-piece data-bin). Moses splits the punctuation off, so each is a piece.
CLAUSE_ENDS = ("▁,", "▁;", "▁:")
CLAUSE_MIN_WORDS = 8


def clause_units(ids, ends, word_starts, min_words):
    """One sentence's piece ids -> its clause units: cut after a clause punctuation piece (id in `ends`) once the
    unit holds `min_words` words (pieces where `word_starts[id]`, i.e. starting with ▁); a shorter tail joins the
    unit before it."""
    units, current, words = [], [], 0
    for piece in ids:
        current.append(piece)
        words += bool(word_starts[piece])
        if piece in ends and words >= min_words:
            units.append(current)
            current, words = [], 0
    if current:
        if units and words < min_words:
            units[-1] += current
        else:
            units.append(current)
    return units


def write_binarized(out: Path, split: str, sentences, dictionary) -> None:
    """Piece-id sequences -> out/{split}.en.{bin,idx}, as fairseq-preprocess binarizes a line (eos appended)."""
    import torch
    from fairseq.data import indexed_dataset

    prefix = out / f"{split}.en"
    builder = indexed_dataset.make_builder(f"{prefix}.bin", impl="mmap", vocab_size=len(dictionary))
    for ids in sentences:
        builder.add_item(torch.tensor([*map(int, ids), dictionary.eos()], dtype=torch.int32))
    builder.finalize(f"{prefix}.idx")


def derive_fake_english(data, out, splits: dict, sources: dict) -> None:
    """A copy of the Fake-English data-bin `data` (dictionary, sentencepiece model, the other splits) with `splits`
    ({split: piece-id sequences}) written anew; meta.json names them in its sources."""
    from fairseq_xmlm.vocabulary import load_data_dictionary

    data = Path(data)
    meta = read_meta(data)
    if meta.get("task") != "fake_english":
        raise XmlmError(f"{data} is no Fake-English data-bin (its meta.json says task {meta.get('task')!r})")
    dictionary = load_data_dictionary(data)
    with OutputDirectory(out) as tmp:
        for path in data.iterdir():
            replaced = any(path.name.startswith(f"{split}.") for split in splits)
            if path.is_file() and not replaced and not path.name.startswith("report."):
                shutil.copy2(path, tmp / path.name)
        for split, sentences in splits.items():
            write_binarized(tmp, split, sentences, dictionary)
        meta = {**meta, "derived_from": str(data.resolve()), "sources": {**meta.get("sources", {}), **sources}}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def prepare_fake_english_clauses(data, out, min_words: int = CLAUSE_MIN_WORDS) -> int:
    """`data`'s training sentences cut into clause units (`clause_units`); dictionary and dev set unchanged (so is
    a knn table built for `data`). Returns the number of units."""
    import numpy as np
    from fairseq_xmlm.vocabulary import load_data_dictionary, load_split_sentences

    if min_words < 1:
        raise XmlmError(f"--min-words must be at least 1, got {min_words}")
    dictionary = load_data_dictionary(data)
    ends = {dictionary.index(symbol) for symbol in CLAUSE_ENDS} - {dictionary.unk()}
    word_starts = np.array([dictionary[i].startswith("▁") for i in range(len(dictionary))])
    units = [unit for ids in load_split_sentences(data, "train", "en", dictionary)
             for unit in clause_units(ids.tolist(), ends, word_starts, min_words)]
    log(f"fake-english-clauses: {len(units)} units of at least {min_words} words")
    derive_fake_english(data, out, {"train": units},
                        {"train": f"the training sentences of {data} cut into clause units (at , ; :) of >= "
                                  f"{min_words} words"})
    return len(units)


def prepare_fake_english_indomain(data, bible_dir, out, size: int = 10000, train_file: str = "en.txt") -> int:
    """`data` with an in-domain dev set: the first `size` Old Testament sentences of the training translation (BBE),
    held out from the New Testament training text, tokenized and encoded as it was. Beside the KJV dev set it
    separates the translation's (and the BPE's) domain from the model: the 2048-piece BBE BPE cuts KJV into 1.45
    pieces a word. Returns the number of dev sentences."""
    from fairseq_xmlm.vocabulary import load_data_dictionary

    meta = read_meta(data)
    bible_dir = Path(bible_dir)
    verse_books = [book for book, _, _ in bible_verses.read_verse_table(bible_dir)]
    lines = bible_sentences(read_corpus(bible_dir / train_file), verse_books, bible_verses.OLD_TESTAMENT)[:size]
    if not lines:
        raise XmlmError(f"{bible_dir / train_file} has no Old Testament sentences")
    dictionary = load_data_dictionary(data)
    pieces = encode_pieces(Path(data) / meta["spm"]["en"], moses_tokenize(lines, "en", meta.get("lowercase", False)))
    sentences = [dictionary.encode_line(line, add_if_not_exist=False, append_eos=False) for line in pieces]
    derive_fake_english(data, out, {"valid": sentences},
                        {"valid": f"{train_file}: Old Testament, first {len(lines)} sentences (in-domain dev)"})
    return len(sentences)
