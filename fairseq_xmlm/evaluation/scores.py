"""Multilinguality and perplexity of a model and its task: the metrics (`multilinguality.py`) glued to the model's
states (`encode.py`) and to the sentences the task trains on (`tasks.contract.LanguageTask`).

- `multilinguality_scores(model, task, sentences, layers)`: alignment F1, retrieval rho and translation tau per
  layer and mu of a `fake_english` model (every English word against its twin); `xmlm-eval-mult` and the task's
  validation hook both call it;
- `bilingual_scores(model, task, first, second, ...)`: the same for two real languages (`bilingual_mlm`): rho on
  parallel sentences, tau on a word dictionary (`dictionary_translation`), no alignment F1; `xmlm-eval-mult` and
  the Conneau Table 1 driver call it or its parts;
- `split_perplexity`: masked-LM perplexity of either task (`masked_perplexity` on any predict function).
"""
import math

import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import (EvalMode, PairedEncoder, length_batches, model_device, ordered_map,
                                            pad_batch, special_ids)
from fairseq_xmlm.evaluation.multilinguality import (f1_score, mask_positions, multilinguality_parts,
                                                     multilinguality_score, precision_at_1)
from fairseq_xmlm.vocabulary import WORD_START, join_sentences, piece_text


def _sentence_labels(*sides):
    """Same label for identical sentences (identical pairs, given both sides of parallel text), so retrieving a
    verbatim repeat of the query counts as a hit."""
    seen = {}
    return torch.tensor([seen.setdefault(tuple(tuple(s.tolist()) for s in row), len(seen)) for row in zip(*sides)])


def translation_words(task):
    """English vocabulary ids that are words (the task's special ids, fairseq's fillers included, left out)."""
    return [i for i in range(task.english_size) if i not in task.special_ids]


def encode_words(encoder, task, words):
    """{layer: (English (n,D), Fake (n,D))} vectors of each word fed alone as `<s> w </s>` (Dufter A.1)."""
    pieces = [torch.tensor([w]) for w in words]
    vectors, _ = encoder.pooled_and_aligned([task.sentence_input(p, 0) for p in pieces],
                                            [task.sentence_input(p, 1) for p in pieces])
    return vectors


def word_vectors(model, task, layers=(0,), device=None):
    """The translation vectors of every English word and its twin: (word ids, {layer: (English, Fake)})."""
    words = translation_words(task)
    device = torch.device(device) if device else model_device(model)
    with EvalMode(model, device) as workers:
        encoder = PairedEncoder.for_task(model, task, layers, device, workers=workers)
        return words, encode_words(encoder, task, words)


def multilinguality_scores(model, task, sentences, layers=(0, 8), device=None, max_tokens=8192,
                           attend_padding=None):
    """Alignment F1, retrieval rho and translation tau per layer, and mu, of a `fake_english` model.

    sentences: English piece ids (1-D LongTensors, no specials) of the dev sentences; their Fake twins are built
    by `task.sentence_input(ids, 1)` exactly as in training (shift, reversal under inv-order, special tokens).
    attend_padding: whether the states see their batch's padding (`PairedEncoder`; None: as the model trained).
    Returns {"mu": f, "layers": {"0": {"align_f1", "retrieval", "translation"}, ...}, "n_sentences", "n_words",
    "padding": "attended" or "masked"}.
    """
    if not sentences:
        raise XmlmError("multilinguality: no dev sentences to evaluate")
    device = torch.device(device) if device else model_device(model)
    words = translation_words(task)
    with EvalMode(model, device) as workers:
        encoder = PairedEncoder.for_task(model, task, layers, device, max_tokens, workers, attend_padding)
        sentence_vectors, counts = encoder.pooled_and_aligned(
            [task.sentence_input(s, 0) for s in sentences], [task.sentence_input(s, 1) for s in sentences],
            gold_reversed=task.reverses(1) != task.reverses(0))
        twin_vectors = encode_words(encoder, task, words)
    labels = _sentence_labels(sentences)
    per_layer = {
        layer: {
            "align_f1": f1_score(*counts[layer]),
            "retrieval": precision_at_1(*sentence_vectors[layer], labels=labels),
            "translation": precision_at_1(*twin_vectors[layer]),
        }
        for layer in layers
    }
    return {
        "mu": multilinguality_score(per_layer),
        "mu_parts": list(multilinguality_parts(per_layer)),
        "layers": {str(layer): scores for layer, scores in per_layer.items()},
        "n_sentences": len(sentences),
        "n_words": len(words),
        "padding": "attended" if encoder.attend_padding else "masked",
    }


# ---- two real languages (bilingual_mlm): parallel text and a word dictionary ----
def parallel_sentences(task, split, max_sentences=None):
    """(language 0, language 1) piece ids of a split's items; item k of `{split}.<l0>` and of `{split}.<l1>` are
    the same verse (xmlm-prepare pair writes them verse-aligned)."""
    first, second = (task.load_split_sentences(split, lang)[:max_sentences] for lang in (0, 1))
    if len(first) != len(second):
        raise XmlmError(f"{split}.{task.langs[0]} has {len(first)} items and {split}.{task.langs[1]} "
                        f"{len(second)}: not parallel text")
    return first, second


def parallel_retrieval(model, task, first, second, layers, device=None, max_tokens=8192):
    """{layer: rho}: P@1 of finding a sentence's translation among all sentences of the other language by cosine
    of mean-pooled states (specials excluded), both directions averaged; each side runs under its own lang id."""
    if not first:
        raise XmlmError("retrieval: no parallel sentences to evaluate")
    device = torch.device(device) if device else model_device(model)
    with EvalMode(model, device) as workers:
        encoder = PairedEncoder.for_task(model, task, layers, device, max_tokens, workers)
        pooled, _ = encoder.pooled_and_aligned([task.sentence_input(s, 0) for s in first],
                                               [task.sentence_input(s, 1) for s in second], langs=(0, 1))
    labels = _sentence_labels(first, second)
    return {layer: precision_at_1(*pooled[layer], labels=labels) for layer in layers}


def word_symbols(task, lang):
    """{word: dictionary id} of the words of language `lang` that are ONE dictionary symbol.

    A word w is the symbol `▁w` (joint / separate sentencepiece) or `<lang>:▁w` (prefixed mode), and that symbol
    must occur as a whole word in the language's training text (followed by a word-initial piece or the sentence
    end): a joint vocabulary's `▁of` is also the start of French `offrande`, which makes it no French word."""
    dictionary = task.dictionary
    starts_word = torch.zeros(len(dictionary) + 1, dtype=torch.bool)  # the extra id marks each sentence's end
    for piece_id in range(dictionary.nspecial, len(dictionary)):
        starts_word[piece_id] = piece_id not in task.special_ids and piece_text(task, lang, piece_id).startswith(
            WORD_START)
    ends_word = starts_word.clone()
    ends_word[-1] = True
    stream = join_sentences(task.load_split_sentences("train", lang), separator=len(dictionary))
    whole_words = stream[:-1][starts_word[stream[:-1]] & ends_word[stream[1:]]].unique().tolist()
    symbols = {piece_text(task, lang, piece_id)[len(WORD_START):]: piece_id for piece_id in whole_words}
    symbols.pop("", None)  # a lone `▁` (before punctuation, digits ...) is no word
    return symbols


def dictionary_translation(model, task, word_pairs, layers, device=None, max_tokens=8192):
    """({layer: tau}, number of usable pairs) for a word dictionary [(word of language 0, word of language 1)].

    Usable pairs: both words are one dictionary symbol of their language (`word_symbols`). Every such word of
    either language is a candidate; a word's vector is the mean-pooled state of `<s> w </s>` under its lang id.
    tau = P@1 of finding a gold translation of a dictionary word among all candidates of the other language,
    both directions averaged.
    """
    vocabularies = [word_symbols(task, lang) for lang in (0, 1)]
    pairs = {(vocabularies[0][a], vocabularies[1][b]) for a, b in word_pairs
             if a in vocabularies[0] and b in vocabularies[1]}
    if not pairs:
        raise XmlmError(f"none of the {len(word_pairs)} dictionary pairs has both words as one dictionary symbol of "
                        f"{task.langs[0]} and {task.langs[1]} (e.g. '▁word'): wrong language pair or direction?")
    candidates = [sorted(vocabulary.values()) for vocabulary in vocabularies]
    row = [{piece_id: k for k, piece_id in enumerate(ids)} for ids in candidates]
    gold = torch.zeros(len(candidates[0]), len(candidates[1]), dtype=torch.bool)
    for a, b in pairs:
        gold[row[0][a], row[1][b]] = True
    device = torch.device(device) if device else model_device(model)
    with EvalMode(model, device) as workers:
        encoder = PairedEncoder.for_task(model, task, layers, device, max_tokens, workers)
        vectors = [encoder.pooled([task.sentence_input(torch.tensor([w]), lang) for w in candidates[lang]], lang)
                   for lang in (0, 1)]
    return {layer: precision_at_1(vectors[0][layer], vectors[1][layer], gold=gold) for layer in layers}, len(pairs)


def bilingual_scores(model, task, first, second, layers=(0, 8), device=None, word_pairs=None, max_tokens=8192):
    """Retrieval rho on parallel sentences and, given a word dictionary, translation tau per layer, and mu, of a
    model of two real languages. Alignment F1 needs gold word alignments, which parallel verses lack: None.
    Returns the schema of `multilinguality_scores` ("n_words": usable dictionary pairs, None without one)."""
    # the dictionary first: an unusable one fails before the longer retrieval pass
    translation, n_pairs = (dictionary_translation(model, task, word_pairs, layers, device, max_tokens)
                            if word_pairs is not None else (dict.fromkeys(layers), None))
    retrieval = parallel_retrieval(model, task, first, second, layers, device, max_tokens)
    per_layer = {layer: {"align_f1": None, "retrieval": retrieval[layer], "translation": translation[layer]}
                 for layer in layers}
    return {
        "mu": multilinguality_score(per_layer),
        "mu_parts": list(multilinguality_parts(per_layer)),
        "layers": {str(layer): scores for layer, scores in per_layer.items()},
        "n_sentences": len(first),
        "n_words": n_pairs,
    }


def split_perplexity(model, task, sentences_by_lang, device=None, mask_prob=0.15, seed=1, max_tokens=8192):
    """Masked-LM perplexity (base e) over the sentences of the given languages: {lang: [piece ids]} (Fake-English:
    English piece ids, `task.sentence_input` builds the Fake side).

    `mask_prob` of the word tokens, chosen with a fixed seed, are replaced by the mask symbol only (no keep /
    random); the loss is taken on those tokens.
    """
    device = torch.device(device) if device else model_device(model)
    special = special_ids(task)
    inputs, langs = [], []
    for lang, sentences in sorted(sentences_by_lang.items()):
        inputs += [task.sentence_input(s, lang) for s in sentences]
        langs += [lang] * len(sentences)
    masked = mask_positions([~torch.isin(x, special) for x in inputs], mask_prob, seed)
    mask_ids = torch.tensor([task.mask_symbol(lang) for lang in range(len(task.langs))])
    pad = task.dictionary.pad()

    def batches():
        for batch in length_batches([len(x) for x in inputs], max_tokens):
            lang_ids = torch.tensor([langs[k] for k in batch])
            yield (pad_batch([inputs[k] for k in batch], pad).to(device), lang_ids.to(device),
                   pad_batch([masked[k] for k in batch], False).to(device), mask_ids[lang_ids].to(device))

    def predict(tokens, lang_ids, masked_positions):
        return model(tokens, lang_ids=lang_ids, masked_tokens=masked_positions)[0]

    with EvalMode(model, device) as workers:
        return masked_perplexity(predict, batches(), workers)


def masked_perplexity(predict, batches, workers=1):
    """exp(mean NLL) over masked tokens, base e.

    predict(src_tokens, lang_ids, masked) -> logits (n_masked, V) for the masked positions, in row-major order.
    batches: iterable of (tokens (B,T), lang_ids (B,), masked (B,T) bool, mask_ids (B,)); the masked positions
    of `tokens` are replaced by the row's mask id, the loss is taken on those positions only. `workers`: threads
    that predict batches side by side (`ordered_map`); the sum runs in batch order whatever their number.
    """
    def batch_nll(batch):
        tokens, lang_ids, masked, mask_ids = batch
        if not masked.any():
            return 0.0, 0
        inputs = torch.where(masked, mask_ids.unsqueeze(1).expand_as(tokens), tokens)
        logits = predict(inputs, lang_ids, masked)
        return float(F.cross_entropy(logits.float(), tokens[masked], reduction="sum")), int(masked.sum())

    per_batch = ordered_map(batch_nll, batches, workers)
    total_nll, n_tokens = sum(nll for nll, _ in per_batch), sum(n for _, n in per_batch)
    if n_tokens == 0:
        raise XmlmError("perplexity: no token was masked (empty or all-special sentences)")
    return math.exp(total_nll / n_tokens)
