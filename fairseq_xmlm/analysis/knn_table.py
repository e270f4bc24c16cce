"""xmlm-build-knn: the cross-lingual neighbour table of Dufter & Schuetze's knn-replace masking.

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

Table format: a `.pt` file of plain tensors, ints and strings (loads with `torch.load(weights_only=True)`):
  neighbours  LongTensor (dict_size, K): row i = ids of symbol i's K nearest neighbours in the other language,
              best first; -1 for symbols without a vector (specials, <mask>, symbols absent from the train data)
  dict_size   size of the task's full dictionary (dict.txt + <mask>; Fake-English: the doubled dictionary, where
              English symbol i has twin i + V)
  dict_md5    `vocabulary.dictionary_fingerprint` of that dictionary
  k, langs, method ("csls" or "nn")

The tasks read it with `tasks._shared_dictionary.load_knn_table`.
"""
import argparse
import os
import tempfile

import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, nearest_neighbours, unsupervised_mapping
from fairseq_xmlm.analysis.fasttext import train_fasttext
from fairseq_xmlm.errors import XmlmError, cli_errors
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


def save_table(table, out):
    """torch.save through a temporary file next to `out`: no half-written table is ever left."""
    replace_atomically(out, lambda tmp: torch.save(table, tmp))


def is_fake_english_data(data_dir):
    meta = read_meta(data_dir, required=False)
    return meta is not None and meta.get("task") == "fake_english"


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(prog="xmlm-build-knn", description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True, help="data-bin directory written by xmlm-prepare")
    parser.add_argument("--langs", default="en", help="two languages a,b; Fake-English: the one real language")
    parser.add_argument("--k", type=int, default=5, help="neighbours per symbol")
    parser.add_argument("--out", required=True, help="table file (.pt)")
    parser.add_argument("--fake-english", action="store_true",
                        help="English + Fake-English (default when meta.json says task fake_english)")
    parser.add_argument("--inv-order", action="store_true", help="Fake-English sentences reversed")
    parser.add_argument("--dim", type=int, default=300, help="fastText dimensions")
    parser.add_argument("--epochs", type=int, default=20,
                        help="fastText epochs (5, fastText's default, gives poorly aligned spaces on the Bible)")
    parser.add_argument("--threads", type=int, default=2, help="fastText threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--method", choices=("csls", "nn"), default="csls", help="neighbour retrieval")
    parser.add_argument("--init-vocab", type=int, default=4000, help="most frequent symbols for the VecMap init")
    parser.add_argument("--vocab-cutoff", type=int, default=20000, help="most frequent symbols for self-learning")
    parser.add_argument("--patience", type=int, default=50,
                        help="self-learning iterations without improvement before the keep probability grows")
    args = parser.parse_args(argv)
    langs = [lang for lang in args.langs.split(",") if lang]
    fake_english = args.fake_english or is_fake_english_data(args.data)
    if fake_english and len(langs) != 1:
        raise XmlmError(f"--fake-english takes one real language in --langs, got {args.langs!r}")
    if not fake_english and len(langs) != 2:
        raise XmlmError(f"--langs needs exactly two languages (a,b), got {args.langs!r}")
    if args.k < 1 or args.dim < 1 or args.epochs < 1:
        raise XmlmError("--k, --dim and --epochs must be positive")
    table = build_table(args.data, langs, args.k, fake_english, args.inv_order, args.dim, args.epochs, args.seed,
                        args.threads, args.method, init_vocab=args.init_vocab, vocab_cutoff=args.vocab_cutoff,
                        patience=args.patience)
    save_table(table, args.out)
    covered = int((table["neighbours"][:, 0] >= 0).sum())
    log(f"wrote {args.out}: {covered} of {table['dict_size']} symbols have {args.k} neighbours")


if __name__ == "__main__":
    main()
