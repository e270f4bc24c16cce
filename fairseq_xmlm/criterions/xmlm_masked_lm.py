"""fairseq's masked_lm loss without its per-step host syncs.

Stock `masked_lm` finds the targets on the GPU (`target.ne(pad)`, then boolean indexing, a device->host sync
each) and returns the target count as a GPU tensor, which fairseq's trainer reads back (`sample_size or 1.0`):
a small model's step then waits on the host. Our collater (data/mlm_dataset.py) already knows the target
positions on the CPU and ships them with the batch (`masked_positions`, `nmasked`): this criterion gathers them
with index_select and returns the count as a Python int. Same loss, same sample size, same logged metrics.

With the model's `--compile` on a GPU the loss itself is compiled too (`summed_cross_entropy`): fairseq's
cross-entropy writes the log-probabilities of every masked position over the whole vocabulary in fp32, reads them
back for the NLL and again in the backward, and casts bf16 logits to fp32 in a kernel of its own first (torch fuses
that cast for fp16 only). Compiled, the forward is one pass over the logits and the backward writes their gradient
in their own precision in one more: the same fp32 arithmetic.
"""
import functools

import torch
import torch.nn.functional as F
from fairseq import modules
from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

from fairseq_xmlm.errors import XmlmError


def summed_cross_entropy(logits, targets, padding_idx):
    """fairseq's `modules.cross_entropy` without apex: the log-softmax in fp32, the NLL summed over the targets that
    are not padding."""
    return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, reduction="sum",
                      ignore_index=padding_idx)


@functools.cache
def compiled_summed_cross_entropy():
    # dynamic: the number of masked positions changes from batch to batch
    return torch.compile(summed_cross_entropy, dynamic=True)


def loss_function(model, logits):
    """The compiled loss where the model was compiled (`--compile`: inductor is wanted and works here) and the
    logits are on a GPU, else fairseq's own."""
    compiled = getattr(getattr(model, "cfg", None), "compile", False) is True
    if compiled and logits.is_cuda:
        return compiled_summed_cross_entropy()
    return lambda x, t, pad: modules.cross_entropy(x, t, reduction="sum", ignore_index=pad)


@register_criterion("xmlm_masked_lm", dataclass=MaskedLmConfig)
class XmlmMaskedLmLoss(MaskedLmLoss):
    """Summed cross-entropy over the target positions (fairseq logs it per target in base 2: MaskedLmLoss's
    reduce_metrics)."""

    def forward(self, model, sample, reduce=True):
        if "masked_positions" not in sample:
            raise XmlmError("--criterion xmlm_masked_lm needs batches with masked_positions "
                            "(tasks fake_english, bilingual_mlm); use --criterion masked_lm")
        nmasked = sample["nmasked"]
        # No target in the batch: project every position like stock masked_lm; all targets are then padding and
        # the loss is exactly 0 (still a graph for backward), with sample size 0.
        positions = sample["masked_positions"] if nmasked else None
        logits = model(**sample["net_input"], masked_positions=positions)[0]
        targets = sample["target"].view(-1)
        if positions is not None:
            targets = targets.index_select(0, positions)
        loss = loss_function(model, logits)(logits.view(-1, logits.size(-1)), targets, self.padding_idx)
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                          "sample_size": nmasked}
        return loss, nmasked, logging_output
