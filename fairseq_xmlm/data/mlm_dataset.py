"""A fairseq dataset of model inputs (one token sequence + its language per item) masked a whole batch at a time."""
import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils


class MaskedLanguageDataset(FairseqDataset):
    """Items are `(tokens, lang)` pairs; the collater pads them and corrupts the batch with `masker`.

    Masks depend only on (seed, epoch, the batch's smallest item id): the same seed gives the same masks per
    epoch, whatever the number of data-loader workers. `mask_ids[lang]` is the mask symbol of each language and
    `candidate_set[lang]` the row of the masker's random-candidate table that language draws from.

    fairseq builds the batch list once and keeps its data-loader workers alive across epochs (see
    `can_reuse_epoch_itr_across_epochs`). Batches still change every epoch: a batch is a list of *slots*, and
    `__getitem__` maps slot -> item through a per-epoch random permutation within each group of slots of equal
    (length, language), so a batch keeps its shape (lengths, languages) but gets other sentences each epoch.
    """

    def __init__(self, items, pad, masker, mask_ids, candidate_set, seed, shuffle=True):
        super().__init__()
        # One flat buffer + offsets rather than a list of tensors: one array to pickle or share with data-loader
        # workers instead of one object per sentence.
        self.sizes = np.array([len(tokens) for tokens, _ in items], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])
        self.tokens = np.concatenate([np.asarray(tokens, dtype=np.int64) for tokens, _ in items]) if items else \
            np.zeros(0, dtype=np.int64)
        self.langs = np.array([lang for _, lang in items], dtype=np.int64)
        self.pad = pad
        self.masker = masker
        self.mask_ids = torch.as_tensor(mask_ids, dtype=torch.long)
        self.candidate_set = torch.as_tensor(candidate_set, dtype=torch.long)
        self.seed = seed
        self.shuffle = shuffle
        # set_epoch runs in the main process, but persistent data-loader workers collate with their own copy of
        # the dataset: the epoch lives in shared memory so that they see it (forked or spawned alike).
        self._shared_epoch = torch.ones(1, dtype=torch.long).share_memory_()
        self._slot_items = (None, None)  # (epoch, slot -> item), computed once per epoch in each process

    @property
    def epoch(self):
        return int(self._shared_epoch[0])

    def set_epoch(self, epoch):
        self._shared_epoch[0] = epoch

    def item_of_slot(self):
        """slot -> item for the current epoch, or None (identity) without shuffling."""
        if not self.shuffle:
            return None
        epoch = self.epoch
        if self._slot_items[0] != epoch:
            with data_utils.numpy_seed(self.seed, epoch):
                order = np.random.permutation(len(self))
            slots = np.lexsort((self.langs, self.sizes))  # stable: slots grouped by (length, language)
            items = order[np.lexsort((self.langs[order], self.sizes[order]))]  # same groups, random within each
            mapping = np.empty(len(self), dtype=np.int64)
            mapping[slots] = items
            self._slot_items = (epoch, mapping)
        return self._slot_items[1]

    def __getitem__(self, index):
        mapping = self.item_of_slot()
        item = int(mapping[index]) if mapping is not None else index
        tokens = torch.from_numpy(self.tokens[self.offsets[item]:self.offsets[item + 1]])
        return {"id": item, "tokens": tokens, "lang": int(self.langs[item])}

    def __len__(self):
        return len(self.sizes)

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        # True: fairseq then keeps one batch iterator and its data-loader workers for the whole run (a new iterator
        # per epoch cost ~10 s per epoch: torch waits 5 s per old worker before killing it) and only reshuffles the
        # batch order each epoch. The batch contents still change through item_of_slot, so nothing is lost.
        return True

    def ordered_indices(self):
        """Slots by length (stable): batches hold similar lengths (little padding, as fairseq's masked_lm does);
        fairseq shuffles the order of the batches each epoch and item_of_slot their contents."""
        return np.argsort(self.sizes, kind="stable")

    def collater(self, samples):
        if not samples:
            return {}
        ids = torch.tensor([s["id"] for s in samples])
        langs = torch.tensor([s["lang"] for s in samples])
        tokens = data_utils.collate_tokens([s["tokens"] for s in samples], self.pad)
        generator = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + self.epoch) * 1_000_003 + int(ids.min())
        )
        inputs, targets = self.masker(tokens, self.mask_ids[langs], self.candidate_set[langs], generator, self.pad)
        # The target positions as flat indices into (B * T), found here on the CPU: the xmlm_masked_lm criterion
        # gathers them on the GPU without asking the GPU which positions are targets (a host sync per step).
        masked_positions = targets.view(-1).ne(self.pad).nonzero().squeeze(1)
        real = int(tokens.ne(self.pad).sum())
        return {
            "id": ids,
            "nsentences": len(samples),
            "ntokens": real,
            "net_input": {"src_tokens": inputs, "lang_ids": langs, "has_padding": real < tokens.numel()},
            "target": targets,
            "masked_positions": masked_positions,
            "nmasked": len(masked_positions),
        }
