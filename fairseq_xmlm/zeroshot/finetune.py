"""Fine-tune a pretrained `partially_shared_roberta` on English and evaluate zero-shot in another language.

One training loop (`train_head`) serves every task head: sentence(-pair) classification (XNLI, genre), word
tagging (NER) and biaffine dependency parsing. A head is an nn.Module holding the encoder as `.encoder`, with
`loss(rows, lang_id)` and `predict_batch(rows, lang_id)`; rows are its examples, whose first field is the model
input (so batches can be sorted by length). Heads build each batch on the CPU and move it to the device of their
parameters, so the same loop runs on the CPU or a GPU (`--device`); nothing in it waits for the GPU more than
once per epoch (the loss is summed on the device and read at the epoch's end).

Conneau et al. 2020's protocol: the task head reads the last layer; English fine-tuning updates the shared
parameters and the head only (language-specific embeddings and layers are frozen); at test time the target
language's lang_id routes its input through its own embeddings / layers, followed by the fine-tuned shared layers
and head. The model state of the epoch with the best English dev score is kept ("we save a checkpoint after each
epoch" and select on English dev).

An epoch is `epoch_size` training examples or one pass over the training set, whichever is smaller (default: a
pass), after which the English dev set is scored. The paper's 200 XNLI epochs are epochs of the XLM code it was
run with (`--epoch_size 20000` in XLM's XNLI recipe, and XLM ends an epoch at the end of a pass too): 20,000 of
MultiNLI's 393k pairs, 4M examples in all, not 200 passes (79M examples, weeks of fine-tuning). NER and parsing
epochs are passes. Training batches hold examples of similar length: each pass shuffles the
examples, sorts pools of 100 batches by length, cuts them into batches and shuffles the batches.
"""
import copy
import dataclasses
import itertools
import math
import random
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_xmlm.devices import default_device
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import pad_batch
from fairseq_xmlm.io import log
from fairseq_xmlm.zeroshot.parsing import IGNORE, BiaffineParser

SCHEDULES = ("constant", "warmup_linear")
POOL_BATCHES = 100  # batches per length-sorted pool: little padding, yet the batches of a pass stay random


@dataclasses.dataclass
class FinetuneConfig:
    """XNLI in the paper: batch {4, 8}, encoder lr {1.25e-6, 2.5e-6, 5e-6}, head lr {5e-6, 2.5e-5, 1.25e-4},
    constant lr, 200 epochs of 20,000 examples. NER / parsing: batch {16, 32}, lr {2e-5, 3e-5, 5e-5} for both,
    10 % warm-up then linear decay to 0, 10 passes. `epoch_size`: training examples per epoch, at most one pass
    (None: one pass)."""

    batch_size: int = 8
    encoder_lr: float = 5e-6
    head_lr: float = 1.25e-4
    epochs: int = 10
    schedule: str = "constant"
    dropout: float = 0.1
    seed: int = 1
    epoch_size: int | None = None

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise XmlmError(f"unknown schedule {self.schedule!r} (expected one of {', '.join(SCHEDULES)})")
        if self.batch_size < 1 or self.epochs < 1:
            raise XmlmError("batch size and epochs must be at least 1")
        if self.epoch_size is not None and self.epoch_size < 1:
            raise XmlmError(f"epoch size {self.epoch_size} must be at least 1 (or None: one pass)")


def resolve_device(name):
    """--device NAME -> torch.device; a GPU this machine lacks is an XmlmError, not a traceback."""
    try:
        device = torch.device(name or default_device())
    except RuntimeError as err:
        raise XmlmError(f"--device {name}: {err}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise XmlmError(f"--device {name}: no CUDA GPU is available here (use --device cpu)")
    return device


def load_pretrained(path, data=None, device="cpu"):
    """(encoder, task) of a pretraining checkpoint, on `device`, in eval mode; `data` overrides its data-bin."""
    from fairseq_xmlm.checkpoints import load_checkpoint

    model, task, _ = load_checkpoint(path, device=resolve_device(device), data=data)
    if not hasattr(model, "language_parameters"):
        raise XmlmError(f"{path}: not a partially_shared_roberta checkpoint")
    return model.eval(), task


def language_index(task, lang):
    langs = list(task.langs)
    if lang not in langs:
        raise XmlmError(f"language {lang!r} is not one of the checkpoint's languages ({', '.join(langs)})")
    return langs.index(lang)


def freeze_language_specific(encoder):
    """Stop gradients to every language-specific parameter (all languages); returns the frozen names."""
    frozen = {name for names in encoder.language_parameters().values() for name in names}
    for name, parameter in encoder.named_parameters():
        if name in frozen:
            parameter.requires_grad_(False)
    return frozen


def _device(module):
    return next(module.parameters()).device


def _batch(head, sequences, lang_id):
    """(tokens (B, T), lang_ids (B,), has_padding) of input sequences, all of language lang_id, on the head's device.

    The batch is padded on the CPU; whether it holds padding is known there, so the encoder need not ask the GPU."""
    device = _device(head)
    tokens = pad_batch(sequences, head.encoder.padding_idx).to(device, non_blocking=True)
    lang_ids = torch.full((len(sequences),), lang_id, dtype=torch.long, device=device)
    return tokens, lang_ids, len({len(s) for s in sequences}) > 1


class SentenceClassifier(nn.Module):
    """Representation of the first token (`<s>`) of the last layer -> dropout -> linear (-> softmax in the loss).

    Rows: (input ids, class index); a pair is one input `<s> A </s> B </s>`."""

    def __init__(self, encoder, num_classes, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.cfg.encoder_embed_dim, num_classes)
        self.to(_device(encoder))  # initialised on the CPU: the same head on any device

    def forward(self, src_tokens, lang_ids, has_padding=None):
        first_token = self.encoder.encode_layers(src_tokens, lang_ids, has_padding=has_padding)[-1][:, 0]
        return self.head(self.dropout(first_token))

    def _logits(self, rows, lang_id):
        return self(*_batch(self, [row[0] for row in rows], lang_id))

    def loss(self, rows, lang_id):
        labels = torch.tensor([row[1] for row in rows]).to(_device(self), non_blocking=True)
        return F.cross_entropy(self._logits(rows, lang_id), labels)

    def predict_batch(self, rows, lang_id):
        """Class indices (a tensor on the device: `predict` reads all batches' at once)."""
        return self._logits(rows, lang_id).argmax(-1)


class WordExample(NamedTuple):
    """One sentence for a word-level head. tokens: `<s> pieces </s>`; positions: the first-subword position of
    each word that fits the model (a long sentence is cut); labels: tag / relation index per kept word (None
    when only predicted); heads: CoNLL-U HEAD per kept word (parsing only)."""

    tokens: torch.Tensor
    positions: torch.Tensor
    labels: torch.Tensor | None = None
    heads: torch.Tensor | None = None


def _word_states(head, rows, lang_id, with_root):
    """(B, N, D) last-layer states at each row's word positions (position 0, `<s>`, first when with_root) and the
    (B, N) mask of real words."""
    tokens, lang_ids, has_padding = _batch(head, [row.tokens for row in rows], lang_id)
    states = head.encoder.encode_layers(tokens, lang_ids, has_padding=has_padding)[-1]
    positions = [torch.cat([row.positions.new_zeros(1), row.positions]) if with_root else row.positions
                 for row in rows]
    index = pad_batch(positions, -1).to(states.device, non_blocking=True)
    mask = index.ne(-1)
    words = states.gather(1, index.clamp(min=0).unsqueeze(-1).expand(-1, -1, states.size(-1)))
    return head.dropout(words), mask


class WordTagger(nn.Module):
    """NER: representation of the first subword of each word -> dropout -> linear (-> softmax in the loss)."""

    def __init__(self, encoder, num_tags, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.cfg.encoder_embed_dim, num_tags)
        self.to(_device(encoder))

    def loss(self, rows, lang_id):
        words, _ = _word_states(self, rows, lang_id, with_root=False)
        labels = pad_batch([row.labels for row in rows], IGNORE).to(words.device, non_blocking=True)
        return F.cross_entropy(self.head(words).flatten(0, 1), labels.flatten(), ignore_index=IGNORE)

    def predict_batch(self, rows, lang_id):
        words, _ = _word_states(self, rows, lang_id, with_root=False)
        tags = self.head(words).argmax(-1).cpu()
        return [tags[i, : len(row.positions)].tolist() for i, row in enumerate(rows)]


class DependencyParser(nn.Module):
    """Biaffine parser over first-subword representations; the `<s>` state stands for the root."""

    def __init__(self, encoder, num_relations, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = BiaffineParser(encoder.cfg.encoder_embed_dim, num_relations)
        self.to(_device(encoder))

    def loss(self, rows, lang_id):
        words, mask = _word_states(self, rows, lang_id, with_root=True)
        # the root's own head / label are ignored by the loss; 0 fills them and the padding
        heads = pad_batch([torch.cat([row.heads.new_zeros(1), row.heads]) for row in rows], 0)
        labels = pad_batch([torch.cat([row.labels.new_zeros(1), row.labels]) for row in rows], 0)
        return self.head.loss(words, mask, heads.to(words.device, non_blocking=True),
                              labels.to(words.device, non_blocking=True))

    def predict_batch(self, rows, lang_id):
        words, mask = _word_states(self, rows, lang_id, with_root=True)
        heads, labels = self.head.predict(words, mask)
        return list(zip(heads, labels))


def _optimizer_and_schedule(model, config, total_steps):
    """Adam with separate learning rates for the encoder and the head; optional 10 % warm-up + linear decay."""
    encoder_params = [p for p in model.encoder.parameters() if p.requires_grad]
    encoder_ids = {id(p) for p in model.encoder.parameters()}
    head_params = [p for p in model.parameters() if id(p) not in encoder_ids and p.requires_grad]
    optimizer = torch.optim.Adam([{"params": encoder_params, "lr": config.encoder_lr},
                                  {"params": head_params, "lr": config.head_lr}])
    if config.schedule == "constant":
        return optimizer, None
    warmup = max(1, math.ceil(0.1 * total_steps))

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def length_sorted_batches(lengths, batch_size, rng):
    """One pass over the examples in batches of similar length, ceil(n / batch_size) batches: the examples in
    random order, cut into pools of POOL_BATCHES batches, each pool sorted by length and cut into batches, the
    batches shuffled."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    batches = []
    for start in range(0, len(order), batch_size * POOL_BATCHES):
        pool = sorted(order[start : start + batch_size * POOL_BATCHES], key=lambda i: lengths[i])
        batches += [pool[k : k + batch_size] for k in range(0, len(pool), batch_size)]
    rng.shuffle(batches)
    return batches


@torch.no_grad()
def predict(model, rows, lang_id, batch_size=64):
    """model.predict_batch over length-sorted batches (less padding); results in input order. Tensor results
    (class indices) stay on the device until all batches are done: one transfer for the whole set."""
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    outputs = [model.predict_batch([rows[i] for i in order[start : start + batch_size]], lang_id)
               for start in range(0, len(order), batch_size)]
    if outputs and torch.is_tensor(outputs[0]):
        outputs = [torch.cat(outputs).tolist()]
    by_position = dict(zip(order, itertools.chain.from_iterable(outputs)))
    return [by_position[i] for i in range(len(rows))]


def predict_classes(classifier, inputs, lang_id, batch_size=64):
    """Class index for each input sequence, all of language `lang_id`."""
    return predict(classifier, [(x, None) for x in inputs], lang_id, batch_size)


def accuracy(predictions, labels):
    """Percent of predictions equal to their label."""
    if not labels:
        raise XmlmError("accuracy of an empty evaluation set")
    return 100.0 * sum(p == y for p, y in zip(predictions, labels)) / len(labels)


def train_head(model, train, dev, lang_id, config, dev_score, metric="dev_score"):
    """Fine-tune `model` on train rows of language lang_id; keep the epoch with the best dev_score(model, dev).

    Returns the per-epoch history [{"epoch", "loss", metric}]; the model ends in the best state.
    """
    if not train or not dev:
        raise XmlmError("fine-tuning needs non-empty training and dev sets")
    torch.manual_seed(config.seed)
    shuffler = random.Random(config.seed)
    lengths = [len(row[0]) for row in train]
    passes = itertools.chain.from_iterable(length_sorted_batches(lengths, config.batch_size, shuffler)
                                           for _ in itertools.count())
    steps_per_epoch = math.ceil(min(config.epoch_size or len(train), len(train)) / config.batch_size)
    optimizer, scheduler = _optimizer_and_schedule(model, config, steps_per_epoch * config.epochs)
    history, best = [], None
    for epoch in range(1, config.epochs + 1):
        model.train()
        total_loss, examples = 0.0, 0
        for batch in itertools.islice(passes, steps_per_epoch):
            rows = [train[i] for i in batch]
            loss = model.loss(rows, lang_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total_loss = total_loss + loss.detach() * len(rows)
            examples += len(rows)
        train_loss = float(total_loss) / examples
        score = dev_score(model, dev)
        history.append({"epoch": epoch, "loss": train_loss, metric: score})
        log(f"epoch {epoch}: train loss {train_loss:.4f}, English {metric} {score:.2f}")
        if best is None or score > best[0]:
            best = (score, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[1])
    return history


def train_sentence_classifier(classifier, train, dev, lang_id, config):
    """train_head for (input, class) rows, selected on dev accuracy (history key "dev_accuracy")."""
    labels = [y for _, y in dev]
    return train_head(classifier, train, dev, lang_id, config,
                      lambda model, rows: accuracy(predict(model, rows, lang_id), labels), "dev_accuracy")
