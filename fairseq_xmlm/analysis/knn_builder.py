"""The cross-lingual neighbour table of Dufter & Schuetze's knn-replace masking (the library of
xmlm-build-knn, analysis/knn_table.py).

"We train static fastText embeddings on the training set and then project them into a common space using VecMap
(unsupervised)": per language, fastText skipgram vectors of the dictionary symbols are trained on the binarized
train split written back as piece strings (one sentence per line); `unsupervised_mapping` (alignment.py) maps the
first language into the second's space; every symbol gets its K nearest neighbours (CSLS by default) among the
symbols of the other language.

Languages: with `--fake-english` (automatic for a data-bin written by `xmlm-prepare fake-english`) the two
languages are English and Fake-English, whose corpus is the English one with every symbol w written `::w` (and
each sentence reversed with `--inv-order`); the fake vectors are trained with another seed, so the two spaces
differ as two real ones would. Otherwise `--langs a,b` names two languages of a shared dictionary; a symbol that
occurs in both languages' training data gets the neighbours of the language where its relative frequency is
higher.

Three or more languages (`--langs en,de,hi`, Dufter & Schuetze's Table 3: "one of the five nearest neighbors ...
from another language ... In case more than one other language is available we pick one randomly"): every
language is mapped into the first one's space; a symbol's row holds its K nearest neighbours in each other
language, languages in order (K (n - 1) columns), so the masker's uniform choice of a column picks a language
uniformly, then one of its K neighbours. `--vectors verse_ids` replaces the mapped fastText vectors by verse-ID
vectors of the verse-aligned training items (a symbol's set of verses; similarity the Dice coefficient, Levy et al.
2017): a cross-lingual signal the paper's unsupervised mapping does not use, for corpora where that mapping finds
no translations (`neighbour_agreement` measures it against the verse-ID neighbours).

Table format: a `.pt` file of plain tensors, ints and strings (loads with `torch.load(weights_only=True)`):
  neighbours  LongTensor (dict_size, K): row i = ids of symbol i's K nearest neighbours in the other language,
              best first; -1 for symbols without a vector (specials, <mask>, symbols absent from the train data)
  dict_size   size of the task's full dictionary (dict.txt + <mask>; Fake-English: the doubled dictionary, where
              English symbol i has twin i + V)
  dict_md5    `vocabulary.dictionary_fingerprint` of that dictionary
  k, langs, method ("csls" or "nn"); several languages: also vectors ("fasttext" or "verse_ids") and
  k_per_language

The tasks read it with `tasks._shared_dictionary.load_knn_table`.
"""
import os
import tempfile

import numpy as np
import scipy.sparse
import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, nearest_neighbours, unsupervised_mapping
from fairseq_xmlm.analysis.fasttext import train_fasttext
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log, read_meta, replace_atomically
from fairseq_xmlm.vocabulary import (TWIN_PREFIX, add_mask_symbol, dictionary_fingerprint, doubled_dictionary,
                                     load_data_dictionary, load_split_sentences)


def write_symbol_corpus(sentences, dictionary, path, prefix="", reverse=False):
    """One sentence per line as dictionary symbols, so fastText's words are exactly dictionary entries."""
    with open(path, "w", encoding="utf-8") as f:
        for ids in sentences:
            symbols = [prefix + dictionary[i] for i in ids.tolist()]
            f.write(" ".join(reversed(symbols) if reverse else symbols) + "\n")


def language_vectors(sentences, dictionary, symbol_ids, corpus_path, prefix, reverse, dim, epochs, seed, threads):
    """fastText vectors of one language -> (dictionary ids, vectors), rows by decreasing frequency, restricted to
    `symbol_ids` (the real symbols: no specials)."""
    write_symbol_corpus(sentences, dictionary, corpus_path, prefix, reverse)
    words, vectors = train_fasttext(corpus_path, dim, epochs, seed, threads)
    id_of = {prefix + dictionary[i]: i for i in symbol_ids}
    keep = [row for row, w in enumerate(words) if w in id_of]
    return torch.tensor([id_of[words[row]] for row in keep], dtype=torch.long), torch.from_numpy(vectors[keep])


def neighbour_table(languages, dict_size, k, method="csls", csls_k=10, **mapping_options):
    """languages: two (ids, vectors, owned) triples, vectors by decreasing frequency and `owned` a bool mask over
    ids saying which rows the table takes from this language. Maps language 0 into language 1's space and returns
    the (dict_size, k) table of neighbour ids in the other language (-1 where a symbol has no owned vector)."""
    (ids_a, vec_a, owned_a), (ids_b, vec_b, owned_b) = languages
    if min(len(ids_a), len(ids_b)) <= k:
        raise XmlmError(f"too few symbols with vectors ({len(ids_a)}, {len(ids_b)}) for {k} neighbours")
    wx, wy, _ = unsupervised_mapping(vec_a, vec_b, **mapping_options)
    mapped_a = iterative_normalize(vec_a, steps=1) @ wx
    mapped_b = iterative_normalize(vec_b, steps=1) @ wy
    table = torch.full((dict_size, k), -1, dtype=torch.long)
    table[ids_a[owned_a]] = ids_b[nearest_neighbours(mapped_a[owned_a], mapped_b, k, method, csls_k,
                                                     source_space=mapped_a)]
    table[ids_b[owned_b]] = ids_a[nearest_neighbours(mapped_b[owned_b], mapped_a, k, method, csls_k,
                                                     source_space=mapped_b)]
    return table


def relative_frequency_owners(sentences_by_lang, dict_size):
    """For every symbol, the language index in which it is relatively most frequent (shared dictionaries)."""
    freqs = torch.stack([torch.bincount(torch.cat(s), minlength=dict_size).double() / sum(len(x) for x in s)
                         for s in sentences_by_lang])
    return freqs.argmax(dim=0)


def build_table(data_dir, langs, k, fake_english=False, inv_order=False, dim=300, epochs=20, seed=1, threads=2,
                method="csls", csls_k=10, **mapping_options):
    """Everything but the file: returns the table dict described in the module docstring."""
    data_dictionary = add_mask_symbol(load_data_dictionary(data_dir))
    symbol_ids = [i for i in range(data_dictionary.nspecial, len(data_dictionary))
                  if data_dictionary[i] != "<mask>"]
    with tempfile.TemporaryDirectory(prefix="xmlm-knn-") as tmp:
        if fake_english:
            dictionary, v = doubled_dictionary(data_dictionary), len(data_dictionary)
            sentences = load_split_sentences(data_dir, "train", langs[0], data_dictionary)
            langs = [langs[0], "fake"]
            setups = [(sentences, "", False, seed), (sentences, TWIN_PREFIX, inv_order, seed + 1000)]
            shifts = [0, v]
        else:
            dictionary = data_dictionary
            setups = [(load_split_sentences(data_dir, "train", lang, data_dictionary), "", False, seed + n)
                      for n, lang in enumerate(langs)]
            shifts = [0, 0]
            owner = relative_frequency_owners([s[0] for s in setups], len(dictionary))
        languages = []
        for n, ((sentences, prefix, reverse, lang_seed), shift) in enumerate(zip(setups, shifts)):
            log(f"fastText: {langs[n]} skipgram, {dim} dims, {epochs} epochs, {len(sentences)} sentences")
            ids, vectors = language_vectors(sentences, data_dictionary, symbol_ids, os.path.join(tmp, f"{n}.txt"),
                                            prefix, reverse, dim, epochs, lang_seed, threads)
            owned = torch.ones(len(ids), dtype=torch.bool) if fake_english else owner[ids] == n
            languages.append((ids + shift, vectors, owned))
            log(f"fastText: {langs[n]} has vectors for {len(ids)} of {len(symbol_ids)} symbols")
    log(f"vecmap: unsupervised mapping {langs[0]} -> {langs[1]}")
    table = neighbour_table(languages, len(dictionary), k, method, csls_k, seed=seed, **mapping_options)
    return {"neighbours": table, "dict_size": len(dictionary), "dict_md5": dictionary_fingerprint(dictionary),
            "k": k, "langs": list(langs), "method": method}


def verse_incidence(sentences, ids):
    """Sparse (len(ids), verses) 0/1 matrix: which items of `sentences` (verse-aligned) hold each symbol of ids."""
    rows, cols = [], []
    for verse, sentence in enumerate(sentences):
        symbols = torch.unique(sentence)
        rows.append(symbols)
        cols.append(torch.full((len(symbols),), verse, dtype=torch.long))
    rows, cols = torch.cat(rows).numpy(), torch.cat(cols).numpy()
    row_of = np.full(int(max(rows.max(), ids.max())) + 1, -1)
    row_of[ids.numpy()] = np.arange(len(ids))
    keep = row_of[rows] >= 0
    return scipy.sparse.csr_matrix((np.ones(int(keep.sum()), dtype=np.float32), (row_of[rows[keep]], cols[keep])),
                                   shape=(len(ids), len(sentences)))


def dice_neighbours(incidence_a, incidence_b, k, chunk_rows=2048):
    """(rows of a, k) rows of b with the highest Dice coefficient 2 |A ∩ B| / (|A| + |B|) of their verse sets
    (Levy, Søgaard & Goldberg 2017), best first."""
    counts_a = np.asarray(incidence_a.sum(axis=1)).ravel()
    counts_b = np.asarray(incidence_b.sum(axis=1)).ravel()
    out = []
    for start in range(0, incidence_a.shape[0], chunk_rows):
        both = (incidence_a[start:start + chunk_rows] @ incidence_b.T).toarray()
        dice = 2 * both / (counts_a[start:start + chunk_rows, None] + counts_b[None, :])
        out.append(torch.from_numpy(dice).topk(k, dim=1).indices)
    return torch.cat(out)


def multilingual_table(languages, dict_size, k, neighbours):
    """languages: per language (ids, owned) with `owned` a bool mask over ids; neighbours(a, b) -> (owned rows of
    a, k) row indices into language b's ids. Returns the (dict_size, k (n - 1)) table: row of a symbol owned by
    language a = its k neighbours in every other language, languages in order (-1 for symbols of no language)."""
    table = torch.full((dict_size, k * (len(languages) - 1)), -1, dtype=torch.long)
    for a, (ids_a, owned_a) in enumerate(languages):
        table[ids_a[owned_a]] = torch.cat([ids_b[neighbours(a, b)] for b, (ids_b, _) in enumerate(languages)
                                           if b != a], dim=1)
    return table


def mapped_spaces(vectors, seed, **mapping_options):
    """Every language's normalised vectors mapped into the first one's space by the unsupervised mapping."""
    first = iterative_normalize(vectors[0], steps=1)
    spaces = [first]
    for other in vectors[1:]:
        wx, _, _ = unsupervised_mapping(other, vectors[0], seed=seed, **mapping_options)
        spaces.append(iterative_normalize(other, steps=1) @ wx)
    return spaces


def neighbour_agreement(table, reference, k):
    """Share of symbols (with neighbours in both tables) whose first neighbour in `reference`, in each other
    language, is among their k neighbours of that language in `table`; both tables with k columns per language."""
    hits, total = 0, 0
    for block in range(table.size(1) // k):
        ours = table[:, block * k:(block + 1) * k]
        first = reference[:, block * k]
        rows = (ours[:, 0] >= 0) & (first >= 0)
        hits += int((ours[rows] == first[rows, None]).any(dim=1).sum())
        total += int(rows.sum())
    return hits / max(total, 1)


def build_multilingual_table(data_dir, langs, k, vectors="fasttext", dim=300, epochs=20, seed=1, threads=2,
                             method="csls", csls_k=10, **mapping_options):
    """The table of three or more languages (module docstring); returns the table dict."""
    if vectors not in ("fasttext", "verse_ids"):
        raise XmlmError(f"unknown word vectors {vectors!r} (fasttext or verse_ids)")
    dictionary = add_mask_symbol(load_data_dictionary(data_dir))
    symbol_ids = [i for i in range(dictionary.nspecial, len(dictionary)) if dictionary[i] != "<mask>"]
    sentences = [load_split_sentences(data_dir, "train", lang, dictionary) for lang in langs]
    owner = relative_frequency_owners(sentences, len(dictionary))
    if vectors == "verse_ids":
        if len({len(s) for s in sentences}) != 1:
            raise XmlmError(f"verse-ID vectors need verse-aligned training items; {data_dir} has "
                            f"{', '.join(f'{lang} {len(s)}' for lang, s in zip(langs, sentences))}")
        ids = [torch.unique(torch.cat(s)) for s in sentences]
        ids = [i[torch.isin(i, torch.tensor(symbol_ids))] for i in ids]
        incidences = [verse_incidence(s, i) for s, i in zip(sentences, ids)]
        owned = [owner[i] == n for n, i in enumerate(ids)]
        log(f"verse IDs: {', '.join(f'{lang} {len(i)} symbols' for lang, i in zip(langs, ids))}, "
            f"{len(sentences[0])} verses")

        def neighbours(a, b):
            return dice_neighbours(incidences[a][owned[a].numpy()], incidences[b], k)
    else:
        ids, found = [], []
        with tempfile.TemporaryDirectory(prefix="xmlm-knn-") as tmp:
            for n, lang in enumerate(langs):
                log(f"fastText: {lang} skipgram, {dim} dims, {epochs} epochs, {len(sentences[n])} sentences")
                lang_ids, lang_vectors = language_vectors(sentences[n], dictionary, symbol_ids,
                                                          os.path.join(tmp, f"{n}.txt"), "", False, dim, epochs,
                                                          seed + n, threads)
                ids.append(lang_ids)
                found.append(lang_vectors)
        log(f"vecmap: unsupervised mapping of {', '.join(langs[1:])} into {langs[0]} space")
        spaces = mapped_spaces(found, seed, **mapping_options)
        owned = [owner[i] == n for n, i in enumerate(ids)]

        def neighbours(a, b):
            return nearest_neighbours(spaces[a][owned[a]], spaces[b], k, method, csls_k, source_space=spaces[a])
    if min(len(i) for i in ids) <= k:
        raise XmlmError(f"too few symbols with vectors ({', '.join(str(len(i)) for i in ids)}) for {k} neighbours")
    table = multilingual_table(list(zip(ids, owned)), len(dictionary), k, neighbours)
    return {"neighbours": table, "dict_size": len(dictionary), "dict_md5": dictionary_fingerprint(dictionary),
            "k": table.size(1), "k_per_language": k, "langs": list(langs), "vectors": vectors,
            "method": "dice" if vectors == "verse_ids" else method}


def save_table(table, out):
    """torch.save through a temporary file next to `out`: no half-written table is ever left."""
    replace_atomically(out, lambda tmp: torch.save(table, tmp))


def is_fake_english_data(data_dir):
    meta = read_meta(data_dir, required=False)
    return meta is not None and meta.get("task") == "fake_english"
