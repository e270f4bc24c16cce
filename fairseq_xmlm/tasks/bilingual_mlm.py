"""Conneau et al. 2020: masked language modelling on two or more real languages with one shared dictionary.

Each batch holds continuous 256-token streams of ONE language; which language is sampled with probability
proportional to its share of sentences raised to the power 0.7 (renormalised), as in XLM. The language id travels
with every sample, so `partially_shared_roberta` can route it to that language's embeddings and layers.

Splits: `train` and `valid` hold every language of `--langs`; `valid_<lang>` (e.g. `valid_en`) one language, so
`--valid-subset valid_en,valid_fr` selects the best checkpoint by English dev perplexity (fairseq uses the first
subset for that).

Targets are corrupted as fake_english's are, with the same flags (`--replacement-probs`, `--random-replace
within` for Conneau et al.'s random words of the row's own language, `--no-random`, `--knn-replace`).

Dufter & Schuetze's modifications on real languages (their Section 5.1), as fake_english has them for Fake-English:
`--lang-pos` (language-specific position and segment embeddings), `--shift-special` (every language after the
first has its own <s>, </s> and <mask>, appended to the dictionary as `<s>@de`, ...) and `--inv-order-langs de`
(every sentence of those languages reversed, piece by piece, in training and in every evaluation that reads
`sentence_input`).
"""
import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch
from fairseq.data import data_utils, iterators
from fairseq.tasks import register_task
from omegaconf import II

from fairseq_xmlm.data.mlm_dataset import MaskedLanguageDataset
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import read_meta
from fairseq_xmlm.masking import Masker, candidate_table, resolve_replacement_probs
from fairseq_xmlm.tasks._shared_dictionary import (ReplacementPolicyConfig, SharedDictionaryTask, load_knn_table,
                                                   replacement_config)
from fairseq_xmlm.vocabulary import (add_mask_symbol, join_sentences, load_data_dictionary, load_split_sentences,
                                     real_symbol_ids)

logger = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")


@dataclass
class BilingualMLMConfig(ReplacementPolicyConfig):
    data: str = field(default="", metadata={"help": "data-bin directory written by xmlm-prepare pair"})
    langs: str = field(default="en,fr", metadata={"help": "comma-separated languages, first = language 0"})
    tokens_per_sample: int = field(default=256, metadata={"help": "tokens per stream, <s> included"})
    lang_sampling_alpha: float = field(default=0.7, metadata={"help": "p(lang) proportional to share ** alpha"})
    lang_pos: bool = field(default=False, metadata={"help": "language-specific position + segment embeddings"})
    shift_special: bool = field(
        default=False, metadata={"help": "every language after the first has its own <s>, </s> and <mask>"})
    inv_order_langs: str = field(
        default="", metadata={"help": "comma-separated languages whose sentences are reversed (inv-order)"})
    seed: int = II("common.seed")


def language_probabilities(sentence_counts, alpha):
    """p_l proportional to (n_l / sum n) ** alpha, renormalised."""
    shares = np.asarray(sentence_counts, dtype=np.float64)
    shares = shares / shares.sum()
    weighted = shares**alpha
    return weighted / weighted.sum()


def language_specials(dictionary, langs, shift):
    """{lang index: (bos, eos, mask)}: the dictionary's own for every language, or under `shift` (shift-special)
    symbols `<s>@<lang>`, `</s>@<lang>`, `<mask>@<lang>` for every language after the first, appended to
    `dictionary` (after <mask>, so the data's ids are unchanged)."""
    own = (dictionary.bos(), dictionary.eos(), dictionary.index("<mask>"))
    if not shift:
        return {lang: own for lang in range(len(langs))}
    return {0: own, **{lang: tuple(dictionary.add_symbol(f"{symbol}@{name}") for symbol in ("<s>", "</s>", "<mask>"))
                       for lang, name in enumerate(langs) if lang > 0}}


def cut_streams(sentences, eos, bos, tokens_per_sample, reverse=False):
    """Concatenate sentences (each closed by </s>; each reversed first with `reverse`) and cut the stream into
    blocks of `<s>` + tokens_per_sample-1 (a last block of a single token is dropped). Built with whole-tensor
    operations: views of one (blocks, T) tensor, the last block apart."""
    body = tokens_per_sample - 1
    if body < 2:  # every block would hold one token or none
        return []
    flat = join_sentences([s.flip(0) for s in sentences] if reverse else sentences, eos)
    full = len(flat) // body
    rows = torch.cat([torch.full((full, 1), bos, dtype=torch.long), flat[: full * body].view(full, body)], 1)
    streams = list(rows)
    rest = flat[full * body:]
    if len(rest) > 1:
        streams.append(torch.cat([rest.new_tensor([bos]), rest]))
    return streams


class LanguageBatches:
    """Per epoch: resample each language's streams to its sampled share, then cut single-language batches."""

    def __init__(self, stream_langs, probabilities, batch_size, seed, resample):
        self.stream_langs = np.asarray(stream_langs)
        self.probabilities = probabilities
        self.batch_size = batch_size
        self.seed = seed
        self.resample = resample

    def __call__(self, dataset, epoch):
        total = len(self.stream_langs)
        batches = []
        with data_utils.numpy_seed(self.seed, epoch):
            for lang, p in enumerate(self.probabilities):
                own = np.flatnonzero(self.stream_langs == lang)
                if self.resample:
                    want = max(1, int(round(p * total)))
                    own = np.random.choice(own, want, replace=want > len(own))
                    np.random.shuffle(own)
                batches += [own[i : i + self.batch_size] for i in range(0, len(own), self.batch_size)]
        return batches


@register_task("bilingual_mlm", dataclass=BilingualMLMConfig)
class BilingualMLMTask(SharedDictionaryTask):
    def __init__(self, cfg, dictionary, langs):
        super().__init__(cfg)
        self.dictionary = dictionary
        self.langs = langs
        self.lang_pos = cfg.lang_pos
        self.mask_idx = dictionary.index("<mask>")
        self.special_ids = {dictionary.bos(), dictionary.pad(), dictionary.eos(), dictionary.unk(), self.mask_idx}
        self.special_ids |= {i for i in range(dictionary.nspecial, len(dictionary)) if dictionary.count[i] == 0}
        self.specials = language_specials(dictionary, langs, cfg.shift_special)
        self.special_ids |= {i for ids in self.specials.values() for i in ids}
        reversed_names = [lang.strip() for lang in cfg.inv_order_langs.split(",") if lang.strip()]
        unknown = [lang for lang in reversed_names if lang not in langs]
        if unknown:
            raise XmlmError(f"--inv-order-langs {','.join(unknown)}: not among --langs {','.join(langs)}")
        self.reversed_langs = {langs.index(lang) for lang in reversed_names}
        self.replacement = replacement_config(cfg)
        self.replacement_probs = resolve_replacement_probs(self.replacement)
        self._train_sentences = None
        self._vocab_masks = None

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        langs = [lang.strip() for lang in cfg.langs.split(",") if lang.strip()]
        if len(langs) < 1:
            raise XmlmError("--langs needs at least one language")
        meta = read_meta(cfg.data, required=False)
        if meta is not None:
            have = meta.get("langs", [])
            missing = [lang for lang in langs if lang not in have]
            if missing:
                raise XmlmError(f"language(s) {', '.join(missing)} not in {cfg.data} (it has {', '.join(have)})")
        dictionary = load_data_dictionary(cfg.data)
        # A dict.txt swapped in from other data: a smaller one shows as ids beyond it when loading, a larger one
        # only through the size xmlm-prepare recorded.
        report_path = os.path.join(cfg.data, "report.json")
        if os.path.isfile(report_path):
            try:
                with open(report_path, encoding="utf-8") as f:
                    binarized_with = json.load(f).get("dictionary_size", len(dictionary))
            except (UnicodeDecodeError, json.JSONDecodeError, AttributeError) as err:
                raise XmlmError(f"{report_path} is not the JSON object xmlm-prepare writes ({err})") from None
            if binarized_with != len(dictionary):
                raise XmlmError(f"{cfg.data}/dict.txt has {len(dictionary)} symbols but the data was binarized with "
                                f"{binarized_with} (report.json): the dictionary belongs to other data")
        dictionary = add_mask_symbol(dictionary)
        for lang in langs:
            if not os.path.isfile(os.path.join(cfg.data, f"train.{lang}.idx")):
                raise XmlmError(f"language {lang} is missing from {cfg.data} (no train.{lang}.idx)")
        return cls(cfg, dictionary, langs)

    def train_sentences(self):
        if self._train_sentences is None:
            self._train_sentences = [load_split_sentences(self.cfg.data, "train", lang, self.dictionary)
                                     for lang in self.langs]
        return self._train_sentences

    def load_split_sentences(self, split, lang):
        return load_split_sentences(self.cfg.data, split, self.langs[lang], self.dictionary)

    def language_vocab_masks(self):
        """(num_langs, V): the symbols of each language (seen in any of its splits) plus the specials.

        A Sep-Emb model predicts only these; dev and test symbols are included so that a held-out sentence never
        has an impossible target (its symbols come from that language's own segmentation anyway).
        """
        if self._vocab_masks is None:
            masks = torch.zeros(len(self.langs), len(self.dictionary), dtype=torch.bool)
            for lang in range(len(self.langs)):
                masks[lang, self.symbols_of(lang, SPLITS)] = True
            masks[:, sorted(self.special_ids)] = True
            self._vocab_masks = masks
        return self._vocab_masks

    def symbols_of(self, lang, splits):
        """Sorted ids of the symbols occurring in `splits` of language `lang`."""
        seen = [torch.cat(self.train_sentences()[lang])] if "train" in splits else []
        for split in splits:
            if split != "train" and os.path.isfile(os.path.join(self.cfg.data, f"{split}.{self.langs[lang]}.idx")):
                seen += load_split_sentences(self.cfg.data, split, self.langs[lang], self.dictionary)
        return torch.cat(seen).unique()

    def mask_symbol(self, lang):
        return self.specials[lang][2]

    def reverses(self, lang):
        return lang in self.reversed_langs

    def sentence_input(self, ids, lang):
        ids = torch.as_tensor(ids, dtype=torch.long)[: self.cfg.tokens_per_sample - 2]
        if self.reverses(lang):
            ids = ids.flip(0)
        bos, eos, _ = self.specials[lang]
        return torch.cat([ids.new_tensor([bos]), ids, ids.new_tensor([eos])])

    def random_candidate_sets(self):
        """Row of the masker's random-candidate table each language draws from."""
        within = self.replacement.random_source == "within"
        return list(range(len(self.langs))) if within else [0] * len(self.langs)

    def build_masker(self):
        specials = torch.tensor(sorted(self.special_ids))
        if self.replacement.random_source == "within":
            # Only symbols of the language's own training text.
            own = [self.symbols_of(lang, ["train"]) for lang in range(len(self.langs))]
            candidates, counts = candidate_table([ids[~torch.isin(ids, specials)] for ids in own])
        else:
            candidates, counts = candidate_table([real_symbol_ids(self.dictionary, exclude=self.special_ids)])
        knn = None
        if self.replacement.knn:
            if self.cfg.shift_special:
                raise XmlmError("--knn-replace with --shift-special: the neighbour table is built for the data's "
                                "dictionary, which shift-special extends")
            knn = load_knn_table(self.cfg.knn_table, self.dictionary, self.replacement.knn)
        return Masker(self.cfg.mask_prob, self.replacement_probs, specials, candidates, counts, knn)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        if split.startswith("valid_") or split.startswith("test_"):
            base, lang_name = split.split("_", 1)
            if lang_name not in self.langs:
                raise XmlmError(f"split {split}: language {lang_name} is not one of --langs {','.join(self.langs)}")
            split_langs = [self.langs.index(lang_name)]
        else:
            base, split_langs = split, range(len(self.langs))
        items, sentence_counts = [], []
        for lang in split_langs:
            sentences = (self.train_sentences()[lang] if base == "train"
                         else load_split_sentences(self.cfg.data, base, self.langs[lang], self.dictionary))
            bos, eos, _ = self.specials[lang]
            streams = cut_streams(sentences, eos, bos, self.cfg.tokens_per_sample, self.reverses(lang))
            items += [(s, lang) for s in streams]
            sentence_counts.append(len(sentences))
        dataset = MaskedLanguageDataset(
            items, self.dictionary.pad(), self.build_masker(),
            [self.mask_symbol(lang) for lang in range(len(self.langs))], self.random_candidate_sets(),
            seed=self.cfg.seed, shuffle=base == "train",
        )
        probabilities = np.zeros(len(self.langs))
        probabilities[list(split_langs)] = language_probabilities(sentence_counts, self.cfg.lang_sampling_alpha)
        dataset.language_probabilities = probabilities
        self.datasets[split] = dataset
        logger.info(f"bilingual_mlm {split}: {len(items)} streams of <= {self.cfg.tokens_per_sample} tokens; "
                    f"p(lang) = {dict(zip(self.langs, [round(float(p), 3) for p in probabilities]))}")

    def get_batch_iterator(self, dataset, max_tokens=None, max_sentences=None, max_positions=None,
                           ignore_invalid_inputs=False, required_batch_size_multiple=1, seed=1, num_shards=1,
                           shard_id=0, num_workers=0, epoch=1, data_buffer_size=0, disable_iterator_cache=False,
                           skip_remainder_batch=False, grouped_shuffling=False, update_epoch_batch_itr=False):
        batch_size = max_sentences or max(1, (max_tokens or 0) // self.cfg.tokens_per_sample)
        if not batch_size:
            raise XmlmError("bilingual_mlm needs --batch-size or --max-tokens")
        if not disable_iterator_cache and dataset in self.dataset_to_epoch_iter:
            # One iterator and its data-loader workers for the whole run (a new one per epoch cost ~10 s: torch
            # waits on every old worker). LanguageBatches is callable, so fairseq still resamples every epoch.
            return self.dataset_to_epoch_iter[dataset]
        dataset.set_epoch(epoch)
        batches = LanguageBatches(dataset.langs, dataset.language_probabilities, batch_size, seed,
                                  resample=dataset.shuffle)
        iterator = iterators.EpochBatchIterator(
            dataset=dataset, collate_fn=dataset.collater, batch_sampler=batches, seed=seed, num_shards=num_shards,
            shard_id=shard_id, num_workers=num_workers, epoch=epoch, buffer_size=data_buffer_size,
            skip_remainder_batch=skip_remainder_batch, reuse_dataloader=True, persistent_workers=True,
        )
        if not disable_iterator_cache:
            self.dataset_to_epoch_iter[dataset] = iterator
        return iterator

    def max_positions(self):
        return self.cfg.tokens_per_sample
