"""xmlm-eval-mult: the degree of multilinguality and the model fit of one `fake_english` checkpoint.

    xmlm-eval-mult CHECKPOINT --data DATA_BIN [--layers 0 8] [--json OUT.json] [--max-sentences N]

The modifications the model was trained with (lang-pos, shift-special, inv-order, ...) come from the checkpoint's
task config, so the Fake side of the dev data is built exactly as in training. Prints one summary line on stdout
and, with --json, writes {"checkpoint", "mu", "layers": {"0": {"align_f1", "retrieval", "translation"}, ...},
"ppl": {"train", "valid"}, "n_sentences", "n_words"}.
"""
import argparse
import json
import os
import sys
import time

import torch

from fairseq_xmlm.checkpoints import load_checkpoint, safe_torch_load
from fairseq_xmlm.errors import XmlmError, cli_errors
from fairseq_xmlm.evaluation.multilinguality import multilinguality_scores, split_perplexity
from fairseq_xmlm.evaluation.tables import write_atomic
from fairseq_xmlm.vocabulary import dictionary_fingerprint, load_data_dictionary

SUPPORTED_TASKS = ("fake_english",)


def log(message):
    print(message, file=sys.stderr, flush=True)


def checkpoint_task_config(path):
    """The task config a checkpoint was trained with, read before anything is built (memory-mapped, weights only):
    its name and the data directory it trained on."""
    state = safe_torch_load(path, map_location="cpu", mmap=True)
    task = (state.get("cfg") or {}).get("task") or {}
    return {key: task.get(key) if isinstance(task, dict) else getattr(task, key, None) for key in ("_name", "data")}


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


def sentences_by_language(task, split):
    """The sentences each language saw in `split`: all of them, but under no-parallel English trains on the first
    half of the training corpus and Fake on the second (as the task's load_dataset does)."""
    sentences = task.load_split_sentences(split)
    if task.cfg.no_parallel and split == "train":
        half = len(sentences) // 2
        return {0: sentences[:half], 1: sentences[half:]}
    return {0: sentences, 1: sentences}


def evaluate(model, task, layers=(0, 8), max_sentences=None, max_train_sentences=None, seed=1, device=None):
    """The eval-mult result dict (without "checkpoint") for a loaded model and task."""
    dev = task.load_split_sentences("valid")[:max_sentences]
    started = time.time()
    result = multilinguality_scores(model, task, dev, layers, device)
    log(f"eval-mult: multilinguality on {len(dev)} dev sentences, {result['n_words']} words "
        f"({time.time() - started:.1f}s)")
    result["ppl"] = {}
    for split, limit in (("train", max_train_sentences), ("valid", max_sentences)):
        started = time.time()
        by_lang = {lang: sentences[:limit] for lang, sentences in sentences_by_language(task, split).items()}
        result["ppl"][split] = split_perplexity(model, task, by_lang, device, seed=seed)
        log(f"eval-mult: {split} perplexity {result['ppl'][split]:.1f} ({time.time() - started:.1f}s)")
    return result


def summary_line(result):
    parts = [f"mu={result['mu']:.3f}"]
    for layer, scores in result["layers"].items():
        parts.append(f"L{layer} F1={scores['align_f1']:.2f} rho={scores['retrieval']:.2f} "
                     f"tau={scores['translation']:.2f}")
    parts.append(f"ppl train={result['ppl']['train']:.1f} dev={result['ppl']['valid']:.1f}")
    return f"{result['checkpoint']}: " + " | ".join(parts)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="xmlm-eval-mult", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a fake_english checkpoint (.pt) written by fairseq-train")
    parser.add_argument("--data", required=True, help="data-bin directory of xmlm-prepare fake-english")
    parser.add_argument("--layers", type=int, nargs="+", default=[0, 8], help="layers to score (0: embeddings)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--max-sentences", type=int, help="only the first N dev sentences")
    parser.add_argument("--max-train-sentences", type=int, help="only the first N train sentences for perplexity")
    parser.add_argument("--seed", type=int, default=1, help="seed of the perplexity masks")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
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
    model, task = load_for_evaluation(args.checkpoint, args.data, args.device)
    result = {"checkpoint": args.checkpoint}
    result |= evaluate(model, task, tuple(args.layers), args.max_sentences, args.max_train_sentences, args.seed,
                       args.device)
    if args.json:
        write_atomic(args.json, json.dumps(result, indent=1) + "\n")
    print(summary_line(result))
    return result


@cli_errors
def main(argv=None):
    run(argv)  # returns None: the console-script wrapper exits with main()'s return value


if __name__ == "__main__":
    main()
