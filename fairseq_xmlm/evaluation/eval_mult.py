"""xmlm-eval-mult: degree of multilinguality and model fit of one `fake_english` or `bilingual_mlm` checkpoint.

    xmlm-eval-mult CHECKPOINT --data DATA_BIN [--layers 0 8] [--json OUT.json] [--max-sentences N]
                   [--split valid|test] [--dict MUSE_FILE] [--tf32] [--padding trained|attended|masked]

fake_english: the modifications the model was trained with (lang-pos, shift-special, inv-order, ...) come from the
checkpoint's task config, so the Fake side of the dev data is built exactly as in training; alignment F1, retrieval
rho and translation tau (every word against its twin) per layer, mu their rho/tau mean.

bilingual_mlm (languages 0 and 1 of its --langs): the parallel text is item k of `{split}.<l0>` and of
`{split}.<l1>` (the same verse). rho as for fake_english, each language under its own lang id. Alignment F1 needs
gold word alignments: null. tau needs --dict (MUSE lines `src tgt`, l0 -> l1): a word counts when it is ONE
dictionary symbol of its language, `▁word` (joint / separate sentencepiece) or `<lang>:▁word` (prefixed), found
as a whole word in that language's training text; its vector is the mean-pooled state of `<s> word </s>`; tau is
P@1 of finding a gold translation among all such words of the other language, both directions averaged; null
without --dict. mu is the mean of the defined rho / tau values ("mu_parts" names them). Perplexity (15 % mask-only,
fixed seed) per language through its own lang id, averaged over languages.

Prints one summary line on stdout and, with --json, writes {"checkpoint", "task", "products" ("tf32" with --tf32
on a GPU, else "fp32"), "mu", "mu_parts", "layers": {"0": {"align_f1", "retrieval", "translation"}, ...},
"ppl": {"train", "valid"}, "n_sentences", "n_words"}; fake_english adds "padding" ("attended" or "masked": whether
the dev states of F1, rho and tau saw their batch's padding; perplexity masks it always, so that its columns compare
across models), bilingual_mlm "langs", "split", "dict" and "ppl_per_lang": {lang: {"train", "valid"}}.
"""
import os
import time

import torch

from fairseq_xmlm.checkpoints import load_checkpoint, safe_torch_load
from fairseq_xmlm.data.muse import load_muse_dictionary
from fairseq_xmlm.errors import ArgumentParser, XmlmError, cli_errors
from fairseq_xmlm.evaluation.scores import (bilingual_scores, multilinguality_scores, parallel_sentences,
                                            split_perplexity)
from fairseq_xmlm.io import log, read_meta, write_json
from fairseq_xmlm.precision import allow_tf32, fp32_products
from fairseq_xmlm.vocabulary import dictionary_fingerprint, load_data_dictionary

SUPPORTED_TASKS = ("fake_english", "bilingual_mlm")
PADDING = {"trained": None, "attended": True, "masked": False}  # --padding -> PairedEncoder's attend_padding


def clock():
    """(wall, CPU of this process over all its threads) seconds, for `took`."""
    return time.perf_counter(), time.process_time()


def took(started):
    """Wall and CPU seconds since `started` (a `clock()`); wall well above CPU / cores: the cores were busy with
    other work."""
    wall, cpu = clock()
    return f"{wall - started[0]:.1f}s, CPU {cpu - started[1]:.1f}s"


def checkpoint_task_config(path):
    """The task config a checkpoint was trained with, read before anything is built (memory-mapped, weights only):
    its name, the data directory it trained on and (bilingual_mlm) its languages."""
    state = safe_torch_load(path, map_location="cpu", mmap=True)
    task = (state.get("cfg") or {}).get("task") or {}
    return {key: task.get(key) if isinstance(task, dict) else getattr(task, key, None)
            for key in ("_name", "data", "langs")}


def data_languages(data_dir):
    """The languages xmlm-prepare recorded in data_dir/meta.json (None without one)."""
    meta = read_meta(data_dir, required=False)
    return None if meta is None else meta.get("langs")


def load_for_evaluation(path, data_dir, device):
    """(model, task) of a supported checkpoint, its task reading `data_dir`, which must hold the training
    dictionary."""
    if not os.path.isfile(path):
        raise XmlmError(f"checkpoint {path} does not exist")
    trained = checkpoint_task_config(path)
    name, trained_on = trained["_name"], trained["data"]
    if name not in SUPPORTED_TASKS:
        raise XmlmError(f"{path} was trained with task '{name}'; xmlm-eval-mult evaluates "
                        f"{', '.join(SUPPORTED_TASKS)} checkpoints")
    if name == "bilingual_mlm":
        langs = [lang.strip() for lang in (trained["langs"] or "").split(",") if lang.strip()]
        have = data_languages(data_dir) if os.path.isdir(data_dir) else None
        if len(langs) < 2:
            raise XmlmError(f"{path} was trained on one language ({','.join(langs)}): multilinguality needs two")
        if have is not None and not set(langs) <= set(have):
            raise XmlmError(f"{data_dir} holds {', '.join(have)} but {path} was trained on {', '.join(langs)}: "
                            "evaluate on data of the checkpoint's languages")
    if trained_on and os.path.isdir(trained_on) and os.path.realpath(trained_on) != os.path.realpath(data_dir):
        if dictionary_fingerprint(load_data_dictionary(trained_on)) != dictionary_fingerprint(
                load_data_dictionary(data_dir)):
            raise XmlmError(f"{data_dir}/dict.txt differs from {trained_on}/dict.txt, the dictionary {path} was "
                            "trained with: evaluate on data prepared with the same vocabulary")
    try:
        model, task, _ = load_checkpoint(path, device, data=data_dir)
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise
        raise XmlmError(f"{data_dir}/dict.txt is not the dictionary {path} was trained with "
                        "(embedding sizes differ): evaluate on data prepared with the same vocabulary") from None
    return model, task


def evaluate(model, task, layers=(0, 8), max_sentences=None, max_train_sentences=None, seed=1, device=None,
             attend_padding=None):
    """The eval-mult result dict (without "checkpoint") for a loaded fake_english model and task; `attend_padding`
    True or False encodes the dev set with its padding attended or masked (None: as the model trained)."""
    dev = task.load_split_sentences("valid")[:max_sentences]
    started = clock()
    result = multilinguality_scores(model, task, dev, layers, device, attend_padding=attend_padding)
    log(f"eval-mult: multilinguality on {len(dev)} dev sentences, {result['n_words']} words "
        f"({took(started)})")
    result["ppl"] = {}
    for split, limit in (("train", max_train_sentences), ("valid", max_sentences)):
        started = clock()
        by_lang = {lang: sentences[:limit] for lang, sentences in task.sentences_per_language(split).items()}
        result["ppl"][split] = split_perplexity(model, task, by_lang, device, seed=seed)
        log(f"eval-mult: {split} perplexity {result['ppl'][split]:.1f} ({took(started)})")
    return result


def evaluate_bilingual(model, task, layers=(0, 8), split="valid", max_sentences=None, max_train_sentences=None,
                       seed=1, device=None, dictionary=None):
    """The eval-mult result dict (without "checkpoint") for a loaded bilingual_mlm model and task, on its
    languages 0 and 1; `dictionary` a MUSE file of word pairs l0 -> l1 (None: no tau)."""
    first, second = parallel_sentences(task, split, max_sentences)
    word_pairs = load_muse_dictionary(dictionary) if dictionary else None
    started = clock()
    result = bilingual_scores(model, task, first, second, layers, device, word_pairs)
    result |= {"langs": list(task.langs[:2]), "split": split,
               "dict": {"path": dictionary, "pairs": len(word_pairs), "usable_pairs": result["n_words"]}
               if dictionary else None}
    log(f"eval-mult: retrieval on {len(first)} parallel {split} sentences"
        + (f", translation of {result['n_words']} of {len(word_pairs)} dictionary pairs" if dictionary else "")
        + f" ({took(started)})")
    per_lang = {}
    for lang in (0, 1):
        name = task.langs[lang]
        per_lang[name] = {}
        for ppl_split, limit in (("train", max_train_sentences), ("valid", max_sentences)):
            started = clock()
            sentences = task.load_split_sentences(ppl_split, lang)[:limit]
            per_lang[name][ppl_split] = split_perplexity(model, task, {lang: sentences}, device, seed=seed)
            log(f"eval-mult: {name} {ppl_split} perplexity {per_lang[name][ppl_split]:.1f} "
                f"({took(started)})")
    result["ppl"] = {ppl_split: sum(p[ppl_split] for p in per_lang.values()) / len(per_lang)
                     for ppl_split in ("train", "valid")}
    result["ppl_per_lang"] = per_lang
    return result


def score_text(value):
    return "-" if value is None else f"{value:.2f}"


def summary_line(result):
    parts = [f"mu={result['mu']:.3f}"]
    for layer, scores in result["layers"].items():
        parts.append(f"L{layer} F1={score_text(scores['align_f1'])} rho={score_text(scores['retrieval'])} "
                     f"tau={score_text(scores['translation'])}")
    parts.append(f"ppl train={result['ppl']['train']:.1f} dev={result['ppl']['valid']:.1f}")
    return f"{result['checkpoint']}: " + " | ".join(parts)


def parse_args(argv):
    parser = ArgumentParser(prog="xmlm-eval-mult", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a fake_english or bilingual_mlm checkpoint (.pt) written by fairseq-train")
    parser.add_argument("--data", required=True,
                        help="data-bin directory of xmlm-prepare (fake-english, or pair for bilingual_mlm)")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 8], help="layers to score (0: embeddings)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--max-sentences", type=int, help="only the first N dev sentences")
    parser.add_argument("--split", choices=("valid", "test"), default="valid",
                        help="bilingual_mlm: the parallel split for retrieval (default valid)")
    parser.add_argument("--dict", help="bilingual_mlm: MUSE dictionary (src tgt per line, language 0 -> 1) for "
                        "translation tau; without it tau is null. Alignment F1 is always null for bilingual_mlm "
                        "(no gold word alignments)")
    parser.add_argument("--max-train-sentences", type=int, help="only the first N train sentences for perplexity")
    parser.add_argument("--seed", type=int, default=1, help="seed of the perplexity masks")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tf32", action="store_true",
                        help="on a GPU, matrix products with TF32 inputs (fp32 sums): a BERT-base evaluation's GPU "
                        "time about halves; on a trained checkpoint alignment F1 moved by 7e-6 and perplexity by 1e-5 "
                        "of itself, rho and tau not at all (BERT-base, one H200, 2026-11-28, commit b60f796)")
    parser.add_argument("--padding", choices=list(PADDING), default="trained",
                        help="fake_english: the dev states see their batch's padding (attended: batches of 256 in "
                        "corpus order without an attention mask, as the paper's code evaluates) or not (masked); "
                        "default: as the checkpoint trained (--attend-padding: attended); perplexity masks it "
                        "always")
    args = parser.parse_args(argv)
    if min(args.layers) < 0:
        raise XmlmError(f"--layers must be >= 0, got {args.layers}")
    for name in ("max_sentences", "max_train_sentences"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise XmlmError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def run(argv=None):
    """The command without the console wrapper: returns the result dict (errors raise XmlmError)."""
    args = parse_args(argv)
    if args.dict and not os.path.isfile(args.dict):
        raise XmlmError(f"dictionary {args.dict} does not exist")
    if args.tf32:
        allow_tf32()
    model, task = load_for_evaluation(args.checkpoint, args.data, args.device)
    name = task.cfg._name  # the checkpoint's task, already checked by load_for_evaluation
    result = {"checkpoint": args.checkpoint, "task": name,
              "products": fp32_products(torch.device(args.device))}
    if name == "bilingual_mlm":
        if args.padding != "trained":
            raise XmlmError("--padding is for fake_english checkpoints (bilingual_mlm trains and evaluates its "
                            "streams with the padding masked)")
        result |= evaluate_bilingual(model, task, tuple(args.layers), args.split, args.max_sentences,
                                     args.max_train_sentences, args.seed, args.device, args.dict)
    else:
        if args.dict or args.split != "valid":
            raise XmlmError("--dict and --split are for bilingual_mlm checkpoints (fake_english translates every "
                            "word to its twin on the dev set)")
        result |= evaluate(model, task, tuple(args.layers), args.max_sentences, args.max_train_sentences, args.seed,
                           args.device, PADDING[args.padding])
    if args.json:
        write_json(args.json, result)
    print(summary_line(result))
    return result


@cli_errors
def main(argv=None):
    run(argv)  # returns None: the console-script wrapper exits with main()'s return value


if __name__ == "__main__":
    main()
