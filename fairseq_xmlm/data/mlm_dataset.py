"""A fairseq dataset of model inputs (one token sequence + its language per item) masked a whole batch at a time."""
import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils

from fairseq_xmlm.masking import specials_follow_content


class MaskedLanguageDataset(FairseqDataset):
    """Items are `(tokens, lang)` pairs; the collater pads them and corrupts the batch with `masker`.

    Masks depend only on (seed, epoch, the batch's smallest item id): the same seed gives the same masks per
    epoch, whatever the number of data-loader workers. `mask_ids[lang]` is the mask symbol of each language and
    `candidate_set[lang]` the row of the masker's random-candidate table that language draws from.

    fairseq builds the batch list once and keeps its data-loader workers alive across epochs (see
    `can_reuse_epoch_itr_across_epochs`). Batches still change every epoch: a batch is a list of *slots*, and
    `__getitem__` maps slot -> item through a per-epoch random permutation within each group of slots of equal
    (length, language), so a batch keeps its shape (lengths, languages) but gets other sentences each epoch.

    A batch is read and padded whole (`__getitems__`, `pad_right`); `per_item` True reads it item by item and pads it
    with fairseq's `collate_tokens`, as the earlier code did (the same batches; kept to measure and test against).
    """

    def __init__(self, items, pad, masker, mask_ids, candidate_set, seed, shuffle=True, per_item=False,
                 content_specials=None):
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
        self.per_item = per_item
        # (shift, special ids): after masking, specials follow each row's content (`masking.specials_follow_content`)
        self.content_specials = content_specials
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
            self._slot_items = (epoch, self.slot_items(order))
        return self._slot_items[1]

    def slot_items(self, order):
        """slot -> item from the epoch's random permutation `order` of the items: each group of slots of equal
        (length, language) gets the items of that group, in random order."""
        slots = np.lexsort((self.langs, self.sizes))  # stable: slots grouped by (length, language)
        items = order[np.lexsort((self.langs[order], self.sizes[order]))]  # same groups, random within each
        mapping = np.empty(len(self), dtype=np.int64)
        mapping[slots] = items
        return mapping

    def __getitem__(self, index):
        mapping = self.item_of_slot()
        item = int(mapping[index]) if mapping is not None else index
        tokens = torch.from_numpy(self.tokens[self.offsets[item]:self.offsets[item + 1]])
        return {"id": item, "tokens": tokens, "lang": int(self.langs[item])}

    def __getitems__(self, indices):
        """The samples of a batch of slots, as `__getitem__` gives them one by one: torch's DataLoader calls this for a
        whole batch when a dataset has it. One slot -> item lookup and one read of the shared epoch per batch."""
        if self.per_item:
            return [self[index] for index in indices]
        mapping = self.item_of_slot()
        items = np.asarray(indices, dtype=np.int64)
        if mapping is not None:
            items = mapping[items]
        tokens = torch.from_numpy(self.tokens)
        return [{"id": item, "tokens": tokens[start:end], "lang": lang} for item, start, end, lang in
                zip(items.tolist(), self.offsets[items].tolist(), self.offsets[items + 1].tolist(),
                    self.langs[items].tolist())]

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
        rows = [s["tokens"] for s in samples]
        tokens = data_utils.collate_tokens(rows, self.pad) if self.per_item else pad_right(rows, self.pad)
        generator = torch.Generator().manual_seed(
            (self.seed * 1_000_003 + self.epoch) * 1_000_003 + int(ids.min())
        )
        inputs, targets = self.masker(tokens, self.mask_ids[langs], self.candidate_set[langs], generator, self.pad)
        if self.content_specials is not None:
            inputs = specials_follow_content(inputs, *self.content_specials)
        # The target positions as flat indices into (B * T), found here on the CPU: the xmlm_masked_lm criterion
        # gathers them on the GPU without asking the GPU which positions are targets (a host sync per step).
        masked_positions = targets.view(-1).ne(self.pad).nonzero().squeeze(1)
        real = int(tokens.ne(self.pad).sum())
        return {
            "id": ids,
            "nsentences": len(samples),
            "ntokens": real,
            "net_input": {"src_tokens": inputs, "lang_ids": langs, "has_padding": real < tokens.numel(),
                          # the model routes a one-language batch without finding its rows on the device
                          "batch_lang": int(langs[0]) if bool((langs == langs[0]).all()) else None},
            "target": targets,
            "masked_positions": masked_positions,
            "nmasked": len(masked_positions),
        }


def pad_right(rows, pad):
    """1-D tensors -> (len(rows), longest) tensor, each row right-padded with `pad`: fairseq's `collate_tokens` (no
    left padding, no eos moved) as whole-batch operations instead of one copy per row."""
    lengths = torch.tensor([row.shape[0] for row in rows])  # not len(): Tensor.__len__ is a Python call
    out = torch.full((len(rows), int(lengths.max())), pad, dtype=rows[0].dtype)
    out[torch.arange(out.size(1)) < lengths.unsqueeze(1)] = torch.cat(rows)
    return out
