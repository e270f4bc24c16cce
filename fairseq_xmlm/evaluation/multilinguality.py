"""Degree of multilinguality (Dufter & Schuetze 2020, section 2.2): the metrics, on plain tensors.

They serve Fake-English twins and real parallel text alike:
- `mutual_argmax_counts`: word alignment by mutual argmax of cosine similarity (Sabet et al. 2020's Argmax),
  counted against a gold alignment (`gold_alignment`), for a whole batch of padded sentence pairs at once; `f1_score`;
- `mean_pool`: sentence vectors as the mean of token vectors, special tokens excluded;
- `precision_at_1`: retrieval P@1 by cosine, in chunks, averaged over both directions (rho and tau); one-to-one
  (with labels for repeated items) or against a many-to-many gold relation (a word dictionary);
- `multilinguality_score`: mu, the mean of the rho and tau values that are defined;
- `mask_positions`: the tokens a perplexity masks, the same ones whatever the batching.

`encode.py` turns a model's states into these inputs; `scores.py` glues both to a model and a task.
"""
import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError


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
