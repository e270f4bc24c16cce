"""Dufter & Schuetze 2020: English paired with Fake-English, its exact copy with every token id shifted by the
English vocabulary size.

The doubled dictionary holds English symbols at ids [0, V) and their twins `::w` at [V, 2V), so a Fake token is
its English token + V. The modifications of the paper are task flags, freely combinable:
`--lang-pos`, `--shift-special`, `--no-random`, `--inv-order`, `--no-parallel`, `--knn-replace K`. The masking flags
(`--no-random`, `--knn-replace`, `--replacement-probs`, `--random-replace`) are bilingual_mlm's too
(`_shared_dictionary.ReplacementPolicyConfig`). Three flags follow the paper's code (github pdufter/minimult) where it
differs from the paper's text: `--no-random-mask-share .9` (its .9/.1/0 no-random), `--attend-padding` (its random
mixed batches without an attention mask) and `--shift-special-after-masking` (its special tokens shifted after
masking, by each row's content).
"""
import dataclasses
import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq import metrics
from fairseq.tasks import register_task
from omegaconf import II

from fairseq_xmlm.data.mlm_dataset import MaskedLanguageDataset
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import Masker, candidate_table, resolve_replacement_probs
from fairseq_xmlm.tasks._shared_dictionary import (ReplacementPolicyConfig, SharedDictionaryTask, load_knn_table,
                                                   replacement_config)
from fairseq_xmlm.vocabulary import (add_mask_symbol, doubled_dictionary, load_data_dictionary,
                                     load_split_sentences, real_symbol_ids)

logger = logging.getLogger(__name__)


@dataclass
class FakeEnglishConfig(ReplacementPolicyConfig):
    data: str = field(default="", metadata={"help": "data-bin directory with dict.txt, train.en.*, valid.en.*"})
    tokens_per_sample: int = field(default=128, metadata={"help": "max tokens per sentence, specials included"})
    lang_pos: bool = field(default=False, metadata={"help": "language-specific position + segment embeddings"})
    shift_special: bool = field(default=False, metadata={"help": "Fake-English has its own special tokens"})
    shift_special_after_masking: bool = field(
        default=False, metadata={"help": "with --shift-special, as the paper's code: after masking, a row's special "
                                 "tokens are Fake-English's when it holds any Fake-English word (a random replacement "
                                 "included), else English's"})
    inv_order: bool = field(default=False, metadata={"help": "every Fake-English sentence is reversed"})
    no_parallel: bool = field(
        default=False, metadata={"help": "English from the first half of the corpus, Fake from the second"}
    )
    no_random_mask_share: float = field(
        default=0.0, metadata={"help": "with --no-random: the MASK share, KEEP takes the rest (.9: the paper's code, "
                               ".9/.1/0); 0: RANDOM's share goes to KEEP (.8/.2/0, the paper's text)"})
    attend_padding: bool = field(
        default=False, metadata={"help": "as the paper's code: batches drawn at random over both languages and all "
                                 "lengths, and no attention mask, so every sentence attends to its batch's padding"})
    eval_multilinguality: bool = field(
        default=False, metadata={"help": "compute mu and its parts on dev sentences at every validation"}
    )
    eval_mult_sentences: int = field(default=500, metadata={"help": "dev sentences for --eval-multilinguality"})
    eval_mult_layers: str = field(default="0,8", metadata={"help": "layers for --eval-multilinguality"})
    seed: int = II("common.seed")


class RandomMixedBatches(MaskedLanguageDataset):
    """--attend-padding: the batches of the paper's code (github pdufter/minimult, run_language_modeling.py: a
    RandomSampler over the English and Fake-English lines, padded, the model called without an attention mask).

    A batch is a fixed run of slots that each epoch maps to a random permutation of all items, so batches mix lengths
    and languages and change every epoch, and the model attends to the padding (`has_padding` False drops the mask).
    Padding reads the pad embedding plus its position's: the same in both languages, unless lang-pos gives
    Fake-English positions of its own.
    """

    def ordered_indices(self):
        return np.arange(len(self))

    def slot_items(self, order):
        return order

    def collater(self, samples):
        batch = super().collater(samples)
        if batch:
            batch["net_input"]["has_padding"] = False
        return batch


@register_task("fake_english", dataclass=FakeEnglishConfig)
class FakeEnglishTask(SharedDictionaryTask):
    langs = ("en", "fake")

    def __init__(self, cfg, english):
        super().__init__(cfg)
        if cfg.shift_special_after_masking and not cfg.shift_special:
            raise XmlmError("--shift-special-after-masking changes how --shift-special shifts: give both")
        self.english = english
        self.english_size = len(english)
        self.dictionary = doubled_dictionary(english)
        self.lang_pos = cfg.lang_pos
        self.mask_idx = english.index("<mask>")
        v = self.english_size
        english_specials = [english.bos(), english.pad(), english.eos(), english.unk(), self.mask_idx]
        english_specials += [i for i in range(english.nspecial, v) if english.count[i] == 0]  # madeupword fillers
        self.special_ids = set(english_specials) | {i + v for i in english_specials}
        self.replacement = dataclasses.replace(replacement_config(cfg),
                                               no_random_mask_share=cfg.no_random_mask_share)
        self.replacement_probs = resolve_replacement_probs(self.replacement)
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

    def content_specials(self):
        """--shift-special-after-masking: (shift, the English specials bos, eos, unk and mask) for
        `masking.specials_follow_content`; else None. Padding keeps its id, which only --attend-padding reads (the
        paper's code shifts it too)."""
        if not self.cfg.shift_special_after_masking:
            return None
        e = self.english
        return self.english_size, torch.tensor(sorted({e.bos(), e.eos(), e.unk(), self.mask_idx}))

    def mask_symbol(self, lang):
        return self.specials_of(lang)[2]

    def reverses(self, lang):
        return lang == 1 and self.inv_order

    def load_split_sentences(self, split, lang=0):
        return load_split_sentences(self.cfg.data, split, "en", self.english)

    def sentences_per_language(self, split):
        """{lang: English piece ids} of what each language trains (or is validated) on: the whole split, but under
        --no-parallel English has the first half of the training corpus and Fake-English the second."""
        sentences = self.load_split_sentences(split)
        if self.cfg.no_parallel and split == "train":
            half = len(sentences) // 2
            return {0: sentences[:half], 1: sentences[half:]}
        return {0: sentences, 1: sentences}

    def language_vocab_masks(self):
        ids = torch.arange(len(self.dictionary))
        return torch.stack([ids < self.english_size, ids >= self.english_size])

    def random_candidate_sets(self):
        """Row of the masker's random-candidate table each language draws from: one set of both languages' words
        (BERT's choice, Dufter's default; also kept under --no-random, so such runs pack with others), or each
        language its own under --random-replace within."""
        return [0, 1] if self.replacement.random_source == "within" else [0, 0]

    def build_masker(self, mask_only=False):
        v = self.english_size
        real = real_symbol_ids(self.english, exclude=self.special_ids)
        own_words = [real, real + v] if self.replacement.random_source == "within" else [torch.cat([real, real + v])]
        candidates, counts = candidate_table(own_words)
        probs = (1.0, 0.0, 0.0, 0.0) if mask_only else self.replacement_probs
        knn = None
        if self.replacement.knn and not mask_only:
            knn = load_knn_table(self.cfg.knn_table, self.dictionary, self.replacement.knn)
        return Masker(self.cfg.mask_prob, probs, torch.tensor(sorted(self.special_ids)), candidates, counts, knn)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        sentences = self.sentences_per_language(split)
        english, fake = sentences[0], sentences[1]
        items = [(self.sentence_input(s, 0), 0) for s in english] + [(self.sentence_input(s, 1), 1) for s in fake]
        mask_ids = [self.mask_symbol(0), self.mask_symbol(1)]
        # dev targets are replaced by the mask only, as in xmlm-eval-mult's perplexity: the dev perplexity curves of
        # settings with other corruptions (knn-replace, no-random) then measure the same thing as Table 1's column
        dataset = RandomMixedBatches if self.cfg.attend_padding else MaskedLanguageDataset
        self.datasets[split] = dataset(
            items, self.dictionary.pad(), self.build_masker(mask_only=split != "train"), mask_ids,
            self.random_candidate_sets(), seed=self.cfg.seed, shuffle=split == "train",
            content_specials=self.content_specials(),
        )
        logger.info(f"fake_english {split}: {len(english)} English + {len(fake)} Fake sentences")

    def max_positions(self):
        return self.cfg.tokens_per_sample

    # ---- multilinguality during training (Dufter Fig. 6/7 from one run) ----
    def begin_valid_epoch(self, epoch, model):
        if not self.cfg.eval_multilinguality:
            return
        from fairseq_xmlm.evaluation.scores import multilinguality_scores

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
