"""What every task of this plugin shares: one dictionary serves as source and target (masked LM, classification)."""
from fairseq.tasks import FairseqTask


class SharedDictionaryTask(FairseqTask):
    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary
