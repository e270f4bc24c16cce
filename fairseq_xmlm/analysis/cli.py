"""xmlm-analyze: Section 5 of Conneau et al. 2020 on our checkpoints, each subcommand writing JSON and a PNG.

  sentence  per layer, mean-pooled sentence vectors (specials excluded) of parallel sentences under model A
            (language A) and model B (language B); after iterative normalisation, Procrustes on the first
            --n-train pairs, P@1 retrieval (cosine) of the held-out pairs in both directions.
  word      word translation P@1 (CSLS, k=10) after Procrustes learned on the train part of a MUSE dictionary
            (iterative normalisation first): non-contextual (embedding rows of words that are one piece),
            contextual (per layer, each word's vectors averaged over its occurrences in --max-sentences sentences,
            pieces of a word averaged) and a fastText baseline trained on the same words, same vocabulary.
  cka       per layer, linear CKA of the same mean-pooled vectors, plus a randomly initialised encoder of model B's
            architecture as a lower bound; a heatmap like the paper's Figure 7 and the Pearson correlation between
            CKA and sentence retrieval across layers.

Model B defaults to model A: then the two "models" are the two languages of one bilingual model. Sentences come
from each model's task (`task.load_split_sentences`, `task.sentence_input`), so item k must be the same verse in
both (xmlm-prepare keeps splits verse-aligned; Fake-English is parallel by construction).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch

from fairseq_xmlm.analysis.alignment import (iterative_normalize, nearest_neighbours, procrustes,
                                             translation_accuracy)
from fairseq_xmlm.analysis.cka import linear_cka
from fairseq_xmlm.errors import XmlmError, cli_errors


def log(message):
    print(message, file=sys.stderr, flush=True)


# ---- math on pooled vectors (plain functions, tested directly) ----
def sentence_retrieval(vectors_a, vectors_b, n_train):
    """Procrustes on the first n_train pairs (after iterative normalisation), P@1 on the rest, both ways."""
    if not 0 < n_train < len(vectors_a):
        raise XmlmError(f"--n-train {n_train} must leave held-out sentences (have {len(vectors_a)})")
    a, b = iterative_normalize(vectors_a), iterative_normalize(vectors_b)
    w = procrustes(a[:n_train], b[:n_train])
    held_a, held_b = a[n_train:], b[n_train:]
    truth = torch.arange(len(held_a), device=held_a.device)
    return {"a_to_b": (nearest_neighbours(held_a @ w, held_b)[:, 0] == truth).float().mean().item(),
            "b_to_a": (nearest_neighbours(held_b @ w.T, held_a)[:, 0] == truth).float().mean().item()}


def read_muse_dictionary(path):
    """MUSE lines `src tgt` -> list of (src, tgt) word pairs."""
    if not os.path.isfile(path):
        raise XmlmError(f"dictionary {path} does not exist")
    with open(path, encoding="utf-8") as f:
        pairs = [tuple(line.split()[:2]) for line in f if len(line.split()) >= 2]
    if not pairs:
        raise XmlmError(f"dictionary {path} holds no `src tgt` lines")
    return pairs


def word_translation(vectors_a, vectors_b, train_pairs, test_pairs, label):
    """vectors_*: {word: 1-D tensor}. Procrustes on the train pairs both sides have, CSLS P@1 on the test ones."""
    words_a, words_b = sorted(vectors_a), sorted(vectors_b)
    row_a, row_b = {w: i for i, w in enumerate(words_a)}, {w: i for i, w in enumerate(words_b)}
    usable = lambda pairs: [(row_a[s], row_b[t]) for s, t in pairs if s in row_a and t in row_b]
    train, test = usable(train_pairs), usable(test_pairs)
    if not train or not test:
        raise XmlmError(f"{label}: no dictionary pair has both words in the vocabulary "
                        f"({len(train)} train, {len(test)} test pairs usable)")
    x = iterative_normalize(torch.stack([vectors_a[w] for w in words_a]))
    y = iterative_normalize(torch.stack([vectors_b[w] for w in words_b]))
    train = torch.tensor(train)
    w = procrustes(x[train[:, 0]], y[train[:, 1]])
    p1 = translation_accuracy(x @ w, y, test, method="csls", ks=(1,), csls_k=10)[1]
    return {"p1": p1, "train_pairs": len(train), "test_pairs": len(test)}


def pearson(xs, ys):
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if len(xs) < 2 or xs.std() == 0 or ys.std() == 0:
        return float("nan")
    return float(np.corrcoef(xs, ys)[0, 1])


# ---- model side ----
def pooled_layers(model, task, lang, sentences, max_tokens=8192):
    """Mean-pooled (specials excluded) vectors of every layer: list of (n, D) float tensors, layer 0 first."""
    from fairseq_xmlm.evaluation.multilinguality import length_batches, mean_pool, pad_batch

    inputs = [task.sentence_input(ids, lang) for ids in sentences]
    device = next(model.parameters()).device
    specials = torch.tensor(sorted(task.special_ids), dtype=torch.long, device=device)
    pad = task.dictionary.pad()
    pooled, order = None, []
    with torch.no_grad():
        for batch in length_batches([len(x) for x in inputs], max_tokens):
            tokens = pad_batch([inputs[k] for k in batch], pad).to(device)
            states = model.encode_layers(tokens, torch.full((len(batch),), lang, dtype=torch.long, device=device))
            keep = ~torch.isin(tokens, specials)
            vectors = [mean_pool(s, keep).float() for s in states]
            pooled = [[] for _ in vectors] if pooled is None else pooled
            for layer, v in enumerate(vectors):
                pooled[layer].append(v)
            order.extend(batch)
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order)] = torch.arange(len(order))
    return [torch.cat(chunks)[inverse.to(device)] for chunks in pooled]


WORD_START = "\u2581"  # sentencepiece's word-boundary mark


def piece_text(task, lang, piece_id):
    """A dictionary symbol without the language prefix of xmlm-prepare's `prefixed` mode (`en:▁the`)."""
    symbol = task.dictionary[piece_id]
    prefix = f"{task.langs[lang]}:"
    return symbol[len(prefix):] if symbol.startswith(prefix) else symbol


def sentence_words(task, lang, ids):
    """Piece ids of one sentence -> [(word, [piece positions])], a word starting at every piece with ▁."""
    words = []
    for position, piece_id in enumerate(ids.tolist()):
        text = piece_text(task, lang, piece_id)
        if text.startswith(WORD_START) or not words:
            words.append(["", []])
        words[-1][0] += text.replace(WORD_START, "")
        words[-1][1].append(position)
    return [(word, positions) for word, positions in words if word]


def input_position(task, lang, piece_position, n_pieces):
    """Where piece j of a sentence sits in `task.sentence_input` (after <s>; Fake-English may be reversed)."""
    reversed_order = lang == 1 and getattr(task.cfg, "inv_order", False)
    return 1 + (n_pieces - 1 - piece_position if reversed_order else piece_position)


def contextual_word_vectors(model, task, lang, sentences, vocabulary, max_tokens=8192):
    """Per layer {word: mean over its occurrences of the mean of its pieces' vectors}, words of `vocabulary`."""
    from fairseq_xmlm.evaluation.multilinguality import length_batches, pad_batch

    limit = task.cfg.tokens_per_sample - 2
    sentences = [ids[:limit] for ids in sentences]
    index, sums, counts = {}, {}, {}
    device = next(model.parameters()).device
    with torch.no_grad():
        for batch in length_batches([len(ids) + 2 for ids in sentences], max_tokens):
            tokens = pad_batch([task.sentence_input(sentences[k], lang) for k in batch], task.dictionary.pad())
            states = model.encode_layers(tokens.to(device),
                                         torch.full((len(batch),), lang, dtype=torch.long, device=device))
            stacked = torch.stack(states).float()  # (L+1, B, T, D)
            for row, k in enumerate(batch):
                for word, positions in sentence_words(task, lang, sentences[k]):
                    if word not in vocabulary:
                        continue
                    at = [input_position(task, lang, p, len(sentences[k])) for p in positions]
                    occurrence = stacked[:, row, at].mean(dim=1)  # (L+1, D)
                    slot = index.setdefault(word, len(index))
                    sums[slot] = sums[slot] + occurrence if slot in sums else occurrence
                    counts[slot] = counts.get(slot, 0) + 1
    if not index:
        raise XmlmError(f"no dictionary word occurs in the {len(sentences)} sentences of language {lang}")
    words = sorted(index, key=index.get)
    means = torch.stack([sums[index[w]] / counts[index[w]] for w in words], dim=1)  # (L+1, W, D)
    return [dict(zip(words, layer.cpu())) for layer in means]


def embedding_word_vectors(model, task, lang, vocabulary):
    """{word: embedding row} for the words of `vocabulary` that are one piece (`▁word` is a dictionary symbol)."""
    tables = model.token_embeddings
    weight = tables[lang if len(tables) > 1 else 0].weight.detach().float().cpu()
    vectors = {}
    for piece_id in range(task.dictionary.nspecial, len(task.dictionary)):
        text = piece_text(task, lang, piece_id)
        word = text[1:]
        if text.startswith(WORD_START) and word in vocabulary and piece_id not in task.special_ids:
            model_id = int(task.sentence_input(torch.tensor([piece_id]), lang)[1])  # Fake-English: shifted id
            vectors[word] = weight[model_id]
    return vectors


def fasttext_word_vectors(task, lang, sentences, vocabulary, dim, epochs, seed):
    """fastText skipgram vectors trained on the words of the same sentences, restricted to `vocabulary`."""
    from fairseq_xmlm.knn_table import train_fasttext

    with tempfile.TemporaryDirectory(prefix="xmlm-analyze-") as tmp:
        corpus = os.path.join(tmp, "words.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for ids in sentences:
                f.write(" ".join(word for word, _ in sentence_words(task, lang, ids)) + "\n")
        words, vectors = train_fasttext(corpus, dim, epochs, seed, threads=2)
    return {w: torch.from_numpy(v) for w, v in zip(words, vectors) if w in vocabulary}


def load_side(checkpoint, data, lang, split, max_sentences, device):
    from fairseq_xmlm.checkpoints import load_checkpoint

    model, task, cfg = load_checkpoint(checkpoint, device=device, data=data)
    n_langs = len(task.langs)
    if not 0 <= lang < n_langs:
        raise XmlmError(f"language index {lang} does not exist in {checkpoint} (its task has {n_langs})")
    sentences = task.load_split_sentences(split, lang)[:max_sentences]
    return model, task, cfg, sentences


def random_encoder_like(task, cfg, seed, device):
    """Model B's architecture, freshly initialised: the paper's random-encoder lower bound."""
    torch.manual_seed(seed)
    return task.build_model(cfg.model).to(device).eval()


def paired_vectors(args):
    device = torch.device(args.device)
    model_a, task_a, _, sentences_a = load_side(args.model_a, args.data_a, args.lang_a, args.split,
                                                args.max_sentences, device)
    model_b, task_b, cfg_b, sentences_b = load_side(args.model_b or args.model_a, args.data_b or args.data_a,
                                                    args.lang_b, args.split, args.max_sentences, device)
    if len(sentences_a) != len(sentences_b):
        raise XmlmError(f"the {args.split} split has {len(sentences_a)} sentences in language A but "
                        f"{len(sentences_b)} in language B: they must be parallel")
    log(f"encoding {len(sentences_a)} parallel sentences with both models")
    pooled_a = pooled_layers(model_a, task_a, args.lang_a, sentences_a)
    pooled_b = pooled_layers(model_b, task_b, args.lang_b, sentences_b)
    if len(pooled_a) != len(pooled_b):
        raise XmlmError(f"model A has {len(pooled_a) - 1} layers, model B {len(pooled_b) - 1}: compare equal depths")
    return pooled_a, pooled_b, (task_b, cfg_b, sentences_b, device)


# ---- outputs ----
def write_atomically(path, write):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(os.path.abspath(path)), prefix=".tmp-")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, payload):
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=2)
            f.write("\n")

    write_atomically(path, write)


def save_figure(figure, path):
    from fairseq_xmlm.evaluation.figures import plt

    write_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=120, bbox_inches="tight"))
    plt.close(figure)


def plot_retrieval(per_layer, title, path):
    from fairseq_xmlm.evaluation.figures import plt  # Agg backend, quiet matplotlib logging

    figure, axis = plt.subplots(figsize=(5, 3.2))
    layers = range(len(per_layer))
    for key, label in (("a_to_b", "A -> B"), ("b_to_a", "B -> A")):
        axis.plot(layers, [100 * r[key] for r in per_layer], marker="o", label=label)
    axis.set(xlabel="layer", ylabel="P@1 (%)", title=title, xticks=list(layers))
    axis.legend()
    save_figure(figure, path)


def plot_word(result, path):
    from fairseq_xmlm.evaluation.figures import plt  # Agg backend, quiet matplotlib logging

    figure, axis = plt.subplots(figsize=(5, 3.2))
    layers = range(len(result["contextual"]))
    axis.plot(layers, [100 * r["p1"] for r in result["contextual"]], marker="o", label="contextual")
    axis.axhline(100 * result["noncontextual"]["p1"], color="C1", linestyle="--", label="embeddings (1 piece)")
    axis.axhline(100 * result["fasttext"]["p1"], color="C2", linestyle=":", label="fastText")
    axis.set(xlabel="layer", ylabel="P@1 (%)", title="Word translation after Procrustes (CSLS)",
             xticks=list(layers))
    axis.legend()
    save_figure(figure, path)


def plot_cka_heatmap(rows, labels, title, path):
    from fairseq_xmlm.evaluation.figures import plt  # Agg backend, quiet matplotlib logging

    values = np.array([row + [float(np.mean(row))] for row in rows])
    figure, axis = plt.subplots(figsize=(1.0 + 0.6 * values.shape[1], 0.8 + 0.5 * len(rows)))
    axis.imshow(values, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    axis.set_xticks(range(values.shape[1]), [f"L{i}" for i in range(values.shape[1] - 1)] + ["avg"])
    axis.set_yticks(range(len(labels)), labels)
    for (r, c), v in np.ndenumerate(values):
        axis.text(c, r, f"{v:.2f}", ha="center", va="center", color="white" if v < 0.6 else "black", fontsize=8)
    axis.set_title(title)
    save_figure(figure, path)


# ---- subcommands ----
def run_sentence(args):
    pooled_a, pooled_b, _ = paired_vectors(args)
    per_layer = [sentence_retrieval(a, b, args.n_train) for a, b in zip(pooled_a, pooled_b)]
    result = {"analysis": "sentence", "model_a": args.model_a, "model_b": args.model_b or args.model_a,
              "lang_a": args.lang_a, "lang_b": args.lang_b, "split": args.split, "n_train": args.n_train,
              "n_test": len(pooled_a[0]) - args.n_train, "layers": per_layer}
    write_json(os.path.join(args.out, "sentence.json"), result)
    plot_retrieval(per_layer, "Sentence retrieval after Procrustes", os.path.join(args.out, "sentence.png"))
    for layer, r in enumerate(per_layer):
        log(f"layer {layer}: P@1 A->B {r['a_to_b']:.3f}  B->A {r['b_to_a']:.3f}")
    return result


def run_word(args):
    device = torch.device(args.device)
    train_pairs, test_pairs = read_muse_dictionary(args.dict_train), read_muse_dictionary(args.dict_test)
    vocab_a = {s for s, _ in train_pairs + test_pairs}
    vocab_b = {t for _, t in train_pairs + test_pairs}
    model_a, task_a, _, sentences_a = load_side(args.model_a, args.data_a, args.lang_a, args.split,
                                                args.max_sentences, device)
    model_b, task_b, _, sentences_b = load_side(args.model_b or args.model_a, args.data_b or args.data_a,
                                                args.lang_b, args.split, args.max_sentences, device)
    result = {"analysis": "word", "model_a": args.model_a, "model_b": args.model_b or args.model_a,
              "lang_a": args.lang_a, "lang_b": args.lang_b, "split": args.split,
              "sentences": [len(sentences_a), len(sentences_b)]}
    result["noncontextual"] = word_translation(embedding_word_vectors(model_a, task_a, args.lang_a, vocab_a),
                                               embedding_word_vectors(model_b, task_b, args.lang_b, vocab_b),
                                               train_pairs, test_pairs, "non-contextual (single-piece words)")
    log("contextual word vectors: encoding both languages")
    layers_a = contextual_word_vectors(model_a, task_a, args.lang_a, sentences_a, vocab_a)
    layers_b = contextual_word_vectors(model_b, task_b, args.lang_b, sentences_b, vocab_b)
    result["contextual"] = [word_translation(a, b, train_pairs, test_pairs, f"contextual layer {layer}")
                            for layer, (a, b) in enumerate(zip(layers_a, layers_b))]
    log("fastText baseline on the same sentences")
    fasttext_a = fasttext_word_vectors(task_a, args.lang_a, sentences_a, set(layers_a[0]), args.fasttext_dim,
                                       args.fasttext_epochs, args.seed)
    fasttext_b = fasttext_word_vectors(task_b, args.lang_b, sentences_b, set(layers_b[0]), args.fasttext_dim,
                                       args.fasttext_epochs, args.seed + 1)
    result["fasttext"] = word_translation(fasttext_a, fasttext_b, train_pairs, test_pairs, "fastText")
    write_json(os.path.join(args.out, "word.json"), result)
    plot_word(result, os.path.join(args.out, "word.png"))
    log(f"word P@1: non-contextual {result['noncontextual']['p1']:.3f}, fastText {result['fasttext']['p1']:.3f}, "
        f"contextual per layer {[round(r['p1'], 3) for r in result['contextual']]}")
    return result


def run_cka(args):
    pooled_a, pooled_b, (task_b, cfg_b, sentences_b, device) = paired_vectors(args)
    log("encoding language B with a randomly initialised encoder")
    random_b = pooled_layers(random_encoder_like(task_b, cfg_b, args.seed, device), task_b, args.lang_b,
                             sentences_b)
    cka = [linear_cka(a, b) for a, b in zip(pooled_a, pooled_b)]
    cka_random = [linear_cka(a, b) for a, b in zip(pooled_a, random_b)]
    n_train = args.n_train if args.n_train < len(pooled_a[0]) else len(pooled_a[0]) // 2
    retrieval = [sentence_retrieval(a, b, n_train) for a, b in zip(pooled_a, pooled_b)]
    mean_retrieval = [(r["a_to_b"] + r["b_to_a"]) / 2 for r in retrieval]
    result = {"analysis": "cka", "model_a": args.model_a, "model_b": args.model_b or args.model_a,
              "lang_a": args.lang_a, "lang_b": args.lang_b, "split": args.split, "n_sentences": len(pooled_a[0]),
              "cka": cka, "cka_random": cka_random, "retrieval_p1": mean_retrieval,
              "pearson_cka_retrieval": pearson(cka, mean_retrieval)}
    write_json(os.path.join(args.out, "cka.json"), result)
    plot_cka_heatmap([cka, cka_random], ["A vs B", "A vs random"], "Linear CKA of mean-pooled sentences",
                     os.path.join(args.out, "cka.png"))
    log(f"CKA per layer {np.round(cka, 3).tolist()}, random {np.round(cka_random, 3).tolist()}, "
        f"Pearson with retrieval {result['pearson_cka_retrieval']:.3f}")
    return result


def run(argv=None):
    """The command without the console wrapper: returns the result dict (errors raise XmlmError)."""
    parser = argparse.ArgumentParser(prog="xmlm-analyze", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, run in (("word", run_word), ("sentence", run_sentence), ("cka", run_cka)):
        sub = commands.add_parser(name)
        sub.set_defaults(run=run)
        sub.add_argument("--model-a", required=True, help="checkpoint of model A")
        sub.add_argument("--model-b", default=None, help="checkpoint of model B (default: model A)")
        sub.add_argument("--lang-a", type=int, default=0, help="language index of A in its task")
        sub.add_argument("--lang-b", type=int, default=1, help="language index of B in its task")
        sub.add_argument("--data-a", default=None, help="data dir of model A (default: from the checkpoint)")
        sub.add_argument("--data-b", default=None, help="data dir of model B (default: --data-a)")
        sub.add_argument("--split", default="valid")
        sub.add_argument("--max-sentences", type=int, default=10000)
        sub.add_argument("--n-train", type=int, default=1000, help="parallel sentences to learn Procrustes on")
        sub.add_argument("--seed", type=int, default=1, help="initialisation of the random encoder (cka)")
        sub.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
        sub.add_argument("--out", required=True, help="output directory for <command>.json and <command>.png")
        if name == "word":
            sub.add_argument("--dict-train", required=True, help="MUSE dictionary (src tgt lines) for Procrustes")
            sub.add_argument("--dict-test", required=True, help="MUSE dictionary for evaluation")
            sub.add_argument("--fasttext-dim", type=int, default=300)
            sub.add_argument("--fasttext-epochs", type=int, default=20)
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    return args.run(args)


@cli_errors
def main(argv=None):
    run(argv)  # returns None: the console-script wrapper exits with main()'s return value


if __name__ == "__main__":
    main()
