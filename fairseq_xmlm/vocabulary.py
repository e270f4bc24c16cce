"""The shared fairseq dictionary of a data-bin directory, and the raw sentences of its splits."""
import hashlib
import os

import numpy as np
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
    """Piece ids of every item of `data_dir/{split}.{lang}`, without the eos fairseq-preprocess appends, as views of
    one tensor. The binarized file is read in one piece: item by item, 1.4M sentences took 30 s."""
    prefix = os.path.join(data_dir, f"{split}.{lang}")
    dataset = data_utils.load_indexed_dataset(prefix, dictionary, dataset_impl="mmap")
    if dataset is None:
        raise XmlmError(f"no binarized split {prefix}.{{bin,idx}} (languages and splits come from xmlm-prepare)")
    sizes = np.asarray(dataset.sizes, dtype=np.int64)
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
