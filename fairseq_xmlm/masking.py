"""Whole-batch masked-language-model corruption, vectorised.

Stock fairseq masks item by item in Python (`MaskTokensDataset`), which makes a BERT-small on the Bible bound by the
data loader rather than the GPU. Here one call corrupts a whole padded batch with tensor operations, on whatever
device the batch lives on, and supports every replacement strategy of the two papers:

- mask   -> the language's mask symbol (`mask_ids[row]`, so Fake-English under shift-special gets its own mask),
- keep   -> the token itself,
- random -> a token drawn uniformly from the row's candidate set (the whole vocabulary for BERT's "cross" random
            words, only the row language's own vocabulary for Conneau et al.'s "within"),
- knn    -> one of the token's K nearest neighbours in the other language, uniformly (Dufter & Schuetze's
            knn-replace); a token without neighbours falls back to the mask symbol.

Which of them a task uses, with which probabilities, is one `ReplacementConfig` (both tasks' flags
`--replacement-probs`, `--random-replace`, `--no-random`, `--knn-replace`), resolved by `resolve_replacement_probs`.
`specials_follow_content` is the one step after it that the paper's code takes for shift-special (Fake-English's
`--shift-special-after-masking`).
"""
from dataclasses import dataclass

import torch

from fairseq_xmlm.errors import XmlmError

REPLACEMENTS = ("mask", "keep", "random", "knn")
RANDOM_SOURCES = ("cross", "within", "none")
DEFAULT_PROBS = (0.8, 0.1, 0.1, 0.0)  # BERT's
DEFAULT_KNN_PROBS = (0.5, 0.1, 0.1, 0.3)  # Dufter & Schuetze's knn-replace


def parse_replacement_probs(text):
    """"0.8,0.1,0.1" or "0.5,0.1,0.1,0.3" -> a 4-tuple (mask, keep, random, knn) summing to 1."""
    try:
        probs = [float(p) for p in text.split(",")]
    except ValueError:
        raise XmlmError(f"--replacement-probs must be comma-separated numbers MASK,KEEP,RANDOM[,KNN], got {text!r}")
    if len(probs) not in (3, 4) or any(p < 0 for p in probs):
        raise XmlmError(f"--replacement-probs needs 3 or 4 non-negative numbers MASK,KEEP,RANDOM[,KNN], got {text!r}")
    if abs(sum(probs) - 1.0) > 1e-6:
        raise XmlmError(f"--replacement-probs must sum to 1, got {text!r} (sum {sum(probs):g})")
    return tuple(probs + [0.0] * (4 - len(probs)))


@dataclass(frozen=True)
class ReplacementConfig:
    """What a target is replaced by, as the task flags say.

    probs:           `--replacement-probs` "MASK,KEEP,RANDOM[,KNN]"; "" = DEFAULT_PROBS (DEFAULT_KNN_PROBS with knn)
    random_replace:  where random words come from: "cross" (the whole vocabulary, BERT), "within" (the row
                     language's own vocabulary, Conneau et al.), "none" (never: the RANDOM share goes to KEEP)
    no_random:       `--no-random` (Dufter & Schuetze): random_replace "none", and an explicit RANDOM > 0 is refused
    knn:             K of `--knn-replace` (0: off)
    no_random_mask_share: `--no-random-mask-share` (0: off): under no_random, MASK takes this share and KEEP the
                     rest (after KNN's), instead of RANDOM's share going to KEEP. The paper's text gives .8/.2/0 (off);
                     its code (github pdufter/minimult, `mask_tokens` with `do_not_replace_with_random_words`) puts the
                     random share on the mask symbol: .9/.1/0.
    """

    probs: str = ""
    random_replace: str = "cross"
    no_random: bool = False
    knn: int = 0
    no_random_mask_share: float = 0.0

    @property
    def random_source(self):
        """"cross", "within" or "none", with --no-random applied."""
        return "none" if self.no_random else self.random_replace


def resolve_replacement_probs(config):
    """A ReplacementConfig -> the (mask, keep, random, knn) probabilities the masker uses."""
    if config.random_replace not in RANDOM_SOURCES:
        raise XmlmError(f"--random-replace must be one of {', '.join(RANDOM_SOURCES)}, got {config.random_replace!r}")
    probs = parse_replacement_probs(config.probs) if config.probs else None
    if config.no_random:
        if config.random_replace == "within":
            raise XmlmError("--no-random contradicts --random-replace within")
        if probs is not None and probs[2] > 0:
            raise XmlmError("--no-random contradicts a RANDOM probability > 0 in --replacement-probs")
    probs = probs or (DEFAULT_KNN_PROBS if config.knn else DEFAULT_PROBS)
    if config.no_random_mask_share:
        share = config.no_random_mask_share
        if not config.no_random:
            raise XmlmError("--no-random-mask-share applies to --no-random runs only")
        if not 0.0 < share <= 1.0 - probs[3]:
            raise XmlmError(f"--no-random-mask-share must be in (0, {1.0 - probs[3]:g}] (1 - the KNN share), "
                            f"got {share:g}")
        probs = (share, 1.0 - share - probs[3], 0.0, probs[3])
    elif config.random_source == "none":
        probs = (probs[0], probs[1] + probs[2], 0.0, probs[3])
    if probs[3] > 0 and not config.knn:
        raise XmlmError("a KNN probability in --replacement-probs needs --knn-replace K")
    if config.knn and probs[3] == 0:
        raise XmlmError("--knn-replace needs a KNN probability > 0 in --replacement-probs")
    return probs


@dataclass
class Masker:
    """What to corrupt and with what; `__call__` applies it to a padded batch.

    special_ids:        ids never chosen as targets and never drawn as random words (pad, bos, eos, unk, mask and
                        their Fake twins, fairseq's madeupword fillers).
    random_candidates:  (num_sets, C) ids, rows padded with -1; `random_counts` (num_sets,) valid entries per row.
                        Row `candidate_set[row]` of the batch draws from set `candidate_set[row]`.
    knn_neighbours:     (dict_size, K) ids of neighbours in the other language, -1 where missing; None without knn.
    """

    mask_prob: float
    probs: tuple  # (mask, keep, random, knn)
    special_ids: torch.Tensor
    random_candidates: torch.Tensor
    random_counts: torch.Tensor
    knn_neighbours: torch.Tensor = None
    sort_twice: bool = False  # choose_targets' earlier ranking: the same targets, kept to measure and test against

    def __post_init__(self):
        if not 0.0 < self.mask_prob < 1.0:
            raise XmlmError(f"mask probability must be in (0, 1), got {self.mask_prob}")
        if self.probs[3] > 0 and self.knn_neighbours is None:
            raise XmlmError("a KNN replacement probability > 0 needs a neighbour table (--knn-table)")
        if self.probs[2] > 0 and int(self.random_counts.min()) == 0:
            raise XmlmError("random replacement is on but a language has no candidate tokens")

    def to(self, device):
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return Masker(self.mask_prob, self.probs, move(self.special_ids), move(self.random_candidates),
                      move(self.random_counts), move(self.knn_neighbours), self.sort_twice)

    def __call__(self, tokens, mask_ids, candidate_set, generator, pad, row_probs=None):
        return mask_batch(tokens, mask_ids, candidate_set, generator, pad, self, row_probs)


def choose_targets(maskable, mask_prob, generator, sort_twice=False):
    """Per row, pick round(mask_prob * n) of its maskable positions uniformly (probabilistic rounding, as fairseq).

    Exactly that many per sentence, not a Bernoulli draw per token, so short sentences are not over- or
    under-masked on average. A position's rank among its row's scores is the inverse of the sorting permutation:
    one sort and a scatter, where `sort_twice` (the earlier code) sorts the permutation again, for the same ranks at
    about 1.7 times the cost on a CPU (benchmarks/host_cost.py).
    """
    rows, width = maskable.shape
    scores = torch.rand(rows, width, generator=generator, device=maskable.device)
    scores = scores.masked_fill(~maskable, 2.0)  # non-maskable positions sort last
    order = scores.argsort(dim=1)
    if sort_twice:
        rank = order.argsort(dim=1)
    else:
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(width, device=order.device).expand(rows, width))
    n_maskable = maskable.sum(dim=1)
    n_targets = (mask_prob * n_maskable + torch.rand(rows, generator=generator, device=maskable.device)).floor()
    return (rank < n_targets.unsqueeze(1)) & maskable


def mask_batch(tokens, mask_ids, candidate_set, generator, pad, masker, row_probs=None):
    """Corrupt a padded batch `tokens` (B, T).

    mask_ids (B,) the mask symbol of each row's language; candidate_set (B,) the random-candidate set of each row.
    row_probs (B, 4): each row's own (mask, keep, random, knn) probabilities instead of `masker.probs` (rows of
    several runs masked in one call; `masker.probs` must then be > 0 wherever some row's is).
    Returns (inputs, targets): targets hold the original token at target positions and `pad` elsewhere.
    """
    maskable = ~torch.isin(tokens, masker.special_ids)
    targets_at = choose_targets(maskable, masker.mask_prob, generator, masker.sort_twice)

    if row_probs is None:
        row_probs = torch.tensor(masker.probs, device=tokens.device).expand(tokens.size(0), 4)
    how = torch.multinomial(row_probs, tokens.size(1), replacement=True, generator=generator)

    inputs = tokens.clone()
    mask_symbol = mask_ids.unsqueeze(1).expand_as(tokens)

    if masker.probs[2] > 0:
        sets = candidate_set.unsqueeze(1).expand_as(tokens)
        counts = masker.random_counts[sets]
        pick = (torch.rand(tokens.shape, generator=generator, device=tokens.device) * counts).long()
        random_words = masker.random_candidates[sets, pick.clamp(max=masker.random_candidates.size(1) - 1)]
        inputs = torch.where(targets_at & (how == 2), random_words, inputs)

    if masker.probs[3] > 0:
        neighbours = masker.knn_neighbours[tokens]  # (B, T, K)
        column = torch.randint(neighbours.size(-1), tokens.shape, generator=generator, device=tokens.device)
        knn_words = neighbours.gather(-1, column.unsqueeze(-1)).squeeze(-1)
        use_knn = targets_at & (how == 3)
        inputs = torch.where(use_knn & (knn_words >= 0), knn_words, inputs)
        inputs = torch.where(use_knn & (knn_words < 0), mask_symbol, inputs)

    inputs = torch.where(targets_at & (how == 0), mask_symbol, inputs)
    targets = torch.where(targets_at, tokens, torch.full_like(tokens, pad))
    return inputs, targets


def candidate_table(candidate_lists):
    """List of 1-D id tensors -> (padded (S, C) table with -1, counts (S,))."""
    width = max(1, max(len(c) for c in candidate_lists))
    table = torch.full((len(candidate_lists), width), -1, dtype=torch.long)
    for row, ids in enumerate(candidate_lists):
        table[row, : len(ids)] = torch.as_tensor(ids, dtype=torch.long)
    counts = torch.tensor([len(c) for c in candidate_lists], dtype=torch.long)
    return table, counts


def specials_follow_content(inputs, shift, specials):
    """Shift-special as the paper's code does it (github pdufter/minimult, run_language_modeling.py `train`:
    `shift_special_tokens` after `mask_tokens`): a row's special tokens are the shifted ones (id + `shift`) when the
    row holds any shifted id of a real token after masking, a random replacement included, else the unshifted ones;
    the rows' language plays no part. So an English row that drew a random Fake-English word gets Fake-English
    specials. `specials`: the unshifted ids it applies to (a tensor on the inputs' device); padding keeps its id.
    Whole-batch tensor operations without a host sync (a CUDA graph may hold them); returns a new tensor."""
    unshifted = torch.where(inputs >= shift, inputs - shift, inputs)
    is_special = torch.isin(unshifted, specials)
    shifted_row = ((inputs >= shift) & ~is_special).any(dim=1, keepdim=True)
    return torch.where(is_special, unshifted + shift * shifted_row, inputs)
