"""Biaffine parser, MST decoding and LAS/UAS on hand-made trees."""
import itertools

import numpy as np
import pytest
import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.zeroshot.parsing import BiaffineParser, attachment_scores, chu_liu_edmonds, decode_heads

# "The cat sat on the mat ." (UD style)
GOLD_HEADS = [2, 3, 0, 6, 6, 3, 3]
GOLD_RELS = ["det", "nsubj", "root", "case", "det", "obl", "punct"]


def test_attachment_scores_hand_made_tree():
    pred_heads = [2, 3, 0, 3, 6, 3, 3]  # "on" attached to "sat" instead of "mat"
    pred_rels = ["det", "obj", "root", "case", "det", "obl:tmod", "punct"]  # obl:tmod counts as obl
    # heads right on 6/7 words; labels also right on words 1, 3, 5, 6, 7 -> LAS 5/7
    scores = attachment_scores([GOLD_HEADS], [GOLD_RELS], [pred_heads], [pred_rels])
    assert scores == {"uas": pytest.approx(600 / 7), "las": pytest.approx(500 / 7), "words": 7}
    without_punct = attachment_scores([GOLD_HEADS], [GOLD_RELS], [pred_heads], [pred_rels], exclude_punct=True)
    assert without_punct == {"uas": pytest.approx(500 / 6), "las": pytest.approx(400 / 6), "words": 6}
    with pytest.raises(XmlmError, match="sentence 0 has gold and predicted trees of different lengths"):
        attachment_scores([GOLD_HEADS], [GOLD_RELS], [pred_heads[:-1]], [pred_rels])


def _is_tree(heads):
    for start in range(1, len(heads)):
        node, steps = start, 0
        while node != 0:
            node, steps = heads[node], steps + 1
            if steps > len(heads):
                return False
    return True


def _best_tree_by_enumeration(scores, single_root):
    n = scores.shape[0]
    best = None
    for assignment in itertools.product(range(n), repeat=n - 1):
        heads = (0, *assignment)
        if any(heads[i] == i for i in range(1, n)) or not _is_tree(heads):
            continue
        if single_root and sum(h == 0 for h in heads[1:]) != 1:
            continue
        total = sum(scores[i, heads[i]] for i in range(1, n))
        if best is None or total > best[0]:
            best = (total, heads)
    return best


def test_chu_liu_edmonds_breaks_a_cycle():
    scores = np.zeros((4, 4))
    scores[1, 2] = scores[2, 1] = 10  # the greedy choice is the cycle 1 <-> 2
    scores[1, 0], scores[2, 0], scores[3, 2] = 5, 1, 8
    assert decode_heads(scores, "argmax").tolist() == [0, 2, 1, 2]
    # root -> 1 -> 2 -> 3 scores 5 + 10 + 8 = 23, better than root -> 2 (1 + 10 + 8)
    assert chu_liu_edmonds(scores).tolist()[1:] == [0, 1, 2]


@pytest.mark.parametrize("seed", range(25))
def test_mst_matches_exhaustive_search(seed):
    rng = np.random.default_rng(seed)
    scores = rng.normal(size=(5, 5))
    heads = chu_liu_edmonds(scores)
    total, _ = _best_tree_by_enumeration(scores, single_root=False)
    assert _is_tree(heads) and scores[np.arange(1, 5), heads[1:]].sum() == pytest.approx(total)
    heads = decode_heads(scores, "mst")
    total, _ = _best_tree_by_enumeration(scores, single_root=True)
    assert _is_tree(heads) and (heads[1:] == 0).sum() == 1
    assert scores[np.arange(1, 5), heads[1:]].sum() == pytest.approx(total)


def test_biaffine_parser_learns_two_trees():
    torch.manual_seed(0)
    labels = sorted(set(GOLD_RELS) | {"obj"})
    second_heads, second_rels = [0, 1, 1], ["root", "obj", "punct"]
    # root state + one state per word; padding fills the shorter sentence
    words = torch.randn(2, 8, 16)
    mask = torch.tensor([[True] * 8, [True] * 4 + [False] * 4])
    heads = torch.tensor([[0] + GOLD_HEADS, [0] + second_heads + [0] * 4])
    rels = torch.tensor([[0] + [labels.index(r) for r in GOLD_RELS],
                         [0] + [labels.index(r) for r in second_rels] + [0] * 4])
    parser = BiaffineParser(16, len(labels), arc_dim=32, label_dim=16, dropout=0.0)
    optimizer = torch.optim.Adam(parser.parameters(), lr=1e-2)
    first_loss = None
    for _ in range(150):
        optimizer.zero_grad()
        loss = parser.loss(words, mask, heads, rels)
        first_loss = first_loss or loss.item()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05 * first_loss
    pred_heads, pred_rels = parser.predict(words, mask)
    assert pred_heads == [GOLD_HEADS, second_heads]
    assert [[labels[r] for r in sentence] for sentence in pred_rels] == [GOLD_RELS, second_rels]
    scores = parser.arc_scores(words, mask)
    assert torch.isinf(scores[1, :, 4:]).all() and torch.isinf(scores[0].diagonal()).all()
