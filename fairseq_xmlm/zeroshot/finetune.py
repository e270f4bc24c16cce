"""Fine-tune a pretrained `partially_shared_roberta` on English and evaluate zero-shot in another language.

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

import torch
import torch.nn.functional as F
from torch import nn

from fairseq_xmlm.errors import XmlmError

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


class SentenceClassifier(nn.Module):
    """Representation of the first token (`<s>`) of the last layer -> dropout -> linear (-> softmax in the loss)."""

    def __init__(self, encoder, num_classes, dropout=0.1):
        super().__init__()
        self.encoder = encoder
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(encoder.cfg.encoder_embed_dim, num_classes)

    def forward(self, src_tokens, lang_ids):
        first_token = self.encoder.encode_layers(src_tokens, lang_ids)[-1][:, 0]
        return self.head(self.dropout(first_token))


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
def predict_classes(classifier, inputs, lang_id, pad, batch_size=64):
    """Class index for each input sequence, all of language `lang_id`."""
    classifier.eval()
    # length-sorted batches waste less padding; results are put back in input order
    order = sorted(range(len(inputs)), key=lambda i: len(inputs[i]))
    by_position = {}
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        tokens = pad_batch([inputs[i] for i in rows], pad)
        logits = classifier(tokens, torch.full((len(rows),), lang_id, dtype=torch.long))
        by_position.update(zip(rows, logits.argmax(-1).tolist()))
    return [by_position[i] for i in range(len(inputs))]


def accuracy(predictions, labels):
    if not labels:
        raise XmlmError("accuracy of an empty evaluation set")
    return 100.0 * sum(p == y for p, y in zip(predictions, labels)) / len(labels)


def train_sentence_classifier(classifier, train, dev, lang_id, pad, config):
    """Fine-tune on train = [(input ids, label)] of language lang_id; keep the epoch with the best dev accuracy.

    Returns the per-epoch history [{"epoch", "loss", "dev_accuracy"}]; the classifier ends in the best state.
    """
    if not train or not dev:
        raise XmlmError("fine-tuning needs non-empty training and dev sets")
    torch.manual_seed(config.seed)
    shuffler = random.Random(config.seed)
    steps_per_epoch = math.ceil(len(train) / config.batch_size)
    optimizer, scheduler = _optimizer_and_schedule(classifier, config, steps_per_epoch * config.epochs)
    dev_inputs, dev_labels = [x for x, _ in dev], [y for _, y in dev]
    history, best = [], None
    for epoch in range(1, config.epochs + 1):
        classifier.train()
        order = list(range(len(train)))
        shuffler.shuffle(order)
        total_loss = 0.0
        for start in range(0, len(order), config.batch_size):
            rows = [train[i] for i in order[start : start + config.batch_size]]
            tokens = pad_batch([x for x, _ in rows], pad)
            labels = torch.tensor([y for _, y in rows])
            loss = F.cross_entropy(classifier(tokens, torch.full((len(rows),), lang_id, dtype=torch.long)), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            total_loss += loss.item() * len(rows)
        dev_accuracy = accuracy(predict_classes(classifier, dev_inputs, lang_id, pad), dev_labels)
        history.append({"epoch": epoch, "loss": total_loss / len(train), "dev_accuracy": dev_accuracy})
        log(f"epoch {epoch}: train loss {total_loss / len(train):.4f}, English dev accuracy {dev_accuracy:.2f}")
        if best is None or dev_accuracy > best[0]:
            best = (dev_accuracy, copy.deepcopy(classifier.state_dict()))
    classifier.load_state_dict(best[1])
    return history
