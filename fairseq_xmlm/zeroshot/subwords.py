"""Word-level tasks (NER, parsing) read one encoder state per word: the state of the word's first subword."""
from fairseq_xmlm.errors import XmlmError


def first_subword_index(words, encode_piece_fn):
    """-> (pieces, first_index): the concatenated pieces of `words` and the position of each word's first piece.

    encode_piece_fn(word) returns the pieces (ids or strings) of one word as it appears inside a sentence (for
    sentencepiece: with the word-start marker, i.e. encoding the word alone). Positions index `pieces`; a caller
    that prepends `<s>` adds 1. A word that encodes to no piece cannot be represented and is an error.
    """
    pieces, first_index = [], []
    for position, word in enumerate(words):
        word_pieces = list(encode_piece_fn(word))
        if not word_pieces:
            raise XmlmError(f"word {position} ({word!r}) encodes to no subword piece")
        first_index.append(len(pieces))
        pieces.extend(word_pieces)
    return pieces, first_index
