"""fairseq's masked_lm loss without its per-step host syncs.

Stock `masked_lm` finds the targets on the GPU (`target.ne(pad)`, then boolean indexing, a device->host sync
each) and returns the target count as a GPU tensor, which fairseq's trainer reads back (`sample_size or 1.0`):
a small model's step then waits on the host. Our collater (data/mlm_dataset.py) already knows the target
positions on the CPU and ships them with the batch (`masked_positions`, `nmasked`): this criterion gathers them
with index_select and returns the count as a Python int. Same loss, same sample size, same logged metrics.
"""
from fairseq import modules
from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

from fairseq_xmlm.errors import XmlmError


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
        loss = modules.cross_entropy(logits.view(-1, logits.size(-1)), targets, reduction="sum",
                                     ignore_index=self.padding_idx)
        logging_output = {"loss": loss.data, "ntokens": sample["ntokens"], "nsentences": sample["nsentences"],
                          "sample_size": nmasked}
        return loss, nmasked, logging_output
