"""BIO span repair and span-level F1 for NER (Conneau et al. 2020, section 3.2).

The tagger predicts each word's tag independently, so its output can be an invalid BIO sequence. The paper's
post-processing: a standalone `I-X` opens a span (becomes `B-X`), and a run `B-X I-Y I-Z` is one span whose type
is the type of its final tag (`B-Z I-Z I-Z`). Every `I-` continues the span it follows, whatever its type.
"""
from fairseq_xmlm.errors import XmlmError


def _split_tag(tag):
    if tag == "O":
        return "O", None
    prefix, sep, entity = tag.partition("-")
    if prefix not in ("B", "I") or not sep or not entity:
        raise XmlmError(f"{tag!r} is not a BIO tag (O, B-TYPE or I-TYPE)")
    return prefix, entity


def _raw_spans(tags):
    """[(start, end_exclusive, final_type)] where a span is a B or an I not preceded by a span, plus following Is."""
    found = []
    start = None
    for position, tag in enumerate(tags):
        prefix, entity = _split_tag(tag)
        if prefix == "I" and start is not None:
            found[-1] = (start, position + 1, entity)
            continue
        if prefix == "O":
            start = None
            continue
        start = position
        found.append((start, position + 1, entity))
    return found


def repair_bio(tags):
    """Return a valid BIO sequence: standalone I-X -> B-X; B-X I-Y I-Z -> B-Z I-Z I-Z (the final type wins)."""
    repaired = ["O"] * len(tags)
    for start, end, entity in _raw_spans(tags):
        repaired[start] = f"B-{entity}"
        for position in range(start + 1, end):
            repaired[position] = f"I-{entity}"
    return repaired


def spans(tags):
    """The set of entity spans `(type, start, end_exclusive)` of a tag sequence, read after `repair_bio`."""
    return {(entity, start, end) for start, end, entity in _raw_spans(tags)}


def span_f1(gold, pred):
    """Micro-averaged span precision / recall / F1 over sentences (lists of tag sequences), exact span match.

    Predictions are repaired first (the paper's post-processing); gold is read the same way, which leaves valid
    BIO unchanged. With no gold and no predicted spans all three scores are 0, as in conlleval.
    """
    if len(gold) != len(pred):
        raise XmlmError(f"span_f1: {len(gold)} gold sentences but {len(pred)} predicted")
    correct = gold_total = pred_total = 0
    for index, (gold_tags, pred_tags) in enumerate(zip(gold, pred)):
        if len(gold_tags) != len(pred_tags):
            raise XmlmError(f"span_f1: sentence {index} has {len(gold_tags)} gold tags but {len(pred_tags)} predicted")
        gold_spans, pred_spans = spans(gold_tags), spans(pred_tags)
        correct += len(gold_spans & pred_spans)
        gold_total += len(gold_spans)
        pred_total += len(pred_spans)
    precision = correct / pred_total if pred_total else 0.0
    recall = correct / gold_total if gold_total else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "correct": correct, "gold": gold_total,
            "predicted": pred_total}
