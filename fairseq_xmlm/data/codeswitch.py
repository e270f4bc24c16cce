"""Dictionary code-switching: extra anchor points by replacing words with their dictionary translations.

Conneau et al. (sec. 4) add anchors by code-switching the training text: a word of language A that is in an
A->B dictionary is replaced by one of its translations with probability `prob`. We also cap the replacements at
`max_rate` of the words of a "batch", taken as a chunk of `chunk_lines` consecutive lines (default 1000; our
preparation is offline, so there is no real training batch): in a chunk, every dictionary word is drawn with
probability `prob`, and if more than `max_rate` x (words in the chunk) are drawn, a uniform random subset of that
size is kept. A translation is drawn uniformly, or proportionally to the dictionary's third column (weights).
Lookup is exact first, then lowercased; a capitalised word gets a capitalised translation. Lines are split into
tokens by `segment.split_tokens`: on whitespace, or for Chinese into jieba's words.
"""
import random

from fairseq_xmlm.data.segment import join_tokens, split_tokens
from fairseq_xmlm.errors import XmlmError

Dictionary = dict[str, tuple[list[str], list[float]]]


def build_switch_dictionary(entries, invert: bool = False) -> Dictionary:
    """(src, tgt[, weight]) entries -> {word: ([translations], [weights])}; `invert` maps tgt -> src."""
    table: dict[str, dict[str, float]] = {}
    for entry in entries:
        src, tgt = entry[:2]
        weight = float(entry[2]) if len(entry) > 2 else 1.0
        if invert:
            src, tgt = tgt, src
        if src != tgt:
            options = table.setdefault(src, {})
            options[tgt] = options.get(tgt, 0.0) + weight
    return {word: (list(options), list(options.values())) for word, options in table.items()}


def load_switch_dictionary(path) -> tuple[Dictionary, Dictionary]:
    """A MUSE file (src tgt [weight]) -> (src->tgt, tgt->src) switch dictionaries."""
    from fairseq_xmlm.data.muse import load_muse_dictionary

    entries = load_muse_dictionary(path, with_weights=True)
    return build_switch_dictionary(entries), build_switch_dictionary(entries, invert=True)


def _translation(word: str, dictionary: Dictionary, rng: random.Random) -> str:
    key = word if word in dictionary else word.lower()
    options, weights = dictionary[key]
    choice = rng.choices(options, weights=weights)[0]
    return choice[:1].upper() + choice[1:] if key != word and word[:1].isupper() else choice


def code_switch(lines: list[str], dictionary: Dictionary, prob: float = 0.3, max_rate: float = 0.15,
                seed: int = 1, chunk_lines: int = 1000, lang: str | None = None) -> tuple[list[str], dict]:
    """Replace dictionary words of Moses-tokenized `lines` of language `lang`; returns (new lines, stats).

    stats: words, candidates (words found in the dictionary), replaced, rate = replaced / words.
    """
    if not 0.0 <= prob <= 1.0 or not 0.0 <= max_rate <= 1.0:
        raise XmlmError(f"code-switching probability {prob} and max rate {max_rate} must lie in [0, 1]")
    if not dictionary:
        raise XmlmError("the code-switching dictionary is empty")
    rng = random.Random(seed)
    tokens = [split_tokens(line, lang) for line in lines]
    words = candidates = replaced = 0
    for start in range(0, len(tokens), chunk_lines):
        chunk = tokens[start:start + chunk_lines]
        positions = [(i, j) for i, line in enumerate(chunk) for j, word in enumerate(line)
                     if word in dictionary or word.lower() in dictionary]
        chunk_words = sum(len(line) for line in chunk)
        drawn = [position for position in positions if rng.random() < prob]
        budget = int(max_rate * chunk_words)
        if len(drawn) > budget:
            drawn = rng.sample(drawn, budget)
        for i, j in drawn:
            chunk[i][j] = _translation(chunk[i][j], dictionary, rng)
        words += chunk_words
        candidates += len(positions)
        replaced += len(drawn)
    stats = {"words": words, "candidates": candidates, "replaced": replaced,
             "rate": replaced / words if words else 0.0, "prob": prob, "max_rate": max_rate,
             "chunk_lines": chunk_lines}
    return [join_tokens(line, lang) for line in tokens], stats
