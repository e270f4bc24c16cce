"""Degree of multilinguality (Dufter & Schuetze 2020, section 2.2) and masked-LM perplexity.

The metric functions work on plain tensors, so they serve Fake-English twins and real parallel text alike:
- `mutual_argmax_counts`: word alignment by mutual argmax of cosine similarity (Sabet et al. 2020's Argmax),
  counted against a gold alignment, for a whole batch of padded sentence pairs at once;
- `mean_pool`: sentence vectors as the mean of token vectors, special tokens excluded;
- `precision_at_1`: retrieval P@1 by cosine, in chunks, averaged over both directions (rho and tau); one-to-one
  (with labels for repeated items) or against a many-to-many gold relation (a word dictionary);
- `multilinguality_score`: mu, the mean of the rho and tau values that are defined;
- `masked_perplexity`: exp of the mean NLL on tokens replaced by the mask symbol.

`multilinguality_scores(model, task, sentences, layers, device)` glues them to a model and a `fake_english` task;
`xmlm-eval-mult` and the task's validation hook both call it. `bilingual_scores(model, task, first, second, ...)`
does the same for two real languages (`bilingual_mlm`): rho on parallel sentences, tau on a word dictionary
(`dictionary_translation`), no alignment F1; `xmlm-eval-mult` and the Conneau Table 1 driver call it or its parts.
`split_perplexity` serves both tasks.
"""
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.vocabulary import join_sentences


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


def _p_at_1_one_way(queries, keys, is_hit, chunk_size):
    """Share of queries whose cosine-nearest key is a hit; is_hit(query rows, best key rows) -> bool tensor."""
    keys = F.normalize(keys.float(), dim=-1)
    hits = 0
    for start in range(0, len(queries), chunk_size):
        block = F.normalize(queries[start : start + chunk_size].float(), dim=-1)
        best = (block @ keys.T).argmax(dim=1)
        hits += int(is_hit(torch.arange(start, start + len(block), device=best.device), best).sum())
    return hits / len(queries)


def precision_at_1(vectors_a, vectors_b, labels=None, gold=None, chunk_size=1024):
    """Cosine P@1 of finding row i of b for query row i of a and vice versa, averaged over both directions.

    labels (m,) marks rows that are the same item (e.g. a sentence occurring twice in the corpus): retrieving
    any row with the query's label counts as a hit. Default: every row is its own item.
    gold (n_a, n_b) bool, instead of labels, for sets of different sizes (a word dictionary, many-to-many): row j
    of b is a correct answer for row i of a iff gold[i, j]; the queries of each direction are the rows with at
    least one correct answer, the candidates all rows of the other set.
    """
    if gold is not None:
        gold = gold.to(vectors_a.device)
        if tuple(gold.shape) != (len(vectors_a), len(vectors_b)):
            raise XmlmError(f"gold is {tuple(gold.shape)}, the sets have {len(vectors_a)} and {len(vectors_b)} rows")
        queries_a, queries_b = gold.any(dim=1).nonzero().squeeze(1), gold.any(dim=0).nonzero().squeeze(1)
        if len(queries_a) == 0:
            raise XmlmError("retrieval: the gold relation is empty")
        forward = _p_at_1_one_way(vectors_a[queries_a], vectors_b, lambda rows, best: gold[queries_a[rows], best],
                                  chunk_size)
        backward = _p_at_1_one_way(vectors_b[queries_b], vectors_a,
                                   lambda rows, best: gold[best, queries_b[rows]], chunk_size)
        return (forward + backward) / 2
    if len(vectors_a) != len(vectors_b) or len(vectors_a) == 0:
        raise XmlmError(f"retrieval needs two equally long non-empty sets, got {len(vectors_a)} and {len(vectors_b)}")
    if labels is None:
        labels = torch.arange(len(vectors_a))
    labels = labels.to(vectors_a.device)

    def same_label(rows, best):
        return labels[best] == labels[rows]

    forward = _p_at_1_one_way(vectors_a, vectors_b, same_label, chunk_size)
    backward = _p_at_1_one_way(vectors_b, vectors_a, same_label, chunk_size)
    return (forward + backward) / 2


def multilinguality_parts(per_layer):
    """The scores mu averages, as {"tau0": .., "rho0": .., ...}: translation (tau) and retrieval (rho) of every
    layer of {layer: {"retrieval", "translation"}} where they are defined (None: not measured, left out)."""
    return {f"{symbol}{layer}": scores[name] for layer, scores in per_layer.items()
            for symbol, name in (("tau", "translation"), ("rho", "retrieval")) if scores[name] is not None}


def multilinguality_score(per_layer):
    """mu: the mean of the retrieval and translation scores defined at the given layers."""
    values = list(multilinguality_parts(per_layer).values())
    if not values:
        raise XmlmError("mu: no retrieval or translation score to average")
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


# --------------------------------------------------------------------------------------------------------------
# Glue: a model and a task -> the scores
# --------------------------------------------------------------------------------------------------------------
def ordered_map(function, items, workers):
    """[function(item) for item in items], spread over `workers` threads, each call under inference_mode (grad
    mode is per thread).

    A small model's batches go fastest on CPU through single-threaded workers, one batch each (`_EvalMode` sets
    torch to one thread): torch's own threads split every small op and wait for each other after it, and when
    another process shares the cores, one descheduled thread stalls them all (BERT-small on 2 busy cores: 2.5x
    the CPU time of one thread). torch releases the GIL inside its ops, so the workers truly run side by side.
    """
    def call(item):
        with torch.inference_mode():
            return function(item)

    if workers <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(call, items))


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
    workers: int = 1  # threads encoding batches side by side (`ordered_map`)

    def _states(self, inputs, lang):
        tokens = pad_batch(inputs, self.pad).to(self.device)
        lang_ids = torch.full((len(inputs),), lang, dtype=torch.long, device=self.device)
        depth = len(self.model.layers)
        if max(self.layers) > depth:
            raise XmlmError(f"layer {max(self.layers)} does not exist: the model has layers 0..{depth}")
        states = self.model.encode_layers(tokens, lang_ids, last_layer=max(self.layers))
        keep = ~torch.isin(tokens, self.special_ids.to(self.device))
        return states, keep

    def _paired_batch(self, inputs_a, inputs_b, langs, gold_reversed):
        """{layer: (pooled A, pooled B)} and {layer: alignment counts} (None when gold_reversed is) of one batch."""
        states_a, keep_a = self._states(inputs_a, langs[0])
        states_b, keep_b = self._states(inputs_b, langs[1])
        pooled, counts = {}, ({} if gold_reversed is not None else None)
        for layer in self.layers:
            pooled[layer] = (mean_pool(states_a[layer], keep_a).float().cpu(),
                             mean_pool(states_b[layer], keep_b).float().cpu())
            if gold_reversed is not None:
                words_a, len_a = compact_tokens(states_a[layer], keep_a)
                words_b, len_b = compact_tokens(states_b[layer], keep_b)
                gold = gold_alignment(len_a, reversed_order=gold_reversed)
                counts[layer] = mutual_argmax_counts(words_a, words_b, len_a, len_b, gold)
        return pooled, counts

    def pooled_and_aligned(self, inputs_a, inputs_b, langs=(0, 1), gold_reversed=None):
        """Mean-pooled vectors {layer: (A (m,D), B (m,D))} and, unless gold_reversed is None, alignment counts
        {layer: (correct, predicted, gold)} against the identity (or reversed) alignment of the word pieces."""
        batches = length_batches([max(len(a), len(b)) for a, b in zip(inputs_a, inputs_b)], self.max_tokens)
        per_batch = ordered_map(lambda batch: self._paired_batch(
            [inputs_a[k] for k in batch], [inputs_b[k] for k in batch], langs, gold_reversed), batches, self.workers)
        position = _input_positions([k for batch in batches for k in batch])
        stacked = {layer: tuple(torch.cat([pooled[layer][side] for pooled, _ in per_batch])[position]
                                for side in (0, 1)) for layer in self.layers}
        if gold_reversed is None:
            return stacked, None
        return stacked, {layer: tuple(sum(counts[layer][k] for _, counts in per_batch) for k in range(3))
                         for layer in self.layers}

    def pooled(self, inputs, lang):
        """Mean-pooled vectors {layer: (m, D)} of the inputs of ONE language (sets of different sizes)."""
        def pool_batch(batch):
            states, keep = self._states([inputs[k] for k in batch], lang)
            return {layer: mean_pool(states[layer], keep).float().cpu() for layer in self.layers}

        batches = length_batches([len(x) for x in inputs], self.max_tokens)
        per_batch = ordered_map(pool_batch, batches, self.workers)
        position = _input_positions([k for batch in batches for k in batch])
        return {layer: torch.cat([pooled[layer] for pooled in per_batch])[position] for layer in self.layers}


def _input_positions(order):
    """Rows come out of length_batches grouped by length: the index of each input's row, to restore input order."""
    position = torch.empty(len(order), dtype=torch.long)
    position[torch.tensor(order)] = torch.arange(len(order))
    return position


def _sentence_labels(*sides):
    """Same label for identical sentences (identical pairs, given both sides of parallel text), so retrieving a
    verbatim repeat of the query counts as a hit."""
    seen = {}
    return torch.tensor([seen.setdefault(tuple(tuple(s.tolist()) for s in row), len(seen)) for row in zip(*sides)])


def translation_words(task):
    """English vocabulary ids that are words (the task's special ids, fairseq's fillers included, left out)."""
    return [i for i in range(task.english_size) if i not in task.special_ids]


def _special_tensor(task):
    return torch.tensor(sorted(task.special_ids), dtype=torch.long)


class _EvalMode:
    """inference_mode + eval() for the duration, restoring the previous training flag (the hook runs mid-training).

    inference_mode rather than no_grad: no version counters or views tracked, measurably faster on the CPU.
    On CPU torch runs single-threaded meanwhile and `with` gives the number of threads it had, to use as
    `ordered_map` workers (restored on exit); on GPU one worker.
    """

    def __init__(self, model, device):
        self.model, self.device, self.inference = model, device, torch.inference_mode()

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        self.inference.__enter__()
        self.threads = torch.get_num_threads()
        if self.device.type != "cpu":
            return 1
        torch.set_num_threads(1)
        return self.threads

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)
        self.inference.__exit__(*exc)
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
    with _EvalMode(model, device) as workers:
        encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device,
                                workers=workers)
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
    words = translation_words(task)
    with _EvalMode(model, device) as workers:
        encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device,
                                max_tokens, workers)
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
        "mu_parts": list(multilinguality_parts(per_layer)),
        "layers": {str(layer): scores for layer, scores in per_layer.items()},
        "n_sentences": len(sentences),
        "n_words": len(words),
    }


# --------------------------------------------------------------------------------------------------------------
# Glue for two real languages (bilingual_mlm): parallel text and a word dictionary
# --------------------------------------------------------------------------------------------------------------
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
    with _EvalMode(model, device) as workers:
        encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device,
                                max_tokens, workers)
        pooled, _ = encoder.pooled_and_aligned([task.sentence_input(s, 0) for s in first],
                                               [task.sentence_input(s, 1) for s in second], langs=(0, 1))
    labels = _sentence_labels(first, second)
    return {layer: precision_at_1(*pooled[layer], labels=labels) for layer in layers}


def word_symbols(task, lang):
    """{word: dictionary id} of the words of language `lang` that are ONE dictionary symbol.

    A word w is the symbol `▁w` (joint / separate sentencepiece) or `<lang>:▁w` (prefixed mode), and that symbol
    must occur as a whole word in the language's training text (followed by a word-initial piece or the sentence
    end): a joint vocabulary's `▁of` is also the start of French `offrande`, which makes it no French word."""
    from fairseq_xmlm.analysis.cli import WORD_START, piece_text

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
    with _EvalMode(model, device) as workers:
        encoder = PairedEncoder(model, _special_tensor(task), task.dictionary.pad(), tuple(layers), device,
                                max_tokens, workers)
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


def mask_symbol(task, lang):
    """The mask id language `lang` trains with: Fake-English's own <mask> under shift-special, else the one <mask>."""
    return task.specials_of(lang)[2] if hasattr(task, "specials_of") else task.mask_idx


def split_perplexity(model, task, sentences_by_lang, device=None, mask_prob=0.15, seed=1, max_tokens=8192):
    """Masked-LM perplexity (base e) over the sentences of the given languages: {lang: [piece ids]} (Fake-English:
    English piece ids, `task.sentence_input` builds the Fake side).

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
    mask_ids = torch.tensor([mask_symbol(task, lang) for lang in range(len(task.langs))])
    pad = task.dictionary.pad()

    def batches():
        for batch in length_batches([len(x) for x in inputs], max_tokens):
            lang_ids = torch.tensor([langs[k] for k in batch])
            yield (pad_batch([inputs[k] for k in batch], pad).to(device), lang_ids.to(device),
                   pad_batch([masked[k] for k in batch], False).to(device), mask_ids[lang_ids].to(device))

    def predict(tokens, lang_ids, masked_positions):
        return model(tokens, lang_ids=lang_ids, masked_tokens=masked_positions)[0]

    with _EvalMode(model, device) as workers:
        return masked_perplexity(predict, batches(), workers)
