"""Rule-based sentence splitter for Bible verses (no trained model such as NLTK punkt is available offline).

A sentence ends at ".", "!" or "?" (optionally followed by closing quotes or brackets) when whitespace and then an
upper-case letter, an opening quote or an opening bracket follow, unless the word carrying the period is a known
abbreviation ("Mr.", "St.", ...) or a single initial ("J."). ";" and ":" never end a sentence: in Bible prose
they join clauses of one sentence ("And God said, Let there be light: and there was light."). Devanagari "।"
and the CJK full stops "。！？" end a sentence wherever they occur (those scripts have no case).
"""
import re

ABBREVIATIONS = frozenset(
    "mr mrs ms dr st jr sr vs etc cf viz ie eg al no vol ch chap ver gen ex lev num deut matt rom cor gal eph "
    "phil col thess tim heb pet rev".split())

# the end of a Latin-script sentence: terminator, optional closers, whitespace, then an upper-case-ish opener
LATIN_BOUNDARY = re.compile(r"""(?<=[.!?])(['")\]»”’]*)\s+(?=["'(\[«“‘¿¡]*[^\W\d_])""")
# scripts without case: split right after the terminator (and its closing quotes)
UNCASED_BOUNDARY = re.compile(r"""(?<=[।。！？])(["'”’」』）)]*)\s*(?=\S)""")


def _ends_with_abbreviation(text: str) -> bool:
    word = re.search(r"(\w+)\.$", text)
    if word is None:
        return False
    token = word.group(1)
    return token.lower() in ABBREVIATIONS or (len(token) == 1 and token.isupper())


def split_sentences(text: str) -> list[str]:
    """Split one line of text (e.g. a verse) into sentences; whitespace-only input gives []."""
    text = " ".join(text.split())
    if not text:
        return []
    pieces = []
    start = 0
    for match in LATIN_BOUNDARY.finditer(text):
        end = match.start() + len(match.group(1))
        candidate = text[start:end]
        follower = text[match.end():match.end() + 1]
        # lower-case after the gap means "...the man. and he" style prose, not a new sentence
        if _ends_with_abbreviation(candidate) or follower.islower():
            continue
        pieces.append(candidate)
        start = match.end()
    pieces.append(text[start:])
    sentences = []
    for piece in pieces:
        start = 0
        for match in UNCASED_BOUNDARY.finditer(piece):
            end = match.start() + len(match.group(1))
            sentences.append(piece[start:end])
            start = match.end()
        sentences.append(piece[start:])
    return [sentence.strip() for sentence in sentences if sentence.strip()]
