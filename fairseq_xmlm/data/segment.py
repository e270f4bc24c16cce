"""Words of a text, for the word-level measures (dictionaries, word translation, contextual alignment,
code-switching).

A word is a maximal run of letters, digits, apostrophes and hyphens: whitespace and punctuation separate words
(Moses-tokenized text already has spaces around punctuation). Chinese is written without spaces, so there a run
would be a whole clause: Chinese text is segmented with jieba (its default dictionary and HMM for unknown words;
deterministic), and a word is a jieba token holding at least one letter or digit (punctuation tokens are dropped).
"""
import functools
import re

SEGMENTED = {"zh"}  # languages written without spaces between words: segmented by jieba
WORD = re.compile(r"[\w'’-]+")
_HAS_WORD_CHARACTER = re.compile(r"\w")
# one Han character (CJK unified ideographs, their extensions A-F and compatibility ideographs)
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]")


@functools.cache
def _jieba():
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # jieba 0.42 imports the deprecated pkg_resources
        import jieba
    jieba.setLogLevel(logging.WARNING)  # not the "Building prefix dict" lines on every first use
    return jieba.Tokenizer()


def word_spans(text, lang):
    """[(start, end)] character offsets of the words of `text` in language `lang`, in order."""
    if lang in SEGMENTED:
        return [(start, end) for token, start, end in _jieba().tokenize(text) if _HAS_WORD_CHARACTER.search(token)]
    return [match.span() for match in WORD.finditer(text)]


def words(text, lang):
    """The words of `text` in language `lang` (see the module docstring)."""
    return [text[start:end] for start, end in word_spans(text, lang)]


def split_tokens(text, lang):
    """Every token of a Moses-tokenized line, punctuation included: whitespace-separated, or jieba's tokens
    (whitespace dropped) for a segmented language. `join_tokens` puts them back together."""
    if lang in SEGMENTED:
        return [token for token, _, _ in _jieba().tokenize(text) if not token.isspace()]
    return text.split()


def join_tokens(tokens, lang):
    """The line of `tokens`: space-separated, or for a segmented language concatenated, except that a token which
    is not written in the language's script (a code-switched English word) keeps a space on each side."""
    if lang not in SEGMENTED:
        return " ".join(tokens)
    return " ".join("".join(token if _han_script(token) else f" {token} " for token in tokens).split())


def _han_script(token):
    """True unless the token holds a Latin, Cyrillic or other alphabetic letter: Han characters and punctuation."""
    return not any(char.isalpha() and not HAN.match(char) for char in token)
