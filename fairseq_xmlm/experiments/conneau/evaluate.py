"""The numbers of one trained row: what Table 1 and Figure 3 are made of.

- retrieval: P@1 of finding a held-out test verse's translation among all test verses of the other language, by
  cosine of mean-pooled states (both directions averaged), at every layer (0 = embeddings);
- retrieval_aligned: the same after a Procrustes map of each layer learned on `ALIGN_VERSES` training verses
  (section 5 of the paper: similar but not shared spaces are still aligned by a linear map);
- cka, cka_random_encoder: linear CKA per layer of the pooled parallel verses (training sample + test), and the
  same with the other language encoded by a randomly initialised model of the row's architecture (Figure 7);
- translation: word translation P@1 per layer, Procrustes learned on the dictionary's training pairs, CSLS
  retrieval of its test pairs (Conneau et al. 2020, section 5.1);
- alignment: contextual word alignment accuracy per layer (share of dictionary-linked words aligned to their
  partner within the verse pair) on the held-out verses (section 5.1.2);
- genre: zero-shot Bible genre accuracy (fine-tuned on English, language-specific parameters frozen) on the other
  language, with the majority-class baseline;
- ppl_en: English dev perplexity of the selected checkpoint (the first validation subset selects it);
- curve: retrieval per layer and English dev perplexity at every saved interval checkpoint, which are deleted
  afterwards (they are only kept for this).
"""
import re
from pathlib import Path

import torch

from fairseq_xmlm.devices import default_device
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log

VALID_LINE = re.compile(r"valid on 'valid_en' subset \|.*?\| ppl ([0-9.]+) \|.*?\| num_updates (\d+)")
INTERVAL_CHECKPOINT = re.compile(r"checkpoint_\d+_(\d+)\.pt$")
ALIGN_VERSES = 5000


def retrieval_by_layer(model, task, split="test", device=None):
    """{layer (str): P@1} on the split's parallel verses."""
    from fairseq_xmlm.evaluation.scores import parallel_retrieval, parallel_sentences

    layers = range(len(model.layers) + 1)
    retrieval = parallel_retrieval(model, task, *parallel_sentences(task, split), layers, device=device)
    return {str(layer): float(value) for layer, value in retrieval.items()}


def pooled_parallel(model, task, train_verses=ALIGN_VERSES, langs=(0, 1)):
    """Per language of `langs`, per layer: mean-pooled vectors of the first `train_verses` training verses followed
    by every test verse; and how many training verses lead."""
    from fairseq_xmlm.analysis.sentence_retrieval import pooled_layers
    from fairseq_xmlm.evaluation.scores import parallel_sentences

    train = parallel_sentences(task, "train", train_verses)
    test = parallel_sentences(task, "test")
    sides = [[torch.cat([a, b]).float() for a, b in zip(pooled_layers(model, task, lang, train[lang]),
                                                         pooled_layers(model, task, lang, test[lang]))]
             for lang in langs]
    return sides, len(train[0])


def aligned_retrieval_by_layer(sides, n_train):
    """{layer (str): P@1} on the test verses after Procrustes learned on the leading training verses, both ways."""
    from fairseq_xmlm.analysis.sentence_retrieval import sentence_retrieval

    scores = {}
    for layer, (a, b) in enumerate(zip(*sides)):
        both = sentence_retrieval(a, b, n_train)
        scores[str(layer)] = (both["a_to_b"] + both["b_to_a"]) / 2
    return scores


def cka_by_layer(first, second):
    """{layer (str): linear CKA} of the two languages' pooled parallel verses (Conneau et al. 2020, section 5.2,
    Figure 7: X, Y the mean-pooled representations of n parallel sentences at layer l)."""
    from fairseq_xmlm.analysis.cka import linear_cka

    return {str(layer): linear_cka(a, b) for layer, (a, b) in enumerate(zip(first, second))}


def random_encoder(task, cfg, device, seed=0):
    """The row's architecture freshly initialised: Figure 7's lower bound encodes the non-English side with it."""
    torch.manual_seed(seed)
    return task.build_model(cfg.model).to(device).eval()


def section5_scores(model, task, cfg, device):
    """Aligned retrieval, CKA per layer, and CKA against a random encoder of the other language (the lower bound)."""
    sides, n_train = pooled_parallel(model, task)
    untrained = random_encoder(task, cfg, device)
    (random_side,), _ = pooled_parallel(untrained, task, langs=(1,))
    del untrained
    return {"retrieval_aligned": aligned_retrieval_by_layer(sides, n_train), "cka": cka_by_layer(*sides),
            "cka_random_encoder": cka_by_layer(sides[0], random_side)}


def validation_curve(train_log):
    """{updates: English dev perplexity} from fairseq-train's log (base 2 loss, as fairseq prints ppl)."""
    if not Path(train_log).is_file():
        return {}
    return {int(updates): float(ppl) for ppl, updates in VALID_LINE.findall(Path(train_log).read_text(
        errors="replace"))}


def interval_checkpoints(save_dir):
    """[(updates, path)] of fairseq's checkpoint_<epoch>_<updates>.pt files, by updates."""
    found = []
    for path in Path(save_dir).glob("checkpoint_*_*.pt"):
        match = INTERVAL_CHECKPOINT.search(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def training_curve(save_dir, device):
    """[{updates, retrieval: {layer: P@1}, ppl_en}] over the interval checkpoints, which are then deleted."""
    from fairseq_xmlm.checkpoints import load_checkpoint

    ppl = validation_curve(Path(save_dir) / "train.log")
    curve = []
    checkpoints = interval_checkpoints(save_dir)
    for updates, path in checkpoints:
        model, task, _ = load_checkpoint(path, device)
        curve.append({"updates": updates, "retrieval": retrieval_by_layer(model, task, device=device),
                      "ppl_en": ppl.get(updates)})
        del model
    for _, path in checkpoints:
        path.unlink()
    return curve


def best_validation_perplexity(checkpoint):
    """2 ** the best English dev loss fairseq recorded (its masked_lm loss is in base 2)."""
    from fairseq_xmlm.checkpoints import safe_torch_load

    state = safe_torch_load(checkpoint, map_location="cpu", mmap=True)
    best = state.get("extra_state", {}).get("best")
    if best is None:
        raise XmlmError(f"{checkpoint} records no validation loss: was it saved by fairseq-train with validation?")
    return float(2.0 ** best)


def evaluate_run(checkpoint, dictionary=None, genre=True, genre_options=None, device=None, curve=True):
    """The result dict of one trained run (see the module docstring)."""
    from fairseq_xmlm.checkpoints import load_checkpoint

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise XmlmError(f"{checkpoint} does not exist: has the run trained?")
    device = device or default_device()
    model, task, cfg = load_checkpoint(checkpoint, device)
    langs = list(task.langs)
    result = {"checkpoint": str(checkpoint), "langs": langs, "ppl_en": best_validation_perplexity(checkpoint),
              "retrieval": retrieval_by_layer(model, task, device=device),
              **section5_scores(model, task, cfg, device),
              "language_parameters": {str(k): len(v) for k, v in model.language_parameters().items()}}
    log(f"conneau: {checkpoint}: retrieval by layer {result['retrieval']}")
    if dictionary is not None:
        result.update(dictionary_scores(model, task, dictionary, device))
    del model
    if genre:
        result["genre"] = genre_accuracy(checkpoint, langs, device, genre_options or {})
    if curve:
        result["curve"] = training_curve(checkpoint.parent, device)
    return result


def dictionary_scores(model, task, dictionary, device):
    """Word translation and contextual word alignment per layer, from one MUSE dictionary (split in train/test)."""
    from fairseq_xmlm.analysis.contextual_alignment import contextual_alignment_by_layer
    from fairseq_xmlm.analysis.word_vectors import word_translation_by_layer

    return {"translation": word_translation_by_layer(model, task, dictionary, device=device),
            "alignment": contextual_alignment_by_layer(model, task, dictionary, device=device)}


def genre_accuracy(checkpoint, langs, device, options):
    """{"test": {lang: accuracy}, "majority": {lang: accuracy}, "dev": ...} (fractions) of the zero-shot genre
    benchmark."""
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig
    from fairseq_xmlm.zeroshot.bible_genre import genre_zero_shot

    config = FinetuneConfig(**{k: v for k, v in options.items() if k != "max_train"})
    return genre_zero_shot(str(checkpoint), None, langs[1:], device, config, options.get("max_train"))
