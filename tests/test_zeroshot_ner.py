"""BIO repair (Conneau et al.'s post-processing) and span-level F1 against hand-computed cases."""
import pytest

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.zeroshot.ner import repair_bio, span_f1, spans


@pytest.mark.parametrize("tags, repaired", [
    (["I-PER"], ["B-PER"]),
    (["O", "I-LOC", "O"], ["O", "B-LOC", "O"]),
    (["B-LOC", "I-PER", "I-ORG"], ["B-ORG", "I-ORG", "I-ORG"]),
    (["I-PER", "I-LOC", "O", "B-PER", "I-LOC"], ["B-LOC", "I-LOC", "O", "B-LOC", "I-LOC"]),
    (["B-PER", "B-PER", "I-PER", "O"], ["B-PER", "B-PER", "I-PER", "O"]),
    ([], []),
])
def test_repair_bio(tags, repaired):
    assert repair_bio(tags) == repaired
    assert repair_bio(repaired) == repaired


def test_spans_follow_the_repair():
    assert spans(["B-PER", "I-PER", "O", "I-LOC", "B-MISC", "I-ORG"]) == {
        ("PER", 0, 2), ("LOC", 3, 4), ("ORG", 4, 6)}
    with pytest.raises(XmlmError, match="'S-PER' is not a BIO tag"):
        spans(["S-PER"])


def test_span_f1_hand_computed():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O", "B-LOC", "I-LOC"]]
    pred = [["B-PER", "I-PER", "O", "I-LOC"],  # both right (standalone I-LOC repaired into LOC 3-4)
            ["B-MISC", "I-ORG", "B-LOC", "O"]]  # ORG 0-2 (wrong end), LOC 2-3 (wrong end)
    # gold spans 4, predicted 4, correct 2 -> P = R = F1 = 0.5
    assert span_f1(gold, pred) == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "correct": 2, "gold": 4,
                                   "predicted": 4}
    # one right, one wrong, two gold missed: P = 1/2, R = 1/3, F1 = 2 * (1/6) / (5/6) = 0.4
    result = span_f1([["B-A", "O", "B-B", "O", "B-C"]], [["B-A", "O", "O", "B-D", "O"]])
    assert (result["precision"], result["recall"]) == (0.5, pytest.approx(1 / 3))
    assert result["f1"] == pytest.approx(0.4)


def test_span_f1_edge_cases():
    assert span_f1([["O", "O"]], [["O", "O"]])["f1"] == 0.0
    with pytest.raises(XmlmError, match="sentence 0 has 2 gold tags but 1 predicted"):
        span_f1([["O", "O"]], [["O"]])
    with pytest.raises(XmlmError, match="1 gold sentences but 2 predicted"):
        span_f1([["O"]], [["O"], ["O"]])
