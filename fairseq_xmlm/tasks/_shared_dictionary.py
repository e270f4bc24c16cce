"""What every task of this plugin shares: one dictionary serves as source and target (masked LM, classification),
and under legacy_ddp xmlm_adamw's flat gradient starts its all-reduce as soon as backward has made it
(`start_gradient_all_reduce`)."""
from fairseq.tasks import FairseqTask

from fairseq_xmlm.optim.xmlm_adamw import start_gradient_all_reduce


class SharedDictionaryTask(FairseqTask):
    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        result = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        start_gradient_all_reduce(optimizer, model)
        return result
