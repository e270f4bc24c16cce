"""Readers for the three zero-shot evaluation formats: XNLI TSV, CoNLL / WikiAnn BIO, CoNLL-U (UD v2).

Every reader returns plain Python records and raises `XmlmError("FILE:LINE: problem")` on a malformed line, so a
broken download is reported where it is broken instead of surfacing later as a shape error. `READERS` maps each
zero-shot task to its file reader for one language (XNLI rows filtered by language, WikiAnn's word prefix dropped).
"""
import dataclasses
import re

from fairseq_xmlm.errors import XmlmError

NLI_LABELS = ("entailment", "neutral", "contradiction")
# XNLI-MT's English training file (multinli.train.en.tsv) spells the third label "contradictory".
_NLI_LABEL_ALIASES = {"contradictory": "contradiction"}
# Column names used by the XNLI dev/test release (sentence1/sentence2/gold_label) and by XNLI-MT (premise/hypo/label).
_PREMISE_COLUMNS = ("sentence1", "premise")
_HYPOTHESIS_COLUMNS = ("sentence2", "hypothesis", "hypo")
_LABEL_COLUMNS = ("gold_label", "label")

_BIO_TAG = re.compile(r"^(O|[BI]-\S+)$")


@dataclasses.dataclass(frozen=True)
class NliExample:
    language: str | None
    premise: str
    hypothesis: str
    label: str


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
    words: list[str]
    tags: list[str]


@dataclasses.dataclass(frozen=True)
class DependencySentence:
    """One UD sentence; word i (1-based in the file) sits at index i-1, heads use the file's numbering (0 = root)."""

    words: list[str]
    upos: list[str]
    heads: list[int]
    rels: list[str]
    comments: list[str]


def _read_lines(path):
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        raise XmlmError(f"{path}: no such file") from None
    except UnicodeDecodeError as err:
        raise XmlmError(f"{path}: not valid UTF-8 ({err.reason} at byte {err.start})") from None


def _first_present(columns, names, path, what):
    for name in names:
        if name in columns:
            return columns.index(name)
    raise XmlmError(f"{path}:1: header has no {what} column (looked for {', '.join(names)})")


def read_xnli_tsv(path, language=None):
    """Read an XNLI release TSV (header row; tab-separated; no quoting) into NliExample records.

    `language` keeps only rows whose `language` column equals it (files without that column have language None).
    """
    lines = _read_lines(path)
    if not lines:
        raise XmlmError(f"{path}: empty file")
    columns = lines[0].split("\t")
    premise_col = _first_present(columns, _PREMISE_COLUMNS, path, "premise")
    hypothesis_col = _first_present(columns, _HYPOTHESIS_COLUMNS, path, "hypothesis")
    label_col = _first_present(columns, _LABEL_COLUMNS, path, "label")
    language_col = columns.index("language") if "language" in columns else None
    examples = []
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != len(columns):
            raise XmlmError(f"{path}:{number}: {len(fields)} tab-separated fields, the header has {len(columns)}")
        label = _NLI_LABEL_ALIASES.get(fields[label_col], fields[label_col])
        if label not in NLI_LABELS:
            raise XmlmError(f"{path}:{number}: unknown label {fields[label_col]!r} (expected one of {NLI_LABELS})")
        row_language = fields[language_col] if language_col is not None else None
        if language is not None and row_language != language:
            continue
        examples.append(NliExample(row_language, fields[premise_col], fields[hypothesis_col], label))
    if language is not None and not examples:
        raise XmlmError(f"{path}: no rows for language {language!r}")
    return examples


def read_bio(path, token_prefix=None):
    """Read a CoNLL-2003 or WikiAnn file: one `TOKEN ... TAG` line per word, blank lines between sentences.

    The first whitespace field is the word and the last is its BIO tag; middle fields (POS, chunk) are ignored.
    `-DOCSTART-` lines are document separators, not words. WikiAnn writes words as `en:Paris`; pass
    `token_prefix="en:"` to require and strip that prefix.
    """
    sentences = []
    words, tags = [], []

    def close_sentence():
        if words:
            sentences.append(TaggedSentence(list(words), list(tags)))
            words.clear()
            tags.clear()

    for number, line in enumerate(_read_lines(path), start=1):
        fields = line.split()
        if not fields:
            close_sentence()
            continue
        if fields[0] == "-DOCSTART-":
            close_sentence()
            continue
        if len(fields) < 2:
            raise XmlmError(f"{path}:{number}: expected 'WORD ... TAG', got one field {line.strip()!r}")
        word, tag = fields[0], fields[-1]
        if not _BIO_TAG.match(tag):
            raise XmlmError(f"{path}:{number}: {tag!r} is not a BIO tag (O, B-TYPE or I-TYPE)")
        if token_prefix is not None:
            if not word.startswith(token_prefix) or word == token_prefix:
                raise XmlmError(f"{path}:{number}: word {word!r} lacks the prefix {token_prefix!r}")
            word = word[len(token_prefix):]
        words.append(word)
        tags.append(tag)
    close_sentence()
    if not sentences:
        raise XmlmError(f"{path}: no tagged sentences")
    return sentences


def _parse_conllu_word(fields, path, number, expected_id):
    word_id, form, _lemma, upos, _xpos, _feats, head, deprel = fields[:8]
    if word_id != str(expected_id):
        raise XmlmError(f"{path}:{number}: word ID {word_id!r}, expected {expected_id}")
    if not head.isdigit():
        raise XmlmError(f"{path}:{number}: HEAD {head!r} is not a non-negative integer")
    if deprel in ("", "_"):
        raise XmlmError(f"{path}:{number}: word {word_id} has no DEPREL")
    return form, upos, int(head), deprel


def read_conllu(path):
    """Read a CoNLL-U file (UD v2) into DependencySentence records of its syntactic words.

    Comment lines (`# text = ...`) are kept per sentence; multiword token lines (`1-2`) and empty nodes (`3.1`)
    are skipped: the basic tree is defined on the integer-ID words only.
    """
    sentences = []
    words, upos, heads, rels, comments = [], [], [], [], []
    head_lines = []

    def close_sentence():
        if not words:
            if comments:
                raise XmlmError(f"{path}:{number}: sentence has comments but no words")
            return
        for head, line_number in zip(heads, head_lines):
            if head > len(words):
                raise XmlmError(f"{path}:{line_number}: HEAD {head} is beyond the sentence's {len(words)} words")
        sentences.append(DependencySentence(list(words), list(upos), list(heads), list(rels), list(comments)))
        for part in (words, upos, heads, rels, comments, head_lines):
            part.clear()

    number = 0
    for number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            close_sentence()
            continue
        if line.startswith("#"):
            comments.append(line)
            continue
        fields = line.split("\t")
        if len(fields) != 10:
            raise XmlmError(f"{path}:{number}: {len(fields)} tab-separated fields, CoNLL-U has 10")
        word_id = fields[0]
        if re.fullmatch(r"\d+-\d+", word_id) or re.fullmatch(r"\d+\.\d+", word_id):
            continue
        form, tag, head, rel = _parse_conllu_word(fields, path, number, len(words) + 1)
        words.append(form)
        upos.append(tag)
        heads.append(head)
        rels.append(rel)
        head_lines.append(number)
    close_sentence()
    if not sentences:
        raise XmlmError(f"{path}: no sentences")
    return sentences


def read_nli(path, lang):
    """XNLI rows of `lang`: a file with a language column is filtered, one without is taken whole."""
    examples = read_xnli_tsv(path)
    if any(example.language is not None for example in examples):
        examples = read_xnli_tsv(path, language=lang)
    return examples


def read_tagged(path, lang):
    """BIO sentences; WikiAnn's `<lang>:` word prefix is stripped when every word carries it."""
    sentences = read_bio(path)
    if all(word.startswith(f"{lang}:") for sentence in sentences for word in sentence.words):
        sentences = read_bio(path, token_prefix=f"{lang}:")
    return sentences


def read_dependencies(path, lang):
    """CoNLL-U sentences (the file's language needs no filter; `lang` keeps the readers' common signature)."""
    return read_conllu(path)


READERS = {"xnli": read_nli, "ner": read_tagged, "parse": read_dependencies}
