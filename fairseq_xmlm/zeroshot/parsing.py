"""Graph-based biaffine dependency parser (Dozat & Manning 2017) over given word representations, MST decoding,
and attachment scores.

Convention shared by every function here: a sentence of n words is represented by n + 1 positions, position 0
being the root (the caller passes a root representation there, e.g. the encoder's `<s>` state) and position i the
i-th word (its first subword's state), so a head index is exactly a CoNLL-U HEAD value.
"""
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from fairseq_xmlm.errors import XmlmError

IGNORE = -100  # target of the root and of padding (F.cross_entropy's ignore_index)


class _Projection(nn.Sequential):
    def __init__(self, input_dim, output_dim, dropout):
        super().__init__(nn.Linear(input_dim, output_dim), nn.LeakyReLU(0.1), nn.Dropout(dropout))


class BiaffineParser(nn.Module):
    """Arc scores s[b, i, j] = score that j heads i; label scores for every word given its (gold or predicted) head.

    arc:   s_ij = d_i^T U h_j + h_j^T u           (d = dependent MLP, h = head MLP)
    label: s_ijl = d'_i^T U_l h'_j + W_l [d'_i; h'_j] + b_l
    """

    def __init__(self, input_dim, num_labels, arc_dim=500, label_dim=100, dropout=0.33):
        super().__init__()
        self.arc_dependent = _Projection(input_dim, arc_dim, dropout)
        self.arc_head = _Projection(input_dim, arc_dim, dropout)
        self.label_dependent = _Projection(input_dim, label_dim, dropout)
        self.label_head = _Projection(input_dim, label_dim, dropout)
        # Zero-initialised bilinear terms, as Dozat & Manning do, so early training is driven by the linear terms.
        self.arc_bilinear = nn.Parameter(torch.zeros(arc_dim, arc_dim))
        self.arc_head_bias = nn.Parameter(torch.zeros(arc_dim))
        self.label_bilinear = nn.Parameter(torch.zeros(num_labels, label_dim, label_dim))
        self.label_linear = nn.Linear(2 * label_dim, num_labels)

    def arc_scores(self, words, mask):
        """words (B, n+1, D), mask (B, n+1) True for real positions (root included) -> (B, n+1, n+1) scores.

        Impossible heads (padding, the word itself) get -inf so softmax and argmax never choose them.
        """
        dependent, head = self.arc_dependent(words), self.arc_head(words)
        scores = dependent @ self.arc_bilinear @ head.transpose(1, 2) + (head @ self.arc_head_bias).unsqueeze(1)
        positions = torch.arange(words.size(1), device=words.device)
        impossible = ~mask.unsqueeze(1) | (positions.unsqueeze(0) == positions.unsqueeze(1)).unsqueeze(0)
        return scores.masked_fill(impossible, float("-inf"))

    def label_scores(self, words, heads):
        """words (B, n+1, D), heads (B, n+1) head index of every position -> (B, n+1, num_labels)."""
        dependent = self.label_dependent(words)
        head_states = self.label_head(words)
        head = head_states.gather(1, heads.clamp(min=0).unsqueeze(-1).expand_as(head_states))
        bilinear = torch.einsum("bnd,lde,bne->bnl", dependent, self.label_bilinear, head)
        return bilinear + self.label_linear(torch.cat([dependent, head], dim=-1))

    def loss(self, words, mask, gold_heads, gold_labels):
        """Cross-entropy of gold heads plus of gold labels given gold heads, averaged over words (not the root).

        gold_heads / gold_labels (B, n+1); their values at the root and at padding are ignored.
        """
        word_mask = mask.clone()
        word_mask[:, 0] = False
        # ignore_index rather than boolean indexing: the same mean over words, without waiting for the GPU
        heads = gold_heads.masked_fill(~word_mask, IGNORE)
        labels = gold_labels.masked_fill(~word_mask, IGNORE)
        arc_loss = F.cross_entropy(self.arc_scores(words, mask).flatten(0, 1), heads.flatten(), ignore_index=IGNORE)
        label_scores = self.label_scores(words, gold_heads)
        return arc_loss + F.cross_entropy(label_scores.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    @torch.no_grad()
    def predict(self, words, mask, decoder="mst"):
        """-> (heads, labels): two lists of per-sentence int lists for words 1..n (root excluded)."""
        arc_scores = self.arc_scores(words, mask).float().cpu().numpy()  # decoding runs on the CPU
        lengths = mask.sum(1).tolist()
        heads = torch.zeros(mask.shape, dtype=torch.long)
        for index, length in enumerate(lengths):
            heads[index, :length] = torch.as_tensor(decode_heads(arc_scores[index, :length, :length], decoder))
        labels = self.label_scores(words, heads.to(words.device)).argmax(-1).cpu()
        return ([heads[i, 1:n].tolist() for i, n in enumerate(lengths)],
                [labels[i, 1:n].tolist() for i, n in enumerate(lengths)])


def _find_cycle(heads):
    """A list of the nodes of one cycle in a head array (heads[0] = -1 for the root), or None."""
    color = [0] * len(heads)  # 0 unvisited, 1 on the current path, 2 done
    for start in range(1, len(heads)):
        path = []
        node = start
        while node > 0 and color[node] == 0:
            color[node] = 1
            path.append(node)
            node = heads[node]
        if node > 0 and color[node] == 1:
            return path[path.index(node):]
        for visited in path:
            color[visited] = 2
    return None


def chu_liu_edmonds(scores):
    """Maximum spanning arborescence rooted at 0: scores[dependent, head] (n+1, n+1) -> heads array, heads[0] = -1."""
    scores = np.array(scores, dtype=np.float64)
    size = scores.shape[0]
    scores[0, :] = -np.inf
    np.fill_diagonal(scores, -np.inf)
    heads = scores.argmax(axis=1)
    heads[0] = -1
    cycle = _find_cycle(heads)
    if cycle is None:
        return heads
    in_cycle = np.zeros(size, dtype=bool)
    in_cycle[cycle] = True
    outside = np.flatnonzero(~in_cycle)  # outside[0] == 0: the root is never in a cycle
    cycle_nodes = np.flatnonzero(in_cycle)
    contracted_node = len(outside)
    contracted = np.full((contracted_node + 1, contracted_node + 1), -np.inf)
    contracted[:contracted_node, :contracted_node] = scores[np.ix_(outside, outside)]
    # An arc leaving the cycle: its best head inside the cycle.
    leaving = scores[np.ix_(outside, cycle_nodes)]
    best_cycle_head = cycle_nodes[leaving.argmax(axis=1)]
    contracted[:contracted_node, contracted_node] = leaving.max(axis=1)
    # An arc entering the cycle at d replaces d's cycle arc: score gain relative to the cycle.
    entering = scores[np.ix_(cycle_nodes, outside)] - scores[cycle_nodes, heads[cycle_nodes]][:, None]
    best_cycle_dependent = cycle_nodes[entering.argmax(axis=0)]
    contracted[contracted_node, :contracted_node] = entering.max(axis=0)
    contracted_heads = chu_liu_edmonds(contracted)
    result = heads.copy()
    for index, node in enumerate(outside[1:], start=1):
        head = contracted_heads[index]
        result[node] = best_cycle_head[index] if head == contracted_node else outside[head]
    entry_head = outside[contracted_heads[contracted_node]]
    result[best_cycle_dependent[contracted_heads[contracted_node]]] = entry_head
    return result


def _tree_score(scores, heads):
    return scores[np.arange(1, len(heads)), heads[1:]].sum()


def decode_heads(scores, decoder="mst"):
    """Heads for positions 0..n from arc scores[dependent, head]; heads[0] = 0 by convention of the caller's array.

    "argmax": each word's best head independently (may contain cycles). "mst": Chu-Liu-Edmonds maximum spanning
    tree with exactly one word attached to the root, as UD requires: when the unconstrained tree has several root
    dependents, every single root dependent is tried and the best tree kept.
    """
    scores = np.asarray(scores, dtype=np.float64)
    if decoder == "argmax":
        masked = scores.copy()
        np.fill_diagonal(masked, -np.inf)
        heads = masked.argmax(axis=1)
    elif decoder == "mst":
        heads = chu_liu_edmonds(scores)
        if (heads[1:] == 0).sum() > 1:
            best = None
            for root_dependent in range(1, scores.shape[0]):
                constrained = scores.copy()
                constrained[1:, 0] = -np.inf
                constrained[root_dependent, 0] = scores[root_dependent, 0]
                candidate = chu_liu_edmonds(constrained)
                total = _tree_score(scores, candidate)
                if best is None or total > best[0]:
                    best = (total, candidate)
            heads = best[1]
    else:
        raise XmlmError(f"unknown decoder {decoder!r} (expected 'mst' or 'argmax')")
    heads = np.array(heads)
    heads[0] = 0
    return heads


def attachment_scores(gold_heads, gold_rels, pred_heads, pred_rels, exclude_punct=False):
    """UAS and LAS (percent) over all words of all sentences (lists of per-sentence lists, words 1..n).

    Punctuation: by default every word is scored, as in the CoNLL 2018 UD shared task evaluation; with
    `exclude_punct=True` words whose gold relation is `punct` are left out (the older CoNLL-X convention).
    Relations are compared on their universal part (`nsubj:pass` counts as `nsubj`), as the UD evaluation does.
    """
    if not len(gold_heads) == len(gold_rels) == len(pred_heads) == len(pred_rels):
        raise XmlmError("attachment_scores: gold and predicted trees differ in number of sentences")
    total = unlabeled = labeled = 0
    for index, sentence in enumerate(zip(gold_heads, gold_rels, pred_heads, pred_rels)):
        if len({len(part) for part in sentence}) != 1:
            raise XmlmError(f"attachment_scores: sentence {index} has gold and predicted trees of different lengths")
        for gold_head, gold_rel, pred_head, pred_rel in zip(*sentence):
            gold_rel, pred_rel = gold_rel.split(":")[0], pred_rel.split(":")[0]
            if exclude_punct and gold_rel == "punct":
                continue
            total += 1
            if gold_head == pred_head:
                unlabeled += 1
                labeled += gold_rel == pred_rel
    if total == 0:
        raise XmlmError("attachment_scores: no words to score")
    return {"uas": 100.0 * unlabeled / total, "las": 100.0 * labeled / total, "words": total}
