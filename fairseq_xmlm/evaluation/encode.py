"""A model's states, batch by batch, reduced to what the metrics need (`multilinguality.py`).

- `length_batches` groups inputs of similar length into batches of at most `max_tokens` padded tokens,
  `pad_batch` pads one, `input_positions` restores the input order afterwards;
- `PairedEncoder` encodes the inputs of one or two languages and returns mean-pooled vectors (and alignment counts)
  per layer;
- `ordered_map` runs a function over batches in worker threads, `EvalMode` puts a model in inference mode (and
  picks the number of those workers) and restores its training mode afterwards.
"""
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.multilinguality import compact_tokens, gold_alignment, mean_pool, mutual_argmax_counts


ATTENDED_BATCH = 256  # the paper's code's evaluation batch (evaluate.py's --eval_batch_size default)


def ordered_map(function, items, workers):
    """[function(item) for item in items], spread over `workers` threads, each call under inference_mode (grad
    mode is per thread).

    A small model's batches go fastest on CPU through single-threaded workers, one batch each (`EvalMode` sets
    torch to one thread): torch's own threads split every small op and wait for each other after it, and when
    another process shares the cores, one descheduled thread stalls them all (BERT-small on 2 busy cores: 2.5x
    the CPU time of one thread). torch releases the GIL inside its ops, so the workers truly run side by side.
    """
    def call(item):
        with torch.inference_mode():
            return function(item)

    if workers <= 1:
        return [call(item) for item in items]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(call, items))


def pad_batch(sequences, pad):
    """List of 1-D tensors -> (B, T) of their dtype, right-padded with `pad`."""
    return torch.nn.utils.rnn.pad_sequence(sequences, batch_first=True, padding_value=pad)


def length_batches(lengths, max_tokens):
    """Indices grouped into batches of similar length, each at most `max_tokens` padded tokens (>= 1 item)."""
    order = sorted(range(len(lengths)), key=lambda k: lengths[k])
    batches, current, longest = [], [], 0
    for k in order:
        longest_if_added = max(longest, lengths[k])
        if current and longest_if_added * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[k]
        current.append(k)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches


def input_positions(order):
    """Rows come out of length_batches grouped by length: the index of each input's row, to restore input order."""
    position = torch.empty(len(order), dtype=torch.long)
    position[torch.tensor(order)] = torch.arange(len(order))
    return position


def special_ids(task):
    """A task's ids that are not words (`task.special_ids`) as a sorted 1-D LongTensor."""
    return torch.tensor(sorted(task.special_ids), dtype=torch.long)


def model_device(model):
    return next(model.parameters()).device


class EvalMode:
    """inference_mode + eval() for the duration, restoring the previous training flag (the hook runs mid-training).

    inference_mode rather than no_grad: no version counters or views tracked, measurably faster on the CPU.
    On CPU torch runs single-threaded meanwhile and `with` gives the number of threads it had, to use as
    `ordered_map` workers (restored on exit); on GPU one worker.
    """

    def __init__(self, model, device):
        self.model, self.device, self.inference = model, device, torch.inference_mode()

    def __enter__(self):
        self.was_training = self.model.training
        self.model.eval()
        self.inference.__enter__()
        self.threads = torch.get_num_threads()
        if self.device.type != "cpu":
            return 1
        torch.set_num_threads(1)
        return self.threads

    def __exit__(self, *exc):
        torch.set_num_threads(self.threads)
        self.inference.__exit__(*exc)
        self.model.train(self.was_training)


@dataclass
class PairedEncoder:
    """Encodes paired inputs of two languages and reduces them, batch by batch, to what the metrics need."""

    model: torch.nn.Module
    special_ids: torch.Tensor  # 1-D LongTensor of ids that are not words (bos/eos/pad/unk/mask of both languages)
    pad: int
    layers: tuple
    device: torch.device
    max_tokens: int = 8192
    workers: int = 1  # threads encoding batches side by side (`ordered_map`)
    # As the paper's code evaluates (github pdufter/minimult, evaluate.py) and `--attend-padding` trains: batches of
    # ATTENDED_BATCH inputs in their order, no attention mask, so each state sees its batch's padding
    attend_padding: bool = False

    @classmethod
    def for_task(cls, model, task, layers, device, max_tokens=8192, workers=1, attend_padding=None):
        """An encoder of a task's inputs: its special ids are not words, its pad pads; padding attended when the
        task trains so (`--attend-padding`), or as `attend_padding` says (None: as the task trains)."""
        if attend_padding is None:
            attend_padding = bool(getattr(getattr(task, "cfg", None), "attend_padding", False))
        return cls(model, special_ids(task), task.dictionary.pad(), tuple(layers), device, max_tokens, workers,
                   attend_padding)

    def _batches(self, lengths):
        if self.attend_padding:
            return [list(range(at, min(at + ATTENDED_BATCH, len(lengths))))
                    for at in range(0, len(lengths), ATTENDED_BATCH)]
        return length_batches(lengths, self.max_tokens)

    def _states(self, inputs, lang):
        tokens = pad_batch(inputs, self.pad).to(self.device)
        lang_ids = torch.full((len(inputs),), lang, dtype=torch.long, device=self.device)
        depth = len(self.model.layers)
        if max(self.layers) > depth:
            raise XmlmError(f"layer {max(self.layers)} does not exist: the model has layers 0..{depth}")
        attended = {"has_padding": False} if self.attend_padding else {}  # False drops the attention mask
        states = self.model.encode_layers(tokens, lang_ids, last_layer=max(self.layers), **attended)
        keep = ~torch.isin(tokens, self.special_ids.to(self.device))
        return states, keep

    def _paired_batch(self, inputs_a, inputs_b, langs, gold_reversed):
        """{layer: (pooled A, pooled B)} and {layer: alignment counts} (None when gold_reversed is) of one batch."""
        states_a, keep_a = self._states(inputs_a, langs[0])
        states_b, keep_b = self._states(inputs_b, langs[1])
        pooled, counts = {}, ({} if gold_reversed is not None else None)
        for layer in self.layers:
            pooled[layer] = (mean_pool(states_a[layer], keep_a).float().cpu(),
                             mean_pool(states_b[layer], keep_b).float().cpu())
            if gold_reversed is not None:
                words_a, len_a = compact_tokens(states_a[layer], keep_a)
                words_b, len_b = compact_tokens(states_b[layer], keep_b)
                gold = gold_alignment(len_a, reversed_order=gold_reversed)
                counts[layer] = mutual_argmax_counts(words_a, words_b, len_a, len_b, gold)
        return pooled, counts

    def pooled_and_aligned(self, inputs_a, inputs_b, langs=(0, 1), gold_reversed=None):
        """Mean-pooled vectors {layer: (A (m,D), B (m,D))} and, unless gold_reversed is None, alignment counts
        {layer: (correct, predicted, gold)} against the identity (or reversed) alignment of the word pieces."""
        batches = self._batches([max(len(a), len(b)) for a, b in zip(inputs_a, inputs_b)])
        per_batch = ordered_map(lambda batch: self._paired_batch(
            [inputs_a[k] for k in batch], [inputs_b[k] for k in batch], langs, gold_reversed), batches, self.workers)
        position = input_positions([k for batch in batches for k in batch])
        stacked = {layer: tuple(torch.cat([pooled[layer][side] for pooled, _ in per_batch])[position]
                                for side in (0, 1)) for layer in self.layers}
        if gold_reversed is None:
            return stacked, None
        return stacked, {layer: tuple(sum(counts[layer][k] for _, counts in per_batch) for k in range(3))
                         for layer in self.layers}

    def pooled(self, inputs, lang):
        """Mean-pooled vectors {layer: (m, D)} of the inputs of ONE language (sets of different sizes)."""
        def pool_batch(batch):
            states, keep = self._states([inputs[k] for k in batch], lang)
            return {layer: mean_pool(states[layer], keep).float().cpu() for layer in self.layers}

        batches = self._batches([len(x) for x in inputs])
        per_batch = ordered_map(pool_batch, batches, self.workers)
        position = input_positions([k for batch in batches for k in batch])
        return {layer: torch.cat([pooled[layer] for pooled in per_batch])[position] for layer in self.layers}
