"""The shared fairseq dictionary of a data-bin directory, and the raw sentences of its splits."""
import hashlib
import os

import torch
from fairseq.data import Dictionary, data_utils

from fairseq_xmlm.errors import XmlmError


def load_data_dictionary(data_dir):
    path = os.path.join(data_dir, "dict.txt")
    if not os.path.isfile(path):
        raise XmlmError(f"no dictionary at {path}: is {data_dir!r} a data-bin directory written by xmlm-prepare?")
    return Dictionary.load(path)


def add_mask_symbol(dictionary):
    """The MLM mask symbol, appended after the data's symbols as fairseq's masked_lm task does."""
    dictionary.add_symbol("<mask>")
    return dictionary


def dictionary_fingerprint(dictionary):
    """md5 of the symbol list: tables built for one dictionary (knn neighbours) are refused by another."""
    return hashlib.md5("\n".join(dictionary.symbols).encode("utf-8")).hexdigest()


def real_symbol_ids(dictionary, exclude=()):
    """Ids of the symbols that occur in the data (count > 0), minus specials and `exclude`."""
    exclude = set(exclude)
    return torch.tensor([i for i in range(dictionary.nspecial, len(dictionary))
                         if dictionary.count[i] > 0 and i not in exclude], dtype=torch.long)


def load_split_sentences(data_dir, split, lang, dictionary):
    """Piece ids of every item of `data_dir/{split}.{lang}`, without the eos fairseq-preprocess appends."""
    prefix = os.path.join(data_dir, f"{split}.{lang}")
    dataset = data_utils.load_indexed_dataset(prefix, dictionary, dataset_impl="mmap")
    if dataset is None:
        raise XmlmError(f"no binarized split {prefix}.{{bin,idx}} (languages and splits come from xmlm-prepare)")
    sentences = []
    for i in range(len(dataset)):
        ids = dataset[i].long()
        if len(ids) and ids[-1] == dictionary.eos():
            ids = ids[:-1]
        sentences.append(ids)
    if max(int(ids.max()) if len(ids) else -1 for ids in sentences) >= len(dictionary):
        raise XmlmError(f"{prefix} holds ids beyond its dictionary of {len(dictionary)} symbols: wrong dict.txt?")
    return sentences
