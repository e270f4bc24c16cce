"""Degree of multilinguality (Dufter & Schuetze 2020, section 2.2) and masked-LM perplexity.

The metric functions work on plain tensors, so they serve Fake-English twins and real parallel text alike:
- `mutual_argmax_counts`: word alignment by mutual argmax of cosine similarity (Sabet et al. 2020's Argmax),
  counted against a gold alignment, for a whole batch of padded sentence pairs at once;
- `mean_pool`: sentence vectors as the mean of token vectors, special tokens excluded;
- `precision_at_1`: retrieval P@1 by cosine, in chunks, averaged over both directions (rho and tau);
- `masked_perplexity`: exp of the mean NLL on tokens replaced by the mask symbol.

`multilinguality_scores(model, task, sentences, layers, device)` glues them to a model and a `fake_english` task;
`xmlm-eval-mult` and the task's validation hook both call it.
"""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError


# --------------------------------------------------------------------------------------------------------------
# Pure metric functions
# --------------------------------------------------------------------------------------------------------------
def compact_tokens(states, keep):
    """Move the kept positions of each row to the front, in order, dropping the rest.

    (B,T,D), (B,T) bool -> (B,L,D) right-padded with leftovers, lengths (B,); L = the most kept in a row.
    """
    lengths = keep.sum(dim=1)
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, : int(lengths.max()) if len(keep) else 0]
    compacted = torch.gather(states, 1, order.unsqueeze(-1).expand(-1, -1, states.shape[-1]))
    return compacted, lengths


def gold_alignment(lengths, reversed_order=False):
    """Gold target index of each source position of a one-to-one alignment: identity, or i -> n-1-i.

    Returns a (B, T) LongTensor with -1 at padding, T = max length.
    """
    positions = torch.arange(int(lengths.max()) if len(lengths) else 0, device=lengths.device)
    valid = positions.unsqueeze(0) < lengths.unsqueeze(1)
    gold = (lengths.unsqueeze(1) - 1 - positions) if reversed_order else positions.expand(len(lengths), -1)
    return torch.where(valid, gold, torch.full_like(gold, -1))


def mutual_argmax_counts(src, tgt, src_lengths, tgt_lengths, gold):
    """Align i <-> j iff j = argmax_l S[i,l] and i = argmax_l S[l,j], S the cosine similarity.

    src (B,S,D), tgt (B,T,D) padded on the right, lengths (B,), gold (B,S) the gold target of each source
    position (-1: none). Returns (|P and G|, |P|, |G|) as ints, summed over the batch.
    """
    src_valid = torch.arange(src.shape[1], device=src.device).unsqueeze(0) < src_lengths.unsqueeze(1)
    tgt_valid = torch.arange(tgt.shape[1], device=tgt.device).unsqueeze(0) < tgt_lengths.unsqueeze(1)
    sim = torch.bmm(F.normalize(src.float(), dim=-1), F.normalize(tgt.float(), dim=-1).transpose(1, 2))
    sim = sim.masked_fill(~(src_valid.unsqueeze(2) & tgt_valid.unsqueeze(1)), float("-inf"))
    best_tgt = sim.argmax(dim=2)  # (B,S)
    best_src = sim.argmax(dim=1)  # (B,T)
    mutual = (torch.gather(best_src, 1, best_tgt) == torch.arange(src.shape[1], device=src.device)) & src_valid
    gold = gold[:, : src.shape[1]]
    n_gold = int(((gold >= 0) & src_valid).sum())
    return int((mutual & (best_tgt == gold)).sum()), int(mutual.sum()), n_gold


def f1_score(n_correct, n_predicted, n_gold):
    """F1 of precision n_correct/n_predicted and recall n_correct/n_gold; 0 when nothing is correct."""
    if n_correct == 0:
        return 0.0
    precision, recall = n_correct / n_predicted, n_correct / n_gold
    return 2 * precision * recall / (precision + recall)


def mean_pool(states, keep):
    """Mean of the kept token vectors of each row: (B,T,D), (B,T) bool -> (B,D); a row keeping nothing gives 0."""
    weights = keep.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1)


def _p_at_1_one_way(queries, keys, labels, chunk_size):
    keys = F.normalize(keys.float(), dim=-1)
    hits = 0
    for start in range(0, len(queries), chunk_size):
        block = F.normalize(queries[start : start + chunk_size].float(), dim=-1)
        best = (block @ keys.T).argmax(dim=1)
        hits += int((labels[best] == labels[start : start + chunk_size]).sum())
    return hits / len(queries)


def precision_at_1(vectors_a, vectors_b, labels=None, chunk_size=1024):
    """Cosine P@1 of finding row i of b for query row i of a and vice versa, averaged over both directions.

    labels (m,) marks rows that are the same item (e.g. a sentence occurring twice in the corpus): retrieving
    any row with the query's label counts as a hit. Default: every row is its own item.
    """
    if len(vectors_a) != len(vectors_b) or len(vectors_a) == 0:
        raise XmlmError(f"retrieval needs two equally long non-empty sets, got {len(vectors_a)} and {len(vectors_b)}")
    if labels is None:
        labels = torch.arange(len(vectors_a))
    labels = labels.to(vectors_a.device)
    forward = _p_at_1_one_way(vectors_a, vectors_b, labels, chunk_size)
    backward = _p_at_1_one_way(vectors_b, vectors_a, labels, chunk_size)
    return (forward + backward) / 2


def multilinguality_score(per_layer):
    """mu: the mean of retrieval and translation over the given layers ({layer: {"retrieval", "translation"}})."""
    values = [scores[name] for scores in per_layer.values() for name in ("retrieval", "translation")]
    return sum(values) / len(values)


def mask_positions(maskable, prob, seed):
    """Choose about `prob` of the maskable positions, the same ones whatever the batching.

    maskable: list of (T_k,) bool tensors, one per sentence. One uniform draw per maskable token of the whole
    corpus (in corpus order) from a generator seeded with `seed`; returns a list of (T_k,) bool tensors.
    """
    counts = [int(m.sum()) for m in maskable]
    draws = torch.rand(sum(counts), generator=torch.Generator().manual_seed(seed)) < prob
    chosen = []
    for mask, part in zip(maskable, torch.split(draws, counts)):
        positions = torch.zeros_like(mask)
        positions[mask] = part
        chosen.append(positions)
    return chosen


def masked_perplexity(predict, batches):
    """exp(mean NLL) over masked tokens, base e.

    predict(src_tokens, lang_ids, masked) -> logits (n_masked, V) for the masked positions, in row-major order.
    batches: iterable of (tokens (B,T), lang_ids (B,), masked (B,T) bool, mask_ids (B,)); the masked positions
    of `tokens` are replaced by the row's mask id, the loss is taken on those positions only.
    """
    total_nll, n_tokens = 0.0, 0
    for tokens, lang_ids, masked, mask_ids in batches:
        if not masked.any():
            continue
        inputs = torch.where(masked, mask_ids.unsqueeze(1).expand_as(tokens), tokens)
        logits = predict(inputs, lang_ids, masked)
        total_nll += float(F.cross_entropy(logits.float(), tokens[masked], reduction="sum"))
        n_tokens += int(masked.sum())
    if n_tokens == 0:
        raise XmlmError("perplexity: no token was masked (empty or all-special sentences)")
    return math.exp(total_nll / n_tokens)


# --------------------------------------------------------------------------------------------------------------
# Glue: a model and a task -> the scores
# --------------------------------------------------------------------------------------------------------------
def pad_batch(sequences, pad):
    """List of 1-D LongTensors -> (B, T) right-padded with `pad`."""
    return torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=pad)


def length_batches(lengths, max_tokens):
    """Indices grouped into batches of similar length, each at most `max_tokens` padded tokens (>= 1 item)."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    batches, current, longest = [], [], 0
    for k in order:
        longest_if_added = max(longest, lengths[k])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[k]
        current.append(k)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches


@dataclass
class PairedEncoder:
    """Encodes paired inputs of two languages and reduces them, batch by batch, to what the metrics need."""

    model: torch.nn.Module
    special_ids: torch.Tensor  # 1-D LongTensor of ids that are not words (bos/eos/pad/unk/mask of both languages)
    pad: int
    layers: tuple
    device: torch.device
    max_tokens: int = 8192

    def _states(self, inputs, lang):
        tokens = pad_batch(inputs, self.pad).to(self.device)
        lang_ids = torch.full((len(inputs),), lang, dtype=torch.long, device=self.device)
        depth = len(self.model.layers)
        if max(self.layers) > depth:
            raise XmlmError(f"layer {max(self.layers)} does not exist: the model has layers 0..{depth}")
        states = self.model.encode_layers(tokens, lang_ids, last_layer=max(self.layers))
        keep = ~torch.isin(tokens, self.special_ids.to(self.device))
        return states, keep

    def pooled_and_aligned(self, inputs_a, inputs_b, langs=(0, 1), gold_reversed=None):
        """Mean-pooled vectors {layer: (A (m,D), B (m,D))} and, unless gold_reversed is None, alignment counts
        {layer: (correct, predicted, gold)} against the identity (or reversed) alignment of the word pieces."""
        lengths = [max(len(a), len(b)) for a, b in zip(inputs_a, inputs_b)]
        order, pooled = [], {layer: ([], []) for layer in self.layers}
        counts = {layer: (0, 0, 0) for layer in self.layers}
        for batch in length_batches(lengths, self.max_tokens):
            order.extend(batch)
            states_a, keep_a = self._states([inputs_a[k] for k in batch], langs[0])
            states_b, keep_b = self._states([inputs_b[k] for k in batch], langs[1])
            for layer in self.layers:
                pooled[layer][0].append(mean_pool(states_a[layer], keep_a).float().cpu())
                pooled[layer][1].append(mean_pool(states_b[layer], keep_b).float().cpu())
                if gold_reversed is not None:
                    words_a, len_a = compact_tokens(states_a[layer], keep_a)
                    words_b, len_b = compact_tokens(states_b[layer], keep_b)
                    gold = gold_alignment(len_a, reversed_order=gold_reversed)
                    batch_counts = mutual_argmax_counts(words_a, words_b, len_a, len_b, gold)
                    counts[layer] = tuple(t + c for t, c in zip(counts[layer], batch_counts))
        # rows come out grouped by length; put them back in input order
        position = torch.empty(len(order), dtype=torch.long)
        position[torch.tensor(order)] = torch.arange(len(order))
        stacked = {layer: (torch.cat(a)[position], torch.cat(b)[position]) for layer, (a, b) in pooled.items()}
        return stacked, (counts if gold_reversed is not None else None)


def _sentence_labels(sentences):
    """Same label for identical sentences, so retrieving a verbatim repeat of the query counts as a hit."""
    seen = {}
    return torch.tensor([seen.setdefault(tuple(s.tolist()), len(seen)) for s in sentences])


def translation_words(task):
    """English vocabulary ids that are words (the task's special ids, fairseq's fillers included, left out)."""
    return [i for i in range(task.english_size) if i not in task.special_ids]


def _special_tensor(task):
    return torch.tensor(sorted(task.special_ids), dtype=torch.long)


class _EvalMode:
    """no_grad + eval() for the duration, restoring the previous training flag (the hook runs mid-training)."""

    def __init__(self, model):
        self.model, self.no_grad = model, torch.no_grad()

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        self.no_grad.__enter__()

    def __exit__(self, *exc):
        self.no_grad.__exit__(*exc)
        self.model.train(self.was_training)


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
    encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device)
    with _EvalMode(model):
        return words, encode_words(encoder, task, words)


def model_device(model):
    return next(model.parameters()).device


def multilinguality_scores(model, task, sentences, layers=(0, 8), device=None, max_tokens=8192):
    """Alignment F1, retrieval rho and translation tau per layer, and mu, of a `fake_english` model.

    sentences: English piece ids (1-D LongTensors, no specials) of the dev sentences; their Fake twins are built
    by `task.sentence_input(ids, 1)` exactly as in training (shift, reversal under inv-order, special tokens).
    Returns {"mu": f, "layers": {"0": {"align_f1", "retrieval", "translation"}, ...}, "n_sentences", "n_words"}.
    """
    if not sentences:
        raise XmlmError("multilinguality: no dev sentences to evaluate")
    device = torch.device(device) if device else model_device(model)
    encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device, max_tokens)
    words = translation_words(task)
    with _EvalMode(model):
        sentence_vectors, counts = encoder.pooled_and_aligned(
            [task.sentence_input(s, 0) for s in sentences], [task.sentence_input(s, 1) for s in sentences],
            gold_reversed=bool(task.cfg.inv_order))
        word_vectors = encode_words(encoder, task, words)
    labels = _sentence_labels(sentences)
    per_layer = {
        layer: {
            "align_f1": f1_score(*counts[layer]),
            "retrieval": precision_at_1(*sentence_vectors[layer], labels=labels),
            "translation": precision_at_1(*word_vectors[layer]),
        }
        for layer in layers
    }
    return {
        "mu": multilinguality_score(per_layer),
        "layers": {str(layer): scores for layer, scores in per_layer.items()},
        "n_sentences": len(sentences),
        "n_words": len(words),
    }


def split_perplexity(model, task, sentences_by_lang, device=None, mask_prob=0.15, seed=1, max_tokens=8192):
    """Masked-LM perplexity (base e) over the sentences of both languages: {lang: [English piece ids]}.

    `mask_prob` of the word tokens, chosen with a fixed seed, are replaced by the mask symbol only (no keep /
    random); the loss is taken on those tokens.
    """
    device = torch.device(device) if device else model_device(model)
    special = _special_tensor(task)
    inputs, langs = [], []
    for lang, sentences in sorted(sentences_by_lang.items()):
        inputs += [task.sentence_input(s, lang) for s in sentences]
        langs += [lang] * len(sentences)
    masked = mask_positions([~torch.isin(x, special) for x in inputs], mask_prob, seed)
    mask_ids = torch.tensor([task.specials_of(lang)[2] for lang in (0, 1)])  # Fake's own <mask> under shift-special
    pad = task.dictionary.pad()

    def batches():
        for batch in length_batches([len(x) for x in inputs], max_tokens):
            lang_ids = torch.tensor([langs[k] for k in batch])
            yield (pad_batch([inputs[k] for k in batch], pad).to(device), lang_ids.to(device),
                   pad_batch([masked[k] for k in batch], False).to(device), mask_ids[lang_ids].to(device))

    def predict(tokens, lang_ids, masked_positions):
        return model(tokens, lang_ids=lang_ids, masked_tokens=masked_positions)[0]

    with _EvalMode(model):
        return masked_perplexity(predict, batches())
