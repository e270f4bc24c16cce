"""The shared fairseq dictionary of a data-bin directory, its pieces and words, and the raw sentences of its splits.

A data-bin's `dict.txt` holds sentencepiece symbols: a piece that starts a word begins with `WORD_START` (`▁the`),
and xmlm-prepare's `prefixed` mode writes every symbol with its language (`en:▁the`). Fake-English doubles the
English dictionary: each symbol w gets a twin `TWIN_PREFIX + w` at id(w) + V.
"""
import hashlib
import os

import numpy as np
import torch
from fairseq.data import Dictionary, data_utils

from fairseq_xmlm.errors import XmlmError

WORD_START = "\u2581"  # sentencepiece's word-boundary mark
TWIN_PREFIX = "::"  # Fake-English's twin of symbol w is `::w`


def load_data_dictionary(data_dir):
    path = os.path.join(data_dir, "dict.txt")
    if not os.path.isfile(path):
        raise XmlmError(f"no dictionary at {path}: is {data_dir!r} a data-bin directory written by xmlm-prepare?")
    try:
        return Dictionary.load(path)
    except Exception as err:  # noqa: BLE001 (fairseq: a bare Exception for invalid UTF-8, ValueError for a bad line)
        raise XmlmError(f"{path} is not a fairseq dictionary: {' '.join(str(err).split())[:200]}") from None


def add_mask_symbol(dictionary):
    """The MLM mask symbol, appended after the data's symbols as fairseq's masked_lm task does."""
    dictionary.add_symbol("<mask>")
    return dictionary


def doubled_dictionary(english):
    """English symbols at [0, V), their twins `::w` at [V, 2V): twin id = English id + V."""
    doubled = Dictionary()  # starts with <s> <pad> </s> <unk> at 0..3, as `english` does
    for i in range(doubled.nspecial, len(english)):
        doubled.add_symbol(english[i], n=english.count[i])
    for i in range(len(english)):
        doubled.add_symbol(TWIN_PREFIX + english[i], n=english.count[i])
    if len(doubled) != 2 * len(english):
        raise XmlmError(f"the English dictionary holds a symbol twice: {len(english)} symbols doubled to "
                        f"{len(doubled)}")
    return doubled


def piece_text(task, lang, piece_id):
    """A dictionary symbol without the language prefix of xmlm-prepare's `prefixed` mode (`en:▁the`)."""
    symbol = task.dictionary[piece_id]
    prefix = f"{task.langs[lang]}:"
    return symbol[len(prefix):] if symbol.startswith(prefix) else symbol


def sentence_words(task, lang, ids):
    """Piece ids of one sentence -> [(word, [piece positions])]: the words `segment.words` finds in the sentence's
    text (its pieces joined, ▁ read as a space; jieba's words for Chinese), each with the positions of the pieces
    it overlaps. Special symbols (`<unk>`) read as a space."""
    from fairseq_xmlm.data.segment import word_spans

    texts = [" " if piece_id < task.dictionary.nspecial else piece_text(task, lang, piece_id).replace(WORD_START, " ")
             for piece_id in ids.tolist()]
    text, starts = "".join(texts), np.cumsum([0] + [len(piece) for piece in texts])
    words = []
    for start, end in word_spans(text, task.langs[lang]):
        first, last = np.searchsorted(starts, start, "right") - 1, np.searchsorted(starts, end, "left")
        words.append((text[start:end], list(range(int(first), int(last)))))
    return words


def dictionary_fingerprint(dictionary):
    """md5 of the symbol list: tables built for one dictionary (knn neighbours) are refused by another."""
    return hashlib.md5("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()


def real_symbol_ids(dictionary, exclude=()):
    """Ids of the symbols that occur in the data (count > 0), minus specials and `exclude`."""
    exclude = set(exclude)
    return torch.tensor([i for i in range(dictionary.nspecial, len(dictionary))
                         if dictionary.count[i] > 0 and i not in exclude], dtype=torch.long)


def load_split_sentences(data_dir, split, lang, dictionary):
    """Piece ids of every item of `data_dir/{split}.{lang}`, without the eos fairseq-preprocess appends, as views of
    one tensor. The binarized file is read in one piece: item by item, 1.4M sentences took 30 s."""
    prefix = os.path.join(data_dir, f"{split}.{lang}")
    try:
        dataset = data_utils.load_indexed_dataset(prefix, dictionary, dataset_impl="mmap")
    except Exception as err:  # noqa: BLE001 (a damaged index: fairseq asserts, numpy cannot map an empty file, ...)
        raise XmlmError(f"cannot read the binarized split {prefix}.{{bin,idx}} ({type(err).__name__}: "
                        f"{' '.join(str(err).split())[:120]}): rebuild it with xmlm-prepare") from None
    if dataset is None:
        raise XmlmError(f"no binarized split {prefix}.{{bin,idx}} (languages and splits come from xmlm-prepare)")
    sizes = np.asarray(dataset.sizes, dtype=np.int64)
    needed = int(sizes.sum()) * np.dtype(dataset._index.dtype).itemsize
    if len(dataset._bin_buffer) < needed:
        raise XmlmError(f"{prefix}.bin is truncated: {len(dataset._bin_buffer)} bytes, its index needs {needed} "
                        "(rebuild it with xmlm-prepare)")
    # an MMapIndexedDataset keeps its items back to back, in order, in one memory-mapped buffer
    flat = torch.from_numpy(np.frombuffer(dataset._bin_buffer, dtype=dataset._index.dtype,
                                          count=int(sizes.sum())).astype(np.int64))
    last, nonempty = np.cumsum(sizes) - 1, sizes > 0
    ends_in_eos = np.zeros(len(sizes), dtype=bool)
    ends_in_eos[nonempty] = (flat[last[nonempty]] == dictionary.eos()).numpy()
    keep = torch.ones(len(flat), dtype=torch.bool)
    keep[last[ends_in_eos]] = False
    flat = flat[keep]
    if len(flat) and int(flat.max()) >= len(dictionary):
        raise XmlmError(f"{prefix} holds ids beyond its dictionary of {len(dictionary)} symbols: wrong dict.txt?")
    return list(flat.split((sizes - ends_in_eos).tolist()))


def join_sentences(sentences, separator):
    """One 1-D tensor: every sentence followed by `separator`, built without a per-sentence loop over tensors."""
    lengths = torch.tensor([len(s) for s in sentences], dtype=torch.long) + 1
    flat = torch.full((int(lengths.sum()),), separator, dtype=torch.long)
    is_token = torch.ones(len(flat), dtype=torch.bool)
    is_token[torch.cumsum(lengths, 0) - 1] = False
    if len(sentences):
        flat[is_token] = torch.cat(sentences).long()
    return flat
