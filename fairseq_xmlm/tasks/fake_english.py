"""Dufter & Schuetze 2020: English paired with Fake-English, its exact copy with every token id shifted by the
English vocabulary size.

The doubled dictionary holds English symbols at ids [0, V) and their twins `::w` at [V, 2V), so a Fake token is
its English token + V. The modifications of the paper are task flags, freely combinable:
`--lang-pos`, `--shift-special`, `--no-random`, `--inv-order`, `--no-parallel`, `--knn-replace K`.
"""
import logging
import os
from dataclasses import dataclass, field
from typing import Optional

import torch
from fairseq import metrics
from fairseq.data import Dictionary, data_utils
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import register_task
from omegaconf import II

from fairseq_xmlm.tasks._shared_dictionary import SharedDictionaryTask
from fairseq_xmlm.data.mlm_dataset import MaskedLanguageDataset
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import Masker, candidate_table, parse_replacement_probs
from fairseq_xmlm.vocabulary import (
    add_mask_symbol,
    dictionary_fingerprint,
    load_data_dictionary,
    load_split_sentences,
    real_symbol_ids,
)

logger = logging.getLogger(__name__)

TWIN_PREFIX = "::"


@dataclass
class FakeEnglishConfig(FairseqDataclass):
    data: str = field(default="", metadata={"help": "data-bin directory with dict.txt, train.en.*, valid.en.*"})
    tokens_per_sample: int = field(default=128, metadata={"help": "max tokens per sentence, specials included"})
    mask_prob: float = field(default=0.15, metadata={"help": "fraction of non-special tokens chosen as targets"})
    replacement_probs: str = field(
        default="",
        metadata={"help": "MASK,KEEP,RANDOM[,KNN] for targets; default .8,.1,.1 (.5,.1,.1,.3 with --knn-replace)"},
    )
    lang_pos: bool = field(default=False, metadata={"help": "language-specific position + segment embeddings"})
    shift_special: bool = field(default=False, metadata={"help": "Fake-English has its own special tokens"})
    no_random: bool = field(default=False, metadata={"help": "never replace targets by random tokens (.8,.2,0)"})
    inv_order: bool = field(default=False, metadata={"help": "every Fake-English sentence is reversed"})
    no_parallel: bool = field(
        default=False, metadata={"help": "English from the first half of the corpus, Fake from the second"}
    )
    knn_replace: int = field(default=0, metadata={"help": "K: replace targets by one of K cross-lingual neighbours"})
    knn_table: str = field(default="", metadata={"help": "neighbour table written by xmlm-build-knn"})
    eval_multilinguality: bool = field(
        default=False, metadata={"help": "compute mu and its parts on dev sentences at every validation"}
    )
    eval_mult_sentences: int = field(default=500, metadata={"help": "dev sentences for --eval-multilinguality"})
    eval_mult_layers: str = field(default="0,8", metadata={"help": "layers for --eval-multilinguality"})
    seed: int = II("common.seed")


def doubled_dictionary(english):
    """English symbols at [0, V), their twins `::w` at [V, 2V): twin id = English id + V."""
    doubled = Dictionary()  # starts with <s> <pad> </s> <unk> at 0..3, as `english` does
    for i in range(doubled.nspecial, len(english)):
        doubled.add_symbol(english[i], n=english.count[i])
    for i in range(len(english)):
        doubled.add_symbol(TWIN_PREFIX + english[i], n=english.count[i])
    assert len(doubled) == 2 * len(english)
    return doubled


def resolve_replacement_probs(cfg):
    probs = parse_replacement_probs(cfg.replacement_probs) if cfg.replacement_probs else None
    if cfg.no_random:
        if probs is not None and probs[2] > 0:
            raise XmlmError("--no-random contradicts a RANDOM probability > 0 in --replacement-probs")
        probs = probs or ((0.5, 0.2, 0.0, 0.3) if cfg.knn_replace else (0.8, 0.2, 0.0, 0.0))
    probs = probs or ((0.5, 0.1, 0.1, 0.3) if cfg.knn_replace else (0.8, 0.1, 0.1, 0.0))
    if probs[3] > 0 and not cfg.knn_replace:
        raise XmlmError("a KNN probability in --replacement-probs needs --knn-replace K")
    if cfg.knn_replace and probs[3] == 0:
        raise XmlmError("--knn-replace needs a KNN probability > 0 in --replacement-probs")
    return probs


def load_knn_table(path, dictionary, k):
    """The (len(dictionary), k) neighbour ids written by xmlm-build-knn, checked against this dictionary."""
    if not path:
        raise XmlmError("--knn-replace needs --knn-table (build it with xmlm-build-knn)")
    if not os.path.isfile(path):
        raise XmlmError(f"knn table not found: {path}")
    try:
        table = torch.load(path, weights_only=True)
    except Exception as err:
        raise XmlmError(f"cannot read knn table {path}: {err}")
    if table.get("dict_size") != len(dictionary) or table.get("dict_md5") != dictionary_fingerprint(dictionary):
        raise XmlmError(f"knn table {path} was built for another vocabulary (rebuild it with xmlm-build-knn)")
    neighbours = table["neighbours"]
    if neighbours.size(1) < k:
        raise XmlmError(f"knn table {path} has {neighbours.size(1)} neighbours per token, --knn-replace asks {k}")
    return neighbours[:, :k].contiguous()


@register_task("fake_english", dataclass=FakeEnglishConfig)
class FakeEnglishTask(SharedDictionaryTask):
    langs = ("en", "fake")

    def __init__(self, cfg, english):
        super().__init__(cfg)
        self.english = english
        self.english_size = len(english)
        self.dictionary = doubled_dictionary(english)
        self.lang_pos = cfg.lang_pos
        self.mask_idx = english.index("<mask>")
        v = self.english_size
        english_specials = [english.bos(), english.pad(), english.eos(), english.unk(), self.mask_idx]
        english_specials += [i for i in range(english.nspecial, v) if english.count[i] == 0]  # madeupword fillers
        self.special_ids = set(english_specials) | {i + v for i in english_specials}
        self.replacement_probs = resolve_replacement_probs(cfg)
        # read per sentence: plain attributes, not omegaconf lookups (1 s per 17k sentences)
        self.max_sentence_tokens, self.inv_order, self.shift_special = cfg.tokens_per_sample, cfg.inv_order, \
            cfg.shift_special
        self._mult_scores = {}
        self._mult_sentences = None

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        english = add_mask_symbol(load_data_dictionary(cfg.data))
        logger.info(f"fake_english: English dictionary {len(english)} symbols, doubled {2 * len(english)}")
        return cls(cfg, english)

    # ---- how a sentence enters the model ----
    def specials_of(self, lang):
        shift = self.english_size if (lang == 1 and self.shift_special) else 0
        return self.english.bos() + shift, self.english.eos() + shift, self.mask_idx + shift

    def sentence_input(self, ids, lang):
        """English piece ids (no specials) -> the exact training input of that sentence in language `lang`."""
        ids = torch.as_tensor(ids, dtype=torch.long)[: self.max_sentence_tokens - 2]
        if lang == 1:
            ids = ids + self.english_size
            if self.inv_order:
                ids = ids.flip(0)
        bos, eos, _ = self.specials_of(lang)
        return torch.cat([ids.new_tensor([bos]), ids, ids.new_tensor([eos])])

    def load_split_sentences(self, split, lang=0):
        return load_split_sentences(self.cfg.data, split, "en", self.english)

    def language_vocab_masks(self):
        ids = torch.arange(len(self.dictionary))
        return torch.stack([ids < self.english_size, ids >= self.english_size])

    def build_masker(self, mask_only=False):
        v = self.english_size
        real = real_symbol_ids(self.english, exclude=self.special_ids)
        # Random words come from the whole vocabulary of both languages (BERT's choice, Dufter's default).
        candidates, counts = candidate_table([torch.cat([real, real + v])])
        probs = (1.0, 0.0, 0.0, 0.0) if mask_only else self.replacement_probs
        knn = None
        if self.cfg.knn_replace and not mask_only:
            knn = load_knn_table(self.cfg.knn_table, self.dictionary, self.cfg.knn_replace)
        return Masker(self.cfg.mask_prob, probs, torch.tensor(sorted(self.special_ids)), candidates, counts, knn)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        sentences = self.load_split_sentences(split)
        english, fake = sentences, sentences
        if self.cfg.no_parallel and split == "train":
            half = len(sentences) // 2
            english, fake = sentences[:half], sentences[half:]
        items = [(self.sentence_input(s, 0), 0) for s in english] + [(self.sentence_input(s, 1), 1) for s in fake]
        mask_ids = [self.specials_of(0)[2], self.specials_of(1)[2]]
        # dev targets are replaced by the mask only, as in xmlm-eval-mult's perplexity: the dev perplexity curves of
        # settings with other corruptions (knn-replace, no-random) then measure the same thing as Table 1's column
        self.datasets[split] = MaskedLanguageDataset(
            items, self.dictionary.pad(), self.build_masker(mask_only=split != "train"), mask_ids, [0, 0],
            seed=self.cfg.seed, shuffle=split == "train",
        )
        logger.info(f"fake_english {split}: {len(english)} English + {len(fake)} Fake sentences")

    def max_positions(self):
        return self.cfg.tokens_per_sample

    # ---- multilinguality during training (Dufter Fig. 6/7 from one run) ----
    def begin_valid_epoch(self, epoch, model):
        if not self.cfg.eval_multilinguality:
            return
        from fairseq_xmlm.evaluation.multilinguality import multilinguality_scores

        layers = [int(x) for x in self.cfg.eval_mult_layers.split(",")]
        if self._mult_sentences is None:  # read once, not at every validation
            self._mult_sentences = self.load_split_sentences("valid")[: self.cfg.eval_mult_sentences]
        # multilinguality_scores switches to eval/inference mode itself and restores training mode
        scores = multilinguality_scores(model, self, self._mult_sentences, layers)
        self._mult_scores = {"mu": scores["mu"]}
        for layer, parts in scores["layers"].items():
            for name, value in parts.items():
                self._mult_scores[f"{name}{layer}"] = value

    def valid_step(self, sample, model, criterion):
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        logging_output.update({f"mult_{name}": value for name, value in self._mult_scores.items()})
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion):
        super().reduce_metrics(logging_outputs, criterion)
        for name in self._mult_scores:
            values = [log[f"mult_{name}"] for log in logging_outputs if f"mult_{name}" in log]
            if values:
                metrics.log_scalar(name, sum(values) / len(values), round=3)
