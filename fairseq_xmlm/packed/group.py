"""A group of runs on the device: their training sets as one padded tensor (`GroupData`), and the stacked model,
optimiser and random streams that take one update of every run at once (`PackedGroup.step`), each batch shape's
whole update captured once as a CUDA graph and replayed after.

What each run gets is what fairseq-train gives it: its seed's batches (`runs.epoch_batches`); the task's masking
(`masking.Masker`, each run's replacement probabilities and mask symbols), drawn on the device for the whole group
at once; cross-entropy summed over the targets / their number (fairseq's masked_lm and its trainer's
normalisation); fairseq's optimiser and schedule (`optim`). By design the masks and dropout draw from one random
stream per group, so a run's exact draws depend on the group it was packed in, and the model computes in bf16 (a
bf16 copy of the fp32 master weights, as fairseq's --fp16 does in fp16; `precision="fp32"` for none).
"""
import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import Masker, specials_follow_content
from fairseq_xmlm.packed.optim import AdamState, adam_betas, learning_rate
from fairseq_xmlm.packed.stacked import StackedEncoder


def max_targets(sizes, mask_prob):
    """An upper bound (on the host, no GPU sync) of the targets `choose_targets` picks in a batch of these sizes:
    floor(p * n + u) <= floor(p * n) + 1 per sentence, n <= size - 2 maskable tokens (bos and eos never are)."""
    return int(np.sum(np.floor(mask_prob * np.maximum(sizes - 2, 0)) + 1))


class GroupData:
    """Every run's training set on the device as an (N, items + 1, L) padded matrix; the extra item is a blank row
    (bos then padding: nothing to mask, nothing to learn) that fills runs whose batch is short."""

    def __init__(self, runs, device):
        datasets = [run.task.dataset("train") for run in runs]
        if len({len(d) for d in datasets}) != 1:
            raise XmlmError("runs packed together must have training sets of one size")
        width = max(int(d.sizes.max()) for d in datasets)
        pad, bos = runs[0].task.dictionary.pad(), runs[0].task.dictionary.bos()
        tokens = np.full((len(runs), len(datasets[0]) + 1, width), pad, dtype=np.int64)
        tokens[:, -1, 0] = bos
        for slot, d in enumerate(datasets):
            for i in range(len(d)):
                tokens[slot, i, :d.sizes[i]] = d.tokens[d.offsets[i]:d.offsets[i + 1]]
        self.blank = len(datasets[0])
        self.sizes = [np.append(d.sizes, 1) for d in datasets]
        self.tokens = torch.from_numpy(tokens).to(device)
        self.langs = torch.from_numpy(np.stack([np.append(d.langs, 0) for d in datasets])).to(device)
        self.mask_ids = torch.stack([d.mask_ids for d in datasets]).to(device)  # (N, languages)
        maskers = [d.masker for d in datasets]
        for m in maskers[1:]:
            if not (torch.equal(m.special_ids, maskers[0].special_ids)
                    and torch.equal(m.random_candidates, maskers[0].random_candidates)):
                raise XmlmError("runs packed together must share special symbols and random-word candidates")
        knn = next((m.knn_neighbours for m in maskers if m.knn_neighbours is not None), None)
        for m in maskers:
            if m.knn_neighbours is not None and not torch.equal(m.knn_neighbours, knn):
                raise XmlmError("runs packed together must share one knn table")
        probs = torch.tensor([m.probs for m in maskers])
        first = maskers[0]
        # one masker for the group: every replacement any run uses is switched on; rows carry their run's probs
        self.masker = Masker(first.mask_prob, tuple(probs.max(0).values.tolist()), first.special_ids,
                             first.random_candidates, first.random_counts, knn).to(device)
        self.row_probs = probs.to(device)
        self.candidate_set = datasets[0].candidate_set.to(device)
        self.pad = pad
        # runs whose specials follow each row's content after masking (--shift-special-after-masking)
        content = [d.content_specials for d in datasets]
        given = [c for c in content if c is not None]
        self.content_specials = None
        if given:
            shift, specials = given[0]
            self.content_specials = (shift, specials.to(device),
                                     torch.tensor([c is not None for c in content], device=device))

    def plan(self, indices):
        """The host's part of a batch: indices (one array of item ids per run) -> (rows (N, width) of item ids, blank
        where a run's batch is short; the longest sentence; how many targets a run can have, at most; real tokens).
        The target bound is rounded up to a multiple of 64, so that groups mixing seeds meet few batch shapes (each
        shape is one CUDA graph); the extra positions are non-targets, which the loss ignores."""
        n, width = len(indices), max(len(i) for i in indices)
        rows = np.full((n, width), self.blank, dtype=np.int64)
        for slot, ids in enumerate(indices):
            rows[slot, :len(ids)] = ids
        sizes = np.stack([self.sizes[slot][rows[slot]] for slot in range(n)])
        length = int(sizes.max())
        budget = min(-(-max(max_targets(s, self.masker.mask_prob) for s in sizes) // 64) * 64, width * length)
        return rows, length, budget, int(sizes.sum())

    def upload(self, rows, into=None):
        """`plan`'s rows on the device, in a new tensor or copied `into` one (a CUDA graph's input)."""
        rows = torch.from_numpy(rows)
        if self.tokens.is_cuda:  # pinned: the copy queues behind the GPU's work instead of waiting for it
            rows = rows.pin_memory()
        if into is None:
            return rows.to(self.tokens.device, non_blocking=True)
        return into.copy_(rows, non_blocking=True)

    def on_device(self, rows, length, budget, generator):
        """The device's part: `plan`'s rows as a tensor -> (inputs (N, width, length), langs, positions (N, budget),
        target ids (N, budget), -100 where a position is no target). No host sync, so a CUDA graph can hold it."""
        n, width = rows.shape
        slots = torch.arange(n, device=rows.device).view(-1, 1)
        tokens = self.tokens[slots, rows, :length].view(n * width, length)
        langs = self.langs[slots, rows]
        inputs, targets = self.masker(tokens, self.mask_ids[slots, langs].view(-1),
                                      self.candidate_set[langs].view(-1), generator, self.pad,
                                      self.row_probs.unsqueeze(1).expand(-1, width, -1).reshape(n * width, -1))
        if self.content_specials is not None:
            shift, specials, runs_with = self.content_specials
            rows_with = runs_with.view(-1, 1).expand(n, width).reshape(-1, 1)
            inputs = torch.where(rows_with, specials_follow_content(inputs, shift, specials), inputs)
        is_target = targets.ne(self.pad).view(n, -1)
        # targets first, in position order (stable sort), cut at the host-side bound
        positions = torch.sort((~is_target).to(torch.uint8), dim=1, stable=True).indices[:, :budget]
        valid = is_target.gather(1, positions)
        target_ids = torch.where(valid, targets.view(n, -1).gather(1, positions), -100)
        return inputs.view(n, width, length), langs, positions, target_ids

    def batch(self, indices, generator):
        """indices: one array of item ids per run -> (inputs, langs, positions, target ids, ntokens)."""
        rows, length, budget, ntokens = self.plan(indices)
        return (*self.on_device(self.upload(rows), length, budget, generator), ntokens)


def check_cuda_graphs(cuda_graphs, device):
    if cuda_graphs and device.type != "cuda":
        raise XmlmError("CUDA graphs need a GPU: drop --cuda-graphs")


def summed_losses(logits, target_ids):
    """Each run's summed cross-entropy of its targets, (N,), in fp32 from the logits (N, M, V). Compiled, the cast,
    the log-softmax and the pick are one pass over the logits and backward one more, where eager passes write fp32
    copies between them."""
    return F.cross_entropy(logits.float().flatten(0, 1), target_ids.flatten(), ignore_index=-100,
                           reduction="none").view(logits.size(0), -1).sum(1)


# Batch shapes a group captures as CUDA graphs at most; beyond that, new shapes run uncaptured. A group of one seed
# meets at most one shape per batch of its epoch: 48 for the 69 batches of Dufter's training set (2026-11-27, one
# H200, commit 5e871b2).
MAX_GRAPHS = 256


class PackedGroup:
    """The runs of one `plan.group_key` as one stacked model with its optimiser and random streams."""

    def __init__(self, runs, device, precision="bf16", compile=False, cuda_graphs=False):
        check_cuda_graphs(cuda_graphs, device)
        self.runs, self.device = runs, device
        first = runs[0].cfg
        torch.manual_seed(first.common.seed)  # dropout draws of the group
        # On a GPU the dropout draws come from a generator state of the group's own, which `step` makes the default
        # generator's: groups beside each other on streams (`loop.train_groups`) then neither share one nor race for it
        # (each replay of a CUDA graph first writes its generator's offset to the device, on its own stream).
        self.cuda_generator = None if device.type != "cuda" else torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()]
        self.dropout_rng = self.cuda_generator.clone_state() if self.cuda_generator is not None else None
        self.generator = torch.Generator(device=device).manual_seed(first.common.seed)  # masking draws
        self.stacked = StackedEncoder([run.model for run in runs], device,
                                      torch.bfloat16 if precision == "bf16" else torch.float32, compile,
                                      [bool(run.cfg.task.attend_padding) for run in runs],
                                      [run.micro_batch for run in runs])
        self.data = GroupData(runs, device)
        self.adam = AdamState(self.stacked.flat, self.stacked.leaf_columns, adam_betas(first.optimizer),
                              first.optimizer.adam_eps, first.optimizer.weight_decay,
                              torch_style=first.optimizer._name == "xmlm_adamw",
                              clip_norm=first.optimization.clip_norm, compute=self.stacked.compute, compile=compile)
        self.summed_losses = torch.compile(summed_losses) if compile else summed_losses
        self.updates = 0
        # plain values: an omegaconf lookup costs tens of microseconds, and the step should not wait on the host
        self.dropouts = (first.model.dropout, first.model.attention_dropout, first.model.activation_dropout)
        self.peak_lr = first.optimization.lr[0]
        schedule = first.lr_scheduler
        self.schedule = argparse.Namespace(warmup_updates=schedule.warmup_updates,
                                           total_num_update=schedule.total_num_update,
                                           end_learning_rate=schedule.end_learning_rate, power=schedule.power)
        self.validate_every = [run.cfg.dataset.validate_interval_updates for run in runs]
        # batch shape (width, length, target bound) -> (graph, its rows input, its outputs); None: no graphs
        self.graphs = {} if cuda_graphs else None
        self.graph_pool = torch.cuda.graph_pool_handle() if cuda_graphs else None
        self.capture_seconds = 0.0
        # called before a capture: the process's other threads must not use the GPU while a graph is captured
        self.before_capture = None

    def step(self, indices):
        """One update of every run on its batch `indices[slot]`; returns (summed losses (N,), target counts (N,),
        the batch (inputs, langs, positions, target ids, real tokens)) without waiting for the GPU. With CUDA
        graphs these tensors are the graph's own, valid until the next step."""
        if self.dropout_rng is not None:
            self.cuda_generator.graphsafe_set_state(self.dropout_rng)
        rows, length, budget, ntokens = self.data.plan(indices)
        self.updates += 1
        self.adam.schedule(learning_rate(self.updates, self.schedule, self.peak_lr))
        key = (rows.shape[1], length, budget)
        if self.graphs is not None and key in self.graphs:
            graph, graph_rows, outputs = self.graphs[key]
            self.data.upload(rows, into=graph_rows)
            graph.replay()
        else:
            device_rows = self.data.upload(rows)
            outputs = self._update(device_rows, length, budget)
            if self.graphs is not None and len(self.graphs) < MAX_GRAPHS:
                self.graphs[key] = self._capture(device_rows, length, budget)
        losses, counts, batch = outputs
        return losses, counts, (*batch, ntokens)

    def _update(self, rows, length, budget):
        """The device's whole update: masking, forward, loss, backward and the optimizer step."""
        batch = self.data.on_device(rows, length, budget, self.generator)
        inputs, langs, positions, target_ids = batch
        logits = self.stacked.masked_logits(inputs, langs, positions, *self.dropouts)
        losses = self.summed_losses(logits, target_ids)
        counts = target_ids.ne(-100).sum(1)
        self.adam.apply(self.stacked.gradients((losses / counts.clamp(min=1)).sum()))
        return losses.detach(), counts, batch

    def _capture(self, rows, length, budget):
        """A CUDA graph of `_update` for this batch shape, captured after one update of that shape ran as is (which
        compiled whatever it needed): its later batches replay the step's ~800 kernels in one launch, so a group
        of small models no longer waits on Python. `rows`, that update's rows on the device (allocated outside the
        graph), becomes the graph's input. The graphs share one memory pool; the outputs of one are read before
        another replays (stream order), which is all that sharing needs.
        A group stepping on a stream of its own (`loop.train_groups`) captures on that stream. torch keeps a cuBLAS
        workspace per (handle, stream) and a graph's matrix products keep the one of the stream they were captured
        on: captured on torch's one default capture stream, two groups' graphs replayed at once on their streams
        wrote into the same workspace (NaN losses in bf16 on an H200, 2026-11-27, commit de12ba3; each group
        captures on its own stream since 57efe4a)."""
        if self.before_capture is not None:
            self.before_capture()
        started = time.perf_counter()
        graph = torch.cuda.CUDAGraph()
        graph.register_generator_state(self.generator)  # the masking draws; dropout's default generator is known
        stream = torch.cuda.current_stream(self.device)
        own = None if stream == torch.cuda.default_stream(self.device) else stream  # none: torch's capture stream
        with torch.cuda.graph(graph, pool=self.graph_pool, stream=own):
            outputs = self._update(rows, length, budget)
        self.capture_seconds += time.perf_counter() - started
        return graph, rows, outputs

    def state_dict(self):
        """Everything a resumed group needs to go on exactly as if never stopped: weights, Adam, random streams."""
        state = {"flat": self.stacked.flat, **self.adam.state_dict(), "updates": self.updates,
                 "masking_rng": self.generator.get_state(), "dropout_rng": torch.get_rng_state()}
        if self.dropout_rng is not None:
            state["dropout_rng_cuda"] = self.dropout_rng.get_state()
        return state

    def load_state_dict(self, state):
        self.stacked.flat.copy_(state["flat"])
        self.stacked.refresh()
        self.adam.load_state_dict(state)
        self.updates = state["updates"]
        self.generator.set_state(state["masking_rng"])
        torch.set_rng_state(state["dropout_rng"])
        if self.dropout_rng is not None and "dropout_rng_cuda" in state:  # absent when suspended on the CPU
            self.dropout_rng.set_state(state["dropout_rng_cuda"])

    def validations_due(self, final=False):
        """The slots of the runs whose --validate-interval-updates falls on this update (at the end: whose does
        not, so that every such run is validated at its last update)."""
        return [slot for slot, every in enumerate(self.validate_every)
                if every and (self.updates % every == 0) != final]
