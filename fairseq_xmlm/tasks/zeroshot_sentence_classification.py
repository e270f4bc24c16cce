"""Fine-tuning through `fairseq-train` for XNLI-style sentence-pair classification from a pretrained checkpoint.

    fairseq-train XNLI_DIR --user-dir fairseq_xmlm --task zeroshot_sentence_classification \
        --pretrained checkpoints/en_fr/checkpoint_best.pt --arch zeroshot_sentence_classifier \
        --criterion zeroshot_cross_entropy --optimizer adam_head_lr --lr 5e-6 --head-lr 1.25e-4 \
        --lr-scheduler fixed --batch-size 8 --max-epoch 200 --valid-subset valid_en,valid_fr \
        --best-checkpoint-metric accuracy --maximize-best-checkpoint-metric

XNLI_DIR holds `<split>.tsv` files in the XNLI release format (`train.tsv`, `valid.tsv`, ...). Split `valid` is the
rows of `--source-lang` (all rows if the file has no language column); `valid_fr` the French rows of `valid.tsv`,
run through French's own embeddings / layers: zero-shot evaluation, and the first valid subset selects the best
checkpoint as the paper does with English dev. The model is `fairseq_xmlm.zeroshot.finetune.SentenceClassifier`
over the pretrained encoder with its language-specific parameters frozen; text becomes pieces as the checkpoint's
data-bin was made. The `adam_head_lr` optimizer gives the classifier its own learning rate (`--head-lr`), kept in
a fixed ratio to the scheduled encoder rate (`--lr`), so with `--lr-scheduler fixed` both are exactly the paper's.
Not for --fp16 (fairseq's FP16 optimizer flattens all parameters into one group).
"""
import os
from collections.abc import Collection
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import FairseqDataset
from fairseq.dataclass import FairseqDataclass
from fairseq.models import BaseFairseqModel, register_model
from fairseq.optim import register_optimizer
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig
from fairseq.tasks import register_task

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import pad_batch
from fairseq_xmlm.tasks._shared_dictionary import SharedDictionaryTask

HEAD_GROUP = "head"  # value of the `lr_group` attribute that marks the classifier's parameters


@dataclass
class ZeroshotSentenceClassificationConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "directory of XNLI-format <split>.tsv files"})
    pretrained: str = field(default="", metadata={"help": "pretraining checkpoint (partially_shared_roberta)"})
    pretrained_data: str = field(default="", metadata={"help": "its data-bin, if it moved since pretraining"})
    source_lang: str = field(default="en", metadata={"help": "fine-tuning language (splits without _<lang>)"})


class SentencePairDataset(FairseqDataset):
    """(input ids, label) rows of one language; batches carry that language's id for every row."""

    def __init__(self, rows, lang_id, pad):
        self.rows, self.lang_id, self.pad = rows, lang_id, pad
        self.sizes = np.array([len(tokens) for tokens, _ in rows], dtype=np.int64)

    def __getitem__(self, index):
        return {"id": index, "tokens": self.rows[index][0], "label": self.rows[index][1]}

    def __len__(self):
        return len(self.rows)

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    def ordered_indices(self):
        return np.argsort(self.sizes, kind="stable")

    def collater(self, samples):
        if not samples:
            return {}
        tokens = pad_batch([s["tokens"] for s in samples], self.pad)
        return {"id": torch.tensor([s["id"] for s in samples]), "nsentences": len(samples),
                "ntokens": int(tokens.ne(self.pad).sum()),
                "net_input": {"src_tokens": tokens, "lang_ids": torch.full((len(samples),), self.lang_id)},
                "target": torch.tensor([s["label"] for s in samples])}


@register_task("zeroshot_sentence_classification", dataclass=ZeroshotSentenceClassificationConfig)
class ZeroshotSentenceClassificationTask(SharedDictionaryTask):
    def __init__(self, cfg, encoder, pretraining_task):
        super().__init__(cfg)
        from fairseq_xmlm.zeroshot.subwords import PieceEncoder

        self.pretrained_encoder = encoder
        self.pretraining_task = pretraining_task
        self.dictionary = pretraining_task.dictionary
        self.pieces = PieceEncoder(pretraining_task.cfg.data, self.dictionary)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        from fairseq_xmlm.zeroshot.finetune import load_pretrained

        if not cfg.pretrained:
            raise XmlmError("--task zeroshot_sentence_classification needs --pretrained CHECKPOINT")
        encoder, pretraining_task = load_pretrained(cfg.pretrained, cfg.pretrained_data or None)
        return cls(cfg, encoder, pretraining_task)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        from fairseq_xmlm.zeroshot.finetune import language_index
        from fairseq_xmlm.zeroshot.inputs import pair_input
        from fairseq_xmlm.zeroshot.readers import NLI_LABELS, read_nli

        base, _, lang = split.partition("_")
        lang = lang or self.cfg.source_lang
        path = os.path.join(self.cfg.data, f"{base}.tsv")
        examples = read_nli(path, lang)
        premises = self.pieces.encode_sentences([e.premise for e in examples], lang)
        hypotheses = self.pieces.encode_sentences([e.hypothesis for e in examples], lang)
        max_tokens = self.pretrained_encoder.max_positions()
        rows = [(pair_input(self.dictionary, p, h, max_tokens), NLI_LABELS.index(e.label))
                for p, h, e in zip(premises, hypotheses, examples)]
        self.datasets[split] = SentencePairDataset(rows, language_index(self.pretraining_task, lang),
                                                   self.dictionary.pad())

    def get_batch_iterator(self, dataset, **kwargs):
        # fairseq's batch_by_size, batching by sentence count only, drops a last batch smaller than
        # --required-batch-size-multiple (default 8): validation would silently skip rows.
        return super().get_batch_iterator(dataset, **{**kwargs, "required_batch_size_multiple": 1})

    def max_positions(self):
        return self.pretrained_encoder.max_positions()


@dataclass
class ZeroshotSentenceClassifierConfig(FairseqDataclass):
    classifier_dropout: float = field(default=0.1, metadata={"help": "dropout before the linear classifier"})


@register_model("zeroshot_sentence_classifier", dataclass=ZeroshotSentenceClassifierConfig)
class ZeroshotSentenceClassifierModel(BaseFairseqModel):
    """fairseq wrapper of SentenceClassifier: the pretrained encoder (language-specific parts frozen) + a linear
    head over `<s>`; the head's parameters are marked for the optimizer's head learning rate."""

    def __init__(self, classifier):
        super().__init__()
        self.classifier = classifier

    @classmethod
    def build_model(cls, cfg, task):
        from fairseq_xmlm.zeroshot.finetune import SentenceClassifier, freeze_language_specific
        from fairseq_xmlm.zeroshot.readers import NLI_LABELS

        if not isinstance(task, ZeroshotSentenceClassificationTask):
            raise XmlmError("--arch zeroshot_sentence_classifier needs --task zeroshot_sentence_classification")
        freeze_language_specific(task.pretrained_encoder)
        classifier = SentenceClassifier(task.pretrained_encoder, len(NLI_LABELS), cfg.classifier_dropout)
        for parameter in classifier.head.parameters():
            parameter.lr_group = HEAD_GROUP
        return cls(classifier)

    def forward(self, src_tokens, lang_ids):
        return self.classifier(src_tokens, lang_ids)

    def max_positions(self):
        return self.classifier.encoder.max_positions()


@dataclass
class AdamHeadLrConfig(FairseqAdamConfig):
    head_lr: float = field(default=0.0, metadata={"help": "classifier learning rate (0: the same as --lr)"})


@register_optimizer("adam_head_lr", dataclass=AdamHeadLrConfig)
class AdamHeadLr(FairseqAdam):
    """Adam with two parameter groups: encoder (`--lr`, scheduled) and head (`--head-lr`, same schedule)."""

    def __init__(self, cfg, params):
        params = list(params)
        encoder = [p for p in params if getattr(p, "lr_group", None) != HEAD_GROUP]
        head = [p for p in params if getattr(p, "lr_group", None) == HEAD_GROUP]
        if not head:
            raise XmlmError("--optimizer adam_head_lr found no head parameters "
                            "(use --arch zeroshot_sentence_classifier)")
        self.base_lr = cfg.lr[0] if isinstance(cfg.lr, Collection) else cfg.lr
        self.head_scale = (cfg.head_lr / self.base_lr) if cfg.head_lr > 0 else 1.0
        super().__init__(cfg, [{"params": encoder}, {"params": head, "lr": self.base_lr * self.head_scale}])

    def set_lr(self, lr):
        encoder_group, head_group = self.param_groups
        encoder_group["lr"] = lr
        head_group["lr"] = lr * self.head_scale
