"""Contextual word alignment (Conneau et al. 2020, section 5.1.2), measured on parallel verses.

The paper maps layer i of one model onto layer i of the other with Procrustes learned on "a dictionary of parallel
contextual words" (fastAlign links in 10k parallel XNLI sentences) and judges the map by zero-shot NER and
parsing. We judge the alignment itself, within parallel verses, per layer:

1. an occurrence's vector at layer l is the mean of its pieces' states (`word_vectors.word_states`); words are
   `vocabulary.sentence_words` (jieba's for Chinese);
2. links stand in for fastAlign: in a parallel verse pair, source word i and target word j are linked when their
   lowercased forms are a dictionary pair and neither has another dictionary partner in the verse pair
   (`dictionary_links`: one-to-one links only, so that a link is unambiguous);
3. after iterative normalisation of each language's vectors (Zhang et al. 2019, as in the paper), W = U V^T with
   U S V^T = SVD(X^T Y) (Procrustes, Schönemann 1966), X and Y the linked source / target vectors of the training
   verses;
4. in each held-out verse pair a linked source word x is aligned to the target word y of that verse maximising
   cos(xW, y) ("nn") or CSLS 2 cos(xW, y) - r_S(y) (Conneau et al. 2018; r_S(y) the mean cosine of y with its
   k = 10 nearest mapped source words of all held-out verses; r_T(x) is constant for x and drops out). Accuracy =
   the fraction of linked source words aligned to their linked word; chance = the mean over them of
   1 / (words of their target verse).

`contextual_alignment_by_layer` reports the mean of both directions (source -> target with W, target -> source
with W^T learned the other way).
"""
import collections

import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, mean_topk_similarity, normalize_rows, procrustes
from fairseq_xmlm.analysis.word_vectors import dictionary_pairs, model_words, word_states
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log

QUERY_CHUNK = 4096


def dictionary_links(source_words, target_words, translations):
    """[(i, j)]: source word i and target word j of one sentence pair are a dictionary pair (`translations`:
    {source word: set of target words}, lowercase) and neither has another dictionary partner in the pair."""
    at = collections.defaultdict(list)
    for j, word in enumerate(target_words):
        at[word.lower()].append(j)
    links = [(i, j) for i, word in enumerate(source_words) for target in translations.get(word.lower(), ())
             for j in at.get(target, ())]
    per_source = collections.Counter(i for i, _ in links)
    per_target = collections.Counter(j for _, j in links)
    return [(i, j) for i, j in links if per_source[i] == 1 and per_target[j] == 1]


def align_within_sentences(queries, keys, query_sentence, key_sentence, method="nn", hubness=None):
    """For each query row, the index of the most similar key row of the same sentence (cosine, or CSLS given the
    keys' `hubness` r(y)): -> (best key index, number of keys of that sentence). Rows are unit length."""
    order = torch.argsort(key_sentence, stable=True)
    n_sentences = int(max(key_sentence.max(), query_sentence.max())) + 1
    per_sentence = torch.bincount(key_sentence, minlength=n_sentences)
    offsets = torch.cumsum(per_sentence, 0) - per_sentence
    width = int(per_sentence.max())
    best = torch.empty(len(queries), dtype=torch.long, device=queries.device)
    for start in range(0, len(queries), QUERY_CHUNK):
        sentence = query_sentence[start:start + QUERY_CHUNK]
        slot = torch.arange(width, device=queries.device)
        valid = slot[None, :] < per_sentence[sentence][:, None]
        candidates = order[(offsets[sentence][:, None] + slot[None, :]).clamp(max=len(order) - 1)]
        scores = torch.einsum("qd,qkd->qk", queries[start:start + QUERY_CHUNK], keys[candidates])
        if method == "csls":
            scores = 2 * scores - hubness[candidates]
        scores = scores.masked_fill(~valid, float("-inf"))
        best[start:start + QUERY_CHUNK] = candidates.gather(1, scores.argmax(1, keepdim=True)).squeeze(1)
    return best, per_sentence[query_sentence]


def alignment_accuracy(train_source, train_target, test_source, test_target, source_sentence, target_sentence,
                       links, method="nn", csls_k=10):
    """Procrustes on the linked training rows (train_source[k] <-> train_target[k]), then within-sentence
    alignment of the held-out words (module docstring, steps 3-4).

    test_source (n, D) / test_target (m, D): every word of the held-out sentences, `source_sentence` (n,) /
    `target_sentence` (m,) their sentence numbers; links (g, 2): (source row, target row), one-to-one.
    -> {"accuracy", "chance", "links"}.
    """
    if method not in ("nn", "csls"):
        raise XmlmError(f"unknown alignment method {method!r} (nn or csls)")
    links = torch.as_tensor(links, dtype=torch.long).reshape(-1, 2)
    if len(train_source) < 2 or len(links) == 0:
        raise XmlmError(f"contextual alignment needs linked words: {len(train_source)} training links, "
                        f"{len(links)} held-out links")
    source = iterative_normalize(torch.cat([torch.as_tensor(train_source), torch.as_tensor(test_source)]).float())
    target = iterative_normalize(torch.cat([torch.as_tensor(train_target), torch.as_tensor(test_target)]).float())
    n_train = len(train_source)
    w = procrustes(source[:n_train], target[:n_train])
    mapped, keys = normalize_rows(source[n_train:] @ w), target[n_train:]
    hubness = mean_topk_similarity(keys, mapped, csls_k) if method == "csls" else None
    device = mapped.device
    source_sentence = torch.as_tensor(source_sentence, device=device)
    target_sentence = torch.as_tensor(target_sentence, device=device)
    links = links.to(device)
    best, candidates = align_within_sentences(mapped[links[:, 0]], keys, source_sentence[links[:, 0]],
                                              target_sentence, method, hubness)
    return {"accuracy": (best == links[:, 1]).float().mean().item(),
            "chance": (1.0 / candidates.float()).mean().item(), "links": len(links)}


# ---- model side ----
def _verse_words(task, lang, sentences):
    return [model_words(task, lang, ids) for ids in sentences]


def _parallel_split(task, split, langs, max_sentences):
    sides = [task.load_split_sentences(split, lang)[:max_sentences] for lang in langs]
    if len(sides[0]) != len(sides[1]):
        raise XmlmError(f"the {split} split has {len(sides[0])} sentences in {task.langs[langs[0]]} but "
                        f"{len(sides[1])} in {task.langs[langs[1]]}: they must be parallel")
    return sides


def contextual_alignment_by_layer(model, task, dictionary, split_train="train", split_test="test", langs=(0, 1),
                                  method="nn", max_train_sentences=10000, device=None, max_tokens=8192):
    """{layer (str): contextual word alignment accuracy}, the mean of both directions (module docstring).

    `dictionary`: a MUSE file or (word of langs[0], word of langs[1]) pairs. Procrustes is learned on the links
    of the first `max_train_sentences` verse pairs of `split_train`, accuracy measured on every verse pair of
    `split_test`. `device`: where the model is (default: its parameters' device).
    """
    translations = collections.defaultdict(set)
    for source, target in dictionary_pairs(dictionary):
        translations[source.lower()].add(target.lower())
    train = _parallel_split(task, split_train, langs, max_train_sentences)
    train_words = [_verse_words(task, lang, sentences) for lang, sentences in zip(langs, train)]
    occurrences = ([], [])
    for k, (words_a, words_b) in enumerate(zip(*train_words)):
        for i, j in dictionary_links([w for w, _ in words_a], [w for w, _ in words_b], translations):
            occurrences[0].append((k, words_a[i][1], len(occurrences[0])))
            occurrences[1].append((k, words_b[j][1], len(occurrences[1])))
    test = _parallel_split(task, split_test, langs, None)
    test_words = [_verse_words(task, lang, sentences) for lang, sentences in zip(langs, test)]
    rows = [[], []]  # per side: (verse, [piece positions], row)
    links = []
    for k, (words_a, words_b) in enumerate(zip(*test_words)):
        offset_a, offset_b = len(rows[0]), len(rows[1])
        for side, words in enumerate((words_a, words_b)):
            rows[side] += [(k, positions, len(rows[side]) + n) for n, (_, positions) in enumerate(words)]
        links += [(offset_a + i, offset_b + j)
                  for i, j in dictionary_links([w for w, _ in words_a], [w for w, _ in words_b], translations)]
    if not occurrences[0] or not links:
        raise XmlmError(f"no dictionary pair links a word of {split_train if not occurrences[0] else split_test} "
                        f"verses in {task.langs[langs[0]]} to one in {task.langs[langs[1]]}: wrong dictionary or "
                        f"language order?")
    train_states = [word_states(model, task, lang, sentences, occ, len(occ), device, max_tokens)[0]
                    for lang, sentences, occ in zip(langs, train, occurrences)]
    test_states = [word_states(model, task, lang, sentences, side_rows, len(side_rows), device, max_tokens)[0]
                   for lang, sentences, side_rows in zip(langs, test, rows)]
    sentence = [torch.tensor([k for k, _, _ in side_rows]) for side_rows in rows]
    links = torch.tensor(links)
    scores, chance = {}, None
    for layer in range(len(train_states[0])):
        forward = alignment_accuracy(train_states[0][layer], train_states[1][layer], test_states[0][layer],
                                     test_states[1][layer], sentence[0], sentence[1], links, method)
        backward = alignment_accuracy(train_states[1][layer], train_states[0][layer], test_states[1][layer],
                                      test_states[0][layer], sentence[1], sentence[0], links.flip(1), method)
        scores[str(layer)] = (forward["accuracy"] + backward["accuracy"]) / 2
        chance = (forward["chance"] + backward["chance"]) / 2
    log(f"contextual alignment: {len(occurrences[0])} training links, {len(links)} held-out links (chance "
        f"{chance:.3f}), accuracy by layer {[round(value, 3) for value in scores.values()]}")
    return scores
