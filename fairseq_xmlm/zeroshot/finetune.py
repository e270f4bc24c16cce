"""Fine-tune a pretrained `partially_shared_roberta` on English and evaluate zero-shot in another language.

One training loop (`train_head`) serves every task head: sentence(-pair) classification (XNLI, genre), word
tagging (NER) and biaffine dependency parsing. A head is an nn.Module holding the encoder as `.encoder`, with
`loss(rows, lang_id)` and `predict_batch(rows, lang_id)`; rows are its examples, whose first field is the model
input (so batches can be sorted by length).

Conneau et al. 2020's protocol: the task head reads the last layer; English fine-tuning updates the shared
parameters and the head only (language-specific embeddings and layers are frozen); at test time the target
language's lang_id routes its input through its own embeddings / layers, followed by the fine-tuned shared layers
and head. The model state of the epoch with the best English dev score is kept ("we save a checkpoint after each
epoch" and select on English dev).
"""
import copy
import dataclasses
import math
import random
import sys
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.zeroshot.parsing import BiaffineParser

SCHEDULES = ("constant", "warmup_linear")


@dataclasses.dataclass
class FinetuneConfig:
    """XNLI in the paper: batch {4, 8}, encoder lr {1.25e-6, 2.5e-6, 5e-6}, head lr {5e-6, 2.5e-5, 1.25e-4},
    constant lr, 200 epochs. NER / parsing: batch {16, 32}, lr {2e-5, 3e-5, 5e-5} for both, 10 % warm-up then
    linear decay to 0, 10 epochs."""

    batch_size: int = 8
    encoder_lr: float = 5e-6
    head_lr: float = 1.25e-4
    epochs: int = 10
    schedule: str = "constant"
    dropout: float = 0.1
    seed: int = 1

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise XmlmError(f"unknown schedule {self.schedule!r} (expected one of {', '.join(SCHEDULES)})")
        if self.batch_size < 1 or self.epochs < 1:
            raise XmlmError("batch size and epochs must be at least 1")


def log(message):
    print(message, file=sys.stderr, flush=True)


def load_pretrained(path, data=None):
    """(encoder, task) of a pretraining checkpoint, on CPU, in eval mode; `data` overrides its data-bin."""
    from fairseq_xmlm.checkpoints import load_checkpoint

    model, task, _ = load_checkpoint(path, data=data)
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


def pad_batch(sequences, pad):
    """Right-pad 1-D LongTensors into (B, T)."""
    batch = torch.full((len(sequences), max(len(s) for s in sequences)), pad, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        batch[row, : len(sequence)] = sequence
    return batch


def _lang_ids(rows, lang_id):
    return torch.full((len(rows),), lang_id, dtype=torch.long)


class SentenceClassifier(nn.Module):
    """Representation of the first token (`<s>`) of the last layer -> dropout -> linear (-> softmax in the loss).

    Rows: (input ids, class index); a pair is one input `<s> A </s> B </s>`."""

    def __init__(self, encoder, num_classes, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.cfg.encoder_embed_dim, num_classes)

    def forward(self, src_tokens, lang_ids):
        first_token = self.encoder.encode_layers(src_tokens, lang_ids)[-1][:, 0]
        return self.head(self.dropout(first_token))

    def _logits(self, rows, lang_id):
        return self(pad_batch([row[0] for row in rows], self.encoder.padding_idx), _lang_ids(rows, lang_id))

    def loss(self, rows, lang_id):
        return F.cross_entropy(self._logits(rows, lang_id), torch.tensor([row[1] for row in rows]))

    def predict_batch(self, rows, lang_id):
        return self._logits(rows, lang_id).argmax(-1).tolist()


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
    tokens = pad_batch([row.tokens for row in rows], head.encoder.padding_idx)
    states = head.encoder.encode_layers(tokens, _lang_ids(rows, lang_id))[-1]
    positions = [torch.cat([row.positions.new_zeros(1), row.positions]) if with_root else row.positions
                 for row in rows]
    index = pad_batch(positions, -1)
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

    def loss(self, rows, lang_id):
        words, mask = _word_states(self, rows, lang_id, with_root=False)
        return F.cross_entropy(self.head(words)[mask], torch.cat([row.labels for row in rows]))

    def predict_batch(self, rows, lang_id):
        words, mask = _word_states(self, rows, lang_id, with_root=False)
        tags = self.head(words).argmax(-1)
        return [tags[i, : int(mask[i].sum())].tolist() for i in range(len(rows))]


class DependencyParser(nn.Module):
    """Biaffine parser over first-subword representations; the `<s>` state stands for the root."""

    def __init__(self, encoder, num_relations, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = BiaffineParser(encoder.cfg.encoder_embed_dim, num_relations)

    def loss(self, rows, lang_id):
        words, mask = _word_states(self, rows, lang_id, with_root=True)
        # the root's own head / label are ignored by the loss; 0 fills them and the padding
        heads = pad_batch([torch.cat([row.heads.new_zeros(1), row.heads]) for row in rows], 0)
        labels = pad_batch([torch.cat([row.labels.new_zeros(1), row.labels]) for row in rows], 0)
        return self.head.loss(words, mask, heads, labels)

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


@torch.no_grad()
def predict(model, rows, lang_id, batch_size=64):
    """model.predict_batch over length-sorted batches (less padding); results in input order."""
    model.eval()
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    by_position = {}
    for start in range(0, len(order), batch_size):
        chosen = order[start : start + batch_size]
        by_position.update(zip(chosen, model.predict_batch([rows[i] for i in chosen], lang_id)))
    return [by_position[i] for i in range(len(rows))]


def predict_classes(classifier, inputs, lang_id, batch_size=64):
    """Class index for each input sequence, all of language `lang_id`."""
    return predict(classifier, [(x, None) for x in inputs], lang_id, batch_size)


def accuracy(predictions, labels):
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
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    optimizer, scheduler = _optimizer_and_schedule(model, config, steps_per_epoch * config.epochs)
    history, best = [], None
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = list(range(len(train)))
        shuffler.shuffle(order)
        total_loss = 0.0
        for start in range(0, len(order), config.batch_size):
            rows = [train[i] for i in order[start : start + config.batch_size]]
            loss = model.loss(rows, lang_id)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total_loss += loss.item() * len(rows)
        score = dev_score(model, dev)
        history.append({"epoch": epoch, "loss": total_loss / len(train), metric: score})
        log(f"epoch {epoch}: train loss {total_loss / len(train):.4f}, English {metric} {score:.2f}")
        if best is None or score > best[0]:
            best = (score, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[1])
    return history


def train_sentence_classifier(classifier, train, dev, lang_id, config):
    """train_head for (input, class) rows, selected on dev accuracy (history key "dev_accuracy")."""
    labels = [y for _, y in dev]
    return train_head(classifier, train, dev, lang_id, config,
                      lambda model, rows: accuracy(predict(model, rows, lang_id), labels), "dev_accuracy")
