"""The word similarities of a parallel verse that Match aligns (`analysis/word_order.py`), from one of two kinds of
cross-lingual word vectors:

- `VerseIdDice` ("verse_ids"): a word's vector is the set of parallel verses it occurs in, and the similarity of
  an English and a foreign word the Dice coefficient of their sets, 2 |A ∩ B| / (|A| + |B|) (Levy, Søgaard &
  Goldberg 2017, "A strong baseline for learning cross-lingual word embeddings from sentence alignments"). The
  verse IDs are shared by all languages of the Bible, so the vectors need no mapping; they carry no position, so
  they favour no word order.
- `MappedFastText` ("fasttext"): fastText skipgram vectors per language (`analysis/fasttext.py`), the foreign ones
  mapped into English space by the unsupervised mapping (`analysis/alignment.py`, as xmlm-build-knn maps them);
  the similarity is the cosine.

Words: lowercased `segment.words` (Chinese segmented with jieba); Japanese, which `segment` leaves unsegmented,
as single characters.
"""
import numpy as np
import scipy.sparse
import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, unsupervised_mapping
from fairseq_xmlm.data.segment import words


def verse_words(text, label):
    """The words of one verse of the Bible `label` (a language, or language_suffix for another version)."""
    lang = label.split("_")[0]
    if lang == "ja":
        return [char for word in words(text.lower(), lang) for char in word]
    return words(text.lower(), lang)


def _incidence(verses):
    """({word: row}, sparse (words, verses) 0/1 matrix: which verses hold each word)."""
    vocabulary, rows, cols = {}, [], []
    for verse, tokens in enumerate(verses):
        for word in set(tokens):
            rows.append(vocabulary.setdefault(word, len(vocabulary)))
            cols.append(verse)
    matrix = scipy.sparse.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)),
                                     shape=(len(vocabulary), len(verses)))
    return vocabulary, matrix


class VerseIdDice:
    """Dice coefficients of verse-ID vectors; english_verses[k] and foreign_verses[k] are one verse's words."""

    def __init__(self, english_verses, foreign_verses):
        self.english_vocabulary, english = _incidence(english_verses)
        self.foreign_vocabulary, foreign = _incidence(foreign_verses)
        self.both = (english @ foreign.T).tocsr()  # (English words, foreign words): verses holding both
        self.english_counts = np.asarray(english.sum(axis=1)).ravel()
        self.foreign_counts = np.asarray(foreign.sum(axis=1)).ravel()

    def __call__(self, english_words, foreign_words):
        a = [self.english_vocabulary[word] for word in english_words]
        b = [self.foreign_vocabulary[word] for word in foreign_words]
        both = self.both[a][:, b].toarray()
        return 2 * both / (self.english_counts[a][:, None] + self.foreign_counts[b][None, :])


class MappedFastText:
    """Cosines of fastText vectors, the foreign language's mapped into English space; `english` and `foreign` are
    (words, vectors) with rows by decreasing frequency, as `train_fasttext` returns them."""

    def __init__(self, english, foreign, **mapping_options):
        (english_words, english_vectors), (foreign_words, foreign_vectors) = english, foreign
        wx, wy, _ = unsupervised_mapping(torch.as_tensor(foreign_vectors), torch.as_tensor(english_vectors),
                                         **mapping_options)
        self.english = _unit_rows(iterative_normalize(english_vectors, steps=1) @ wy)
        self.foreign = _unit_rows(iterative_normalize(foreign_vectors, steps=1) @ wx)
        self.english_row = {word: row for row, word in enumerate(english_words)}
        self.foreign_row = {word: row for row, word in enumerate(foreign_words)}

    def __call__(self, english_words, foreign_words):
        a = [self.english_row[word] for word in english_words]
        b = [self.foreign_row[word] for word in foreign_words]
        return self.english[a] @ self.foreign[b].T


def _unit_rows(matrix):
    matrix = matrix.double().numpy()
    return matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
