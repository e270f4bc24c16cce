"""Model input of the zero-shot heads: a sentence pair as one sequence, and a sentence of words with the position
of each word's first subword (the state a word-level head reads)."""
import torch

from fairseq_xmlm.zeroshot.subwords import first_subword_index


def pair_input(dictionary, first, second, max_tokens):
    """`<s> first </s> second </s>` of at most max_tokens; the longer side is shortened first."""
    first, second = list(first), list(second)
    while len(first) + len(second) + 3 > max_tokens:
        longer = first if len(first) >= len(second) else second
        longer.pop()
    return torch.tensor([dictionary.bos(), *first, dictionary.eos(), *second, dictionary.eos()])


def word_input(dictionary, words, word_ids, max_tokens):
    """-> (tokens `<s> pieces </s>`, first-subword position of each word that fits); a long sentence is cut."""
    pieces, first = first_subword_index(words, word_ids.__getitem__)
    pieces = pieces[: max_tokens - 2]
    positions = [index + 1 for index in first if index < len(pieces)]
    return torch.tensor([dictionary.bos(), *pieces, dictionary.eos()]), torch.tensor(positions, dtype=torch.long)
