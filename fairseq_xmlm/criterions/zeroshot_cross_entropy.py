"""Criterion of the zero-shot fine-tuning task (tasks/zeroshot_sentence_classification.py): cross-entropy of a
classifier's logits, and accuracy for checkpoint selection (`--best-checkpoint-metric accuracy`)."""
import torch.nn.functional as F
from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion


@register_criterion("zeroshot_cross_entropy")
class ZeroshotCrossEntropy(FairseqCriterion):
    """Cross-entropy of the classifier's logits (summed; fairseq divides by the sentence count) and accuracy."""

    def forward(self, model, sample, reduce=True):
        logits = model(**sample["net_input"])
        target = sample["target"]
        loss = F.cross_entropy(logits, target, reduction="sum")
        count = target.numel()
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": count,
                          "sample_size": count, "ncorrect": (logits.argmax(-1) == target).sum().item()}
        return loss, count, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs):
        loss = sum(log.get("loss", 0) for log in logging_outputs)
        count = sum(log.get("sample_size", 0) for log in logging_outputs)
        correct = sum(log.get("ncorrect", 0) for log in logging_outputs)
        if count:
            metrics.log_scalar("loss", loss / count, count, round=4)
            metrics.log_scalar("accuracy", 100.0 * correct / count, count, round=2)

    @staticmethod
    def logging_outputs_can_be_summed():
        return True
