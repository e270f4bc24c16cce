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

import os

import numpy as np
import torch

from fairseq_xmlm.analysis.cka import linear_cka
from fairseq_xmlm.analysis.plots import plot_cka_heatmap, plot_retrieval, plot_word
from fairseq_xmlm.analysis.sentence_retrieval import pooled_layers, sentence_retrieval
from fairseq_xmlm.analysis.word_vectors import (contextual_word_vectors, embedding_word_vectors,
                                                fasttext_word_vectors, word_translation)
from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.data.muse import load_muse_dictionary
from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.io import log, write_json


def pearson(xs, ys):
    """Pearson correlation of two series (CKA and retrieval across layers); nan when either is constant."""
    xs, ys = np.asarray(xs, dtype=np.float64), np.asarray(ys, dtype=np.float64)
    if len(xs) < 2 or xs.std() == 0 or ys.std() == 0:
        return float("nan")
    return float(np.corrcoef(xs, ys)[0, 1])


def load_side(checkpoint, data, lang, split, max_sentences, device):
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


# ---- subcommands ----
def run_sentence(args):
    pooled_a, pooled_b, _ = paired_vectors(args)
    per_layer = [sentence_retrieval(a, b, args.n_train) for a, b in zip(pooled_a, pooled_b)]
    result = {"analysis": "sentence", "model_a": args.model_a, "model_b": args.model_b or args.model_a,
              "lang_a": args.lang_a, "lang_b": args.lang_b, "split": args.split, "n_train": args.n_train,
              "n_test": len(pooled_a[0]) - args.n_train, "layers": per_layer}
    write_json(os.path.join(args.out, "sentence.json"), result, indent=2)
    plot_retrieval(per_layer, "Sentence retrieval after Procrustes", os.path.join(args.out, "sentence.png"))
    for layer, r in enumerate(per_layer):
        log(f"layer {layer}: P@1 A->B {r['a_to_b']:.3f}  B->A {r['b_to_a']:.3f}")
    return result


def run_word(args):
    device = torch.device(args.device)
    train_pairs, test_pairs = load_muse_dictionary(args.dict_train), load_muse_dictionary(args.dict_test)
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
    write_json(os.path.join(args.out, "word.json"), result, indent=2)
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
    write_json(os.path.join(args.out, "cka.json"), result, indent=2)
    plot_cka_heatmap([cka, cka_random], ["A vs B", "A vs random"], "Linear CKA of mean-pooled sentences",
                     os.path.join(args.out, "cka.png"))
    log(f"CKA per layer {np.round(cka, 3).tolist()}, random {np.round(cka_random, 3).tolist()}, "
        f"Pearson with retrieval {result['pearson_cka_retrieval']:.3f}")
    return result


def run(argv=None):
    """The command without the console wrapper: returns the result dict (errors raise XmlmError)."""
    parser = ArgumentParser(prog="xmlm-analyze", description=__doc__.split("\n")[0])
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
