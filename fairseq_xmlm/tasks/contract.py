"""The task contract: what the model, the evaluation and the analysis ask of a task.

fake_english and bilingual_mlm fulfil `LanguageTask`. Code outside `tasks/` reads a task through these members
only, never through its config (`task.cfg`): a task with other flags, or a new task, joins by providing them.
"""
from typing import Protocol, Sequence, runtime_checkable

import torch
from fairseq.data import Dictionary


@runtime_checkable
class ModelTask(Protocol):
    """What `partially_shared_roberta` builds a model from."""

    langs: Sequence[str]  # language names; lang id = index
    dictionary: Dictionary  # one dictionary for every language
    lang_pos: bool  # Dufter & Schuetze's lang-pos: language-specific position and segment embeddings

    def max_positions(self) -> int:
        """Longest model input, specials included."""

    def language_vocab_masks(self) -> torch.Tensor:
        """(languages, len(dictionary)) bool: the symbols each language may predict (--sep-emb)."""


@runtime_checkable
class LanguageTask(ModelTask, Protocol):
    """What evaluation and analysis read: each language's sentences exactly as the model saw them in training."""

    special_ids: set  # ids that are no words: specials and mask symbols of every language, unused fillers

    def load_split_sentences(self, split: str, lang: int = 0) -> list:
        """Piece ids (1-D LongTensors, no specials) of the items of a split in language `lang`, as
        `sentence_input` takes them (Fake-English: the English ids, for both languages)."""

    def sentence_input(self, ids, lang: int) -> torch.Tensor:
        """Piece ids -> the model input of that sentence in language `lang` (specials added, ids shifted or
        reordered as the task trains that language)."""

    def mask_symbol(self, lang: int) -> int:
        """The mask id language `lang` trains with."""

    def reverses(self, lang: int) -> bool:
        """Whether `sentence_input` reverses the order of the pieces of language `lang`."""
