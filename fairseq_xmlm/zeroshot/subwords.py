"""Word-level tasks (NER, parsing) read one encoder state per word: the state of the word's first subword.

Also the text -> piece ids encoder that turns task files into model input the way pretraining data was made."""
import json
from pathlib import Path

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


class PieceEncoder:
    """Text -> dictionary ids exactly as the checkpoint's data-bin was made by xmlm-prepare: (lowercasing,) Moses
    tokens -> the language's sentencepiece model -> pieces (`<lang>:`-prefixed in `prefixed` mode) -> ids.

    Reads `meta.json` and `spm.*.model` of the pretraining data-bin; a piece the dictionary lacks becomes `<unk>`.
    """

    def __init__(self, data_dir, dictionary):
        self.data_dir = Path(data_dir)
        meta_path = self.data_dir / "meta.json"
        if not meta_path.is_file():
            raise XmlmError(f"{meta_path} not found: text can only be encoded for a data-bin written by xmlm-prepare")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        self.spm_files = meta.get("spm", {})
        self.prefixed = meta.get("mode") == "prefixed"
        self.lowercase = bool(meta.get("lowercase", False))
        self.dictionary = dictionary

    def _model(self, lang):
        if lang not in self.spm_files:
            raise XmlmError(f"no sentencepiece model for language {lang!r} in {self.data_dir / 'meta.json'} "
                            f"(it has {', '.join(self.spm_files) or 'none'})")
        path = self.data_dir / self.spm_files[lang]
        if not path.is_file():
            raise XmlmError(f"sentencepiece model {path} not found")
        return path

    def _ids(self, piece_lines):
        return [[self.dictionary.index(piece) for piece in line.split()] for line in piece_lines]

    def encode_sentences(self, lines, lang):
        """Raw sentences -> [piece ids] (no specials), tokenized as in pretraining."""
        from fairseq_xmlm.data.preparation import encode_pieces, moses_tokenize

        tokens = moses_tokenize(lines, lang, self.lowercase)
        return self._ids(encode_pieces(self._model(lang), tokens, f"{lang}:" if self.prefixed else ""))

    def encode_words(self, words, lang):
        """{word: piece ids} for already tokenized words (CoNLL / CoNLL-U), each encoded alone, i.e. word-initial.

        A word that sentencepiece maps to no piece (e.g. a lone zero-width character) becomes one `<unk>`, so that
        every word keeps a first-subword representation.
        """
        from fairseq_xmlm.data.preparation import encode_pieces

        unique = sorted(set(words))
        texts = [word.lower() for word in unique] if self.lowercase else unique
        encoded = self._ids(encode_pieces(self._model(lang), texts, f"{lang}:" if self.prefixed else ""))
        return {word: ids or [self.dictionary.unk()] for word, ids in zip(unique, encoded)}
