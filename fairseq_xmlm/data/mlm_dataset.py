"""A fairseq dataset of model inputs (one token sequence + its language per item) masked a whole batch at a time."""
import numpy as np
import torch
from fairseq.data import FairseqDataset, data_utils


class MaskedLanguageDataset(FairseqDataset):
    """Items are `(tokens, lang)` pairs; the collater pads them and corrupts the batch with `masker`.

    Masks depend only on (seed, epoch, the batch's smallest item id): the same seed gives the same masks per
    epoch, whatever the number of data-loader workers. `mask_ids[lang]` is the mask symbol of each language and
    `candidate_set[lang]` the row of the masker's random-candidate table that language draws from.
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
        self.epoch = 1

    def __getitem__(self, index):
        tokens = torch.from_numpy(self.tokens[self.offsets[index]:self.offsets[index + 1]])
        return {"id": index, "tokens": tokens, "lang": int(self.langs[index])}

    def __len__(self):
        return len(self.sizes)

    def num_tokens(self, index):
        return int(self.sizes[index])

    def size(self, index):
        return int(self.sizes[index])

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return False  # new random batches every epoch

    def set_epoch(self, epoch):
        self.epoch = epoch

    def ordered_indices(self):
        """Shuffled, then stably sorted by length: batches hold similar lengths (little padding, as fairseq's
        masked_lm does) and fairseq shuffles the order of the batches each epoch."""
        if not self.shuffle:
            return np.argsort(self.sizes, kind="stable")
        with data_utils.numpy_seed(self.seed, self.epoch):
            order = np.random.permutation(len(self))
        return order[np.argsort(self.sizes[order], kind="stable")]

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
        return {
            "id": ids,
            "nsentences": len(samples),
            "ntokens": int(tokens.ne(self.pad).sum()),
            "net_input": {"src_tokens": inputs, "lang_ids": langs},
            "target": targets,
        }
