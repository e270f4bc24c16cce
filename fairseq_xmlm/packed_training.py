"""Train many Fake-English fairseq-train runs at once on one GPU, as stacked models (`examples/dufter --gpu-pack`).

    python -m fairseq_xmlm.packed_training COMMANDS_FILE [--max-group 40] [--precision bf16|fp32] [--time-limit S]
        [--compile] [--cuda-graphs] [--gpu-lock PATH] [--warm-up-lock PATH] [--lockstep] [--tf32]

COMMANDS_FILE holds one fairseq-train command line per line (shell-quoted, `fairseq-train` or `python -m
fairseq_cli.train` first), each with `--save-dir` and `--log-file`. Every command is parsed by fairseq's own parser
and its task, model (initialised with the command's seed, exactly as fairseq-train does) and training set are built
by fairseq; runs with the same model shape, optimiser settings and schedule (`group_key`), and mostly of one seed
(`grouped`), are then trained together as one `StackedEncoder`, up to --max-group runs at a time.
`train_side_by_side` runs the groups in processes, several at once on the GPU; with --cuda-graphs (its default on a
GPU) each batch shape's whole update is captured once and replayed, --gpu-lock makes the processes take turns on
the GPU, which such a group keeps busy by itself, --warm-up-lock makes the processes of one model shape warm up
(compile) one after another, so that all but the first find the layers in inductor's cache, and --lockstep trains
a process's groups at once, each on a CUDA stream of its own (a BERT-base group beside small ones, `--pack-lockstep`
of the recipe). What each run gets is what fairseq-train would give it:

- batches: the task's batch iterator for that epoch and seed (`ordered_batches`, fairseq's own shuffling);
- masking: the task's masker (`masking.mask_batch`, each run's replacement probabilities and mask symbols), drawn
  on the GPU for the whole group at once;
- loss: cross-entropy summed over the targets / their number (fairseq's masked_lm + trainer normalisation);
- optimiser: fairseq's `adam` (or torch AdamW for `--optimizer xmlm_adamw`) with decoupled weight decay, the
  `polynomial_decay` schedule exactly as fairseq's trainer steps it (update k uses the rate of update k-1, so the
  first update has rate 0), `--clip-norm` per run;
- logs: fairseq's json records (`train` per epoch, `valid` at `--validate-interval-updates` through the task's
  `valid_step` / `--eval-multilinguality` hook, `--max-valid-steps` batches, computed beside the training by
  `BackgroundValidation` and written once done), written to the run's `--log-file`;
- checkpoint: `checkpoint_last.pt` in the run's `--save-dir`, saved by fairseq's Trainer, read by every tool.

Differences, by design: the model computes in bf16 (a bf16 copy of the fp32 master weights, as fairseq's --fp16
does in fp16; `--precision fp32` for none); the masks and dropout draw from one random stream per group, so a
run's exact draws depend on the group it was packed in; validation runs only at --validate-interval-updates and
at the end, not after every epoch, in fp32 (--tf32: its matrix products in TF32 on a GPU, as `xmlm-eval-mult
--tf32`; the `packed` record says which); the optimiser state is not saved (a packed checkpoint is a finished
model, not a resume point).
`tests/test_packed_training.py` checks a packed update against fairseq's own Trainer on the same batches.
A group is saved when it finishes; rerunning the same commands skips runs whose checkpoint and log exist. SIGTERM,
Ctrl-C or --time-limit suspend the group at the next step: it saves its whole state (`resume_path`) and exits 75,
and rerunning the same commands resumes it to the result an uninterrupted run gives.
"""
import argparse
import errno
import fcntl
import json
import math
import multiprocessing
import os
import pickle
import shlex
import signal
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import nullcontext
from itertools import islice

import numpy as np
import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError, cli_errors
from fairseq_xmlm.gpu_pack import read_commands
from fairseq_xmlm.masking import Masker
from fairseq_xmlm.optim.xmlm_adamw import parse_betas
from fairseq_xmlm.precision import allow_tf32, fp32_products
from fairseq_xmlm.stacked_encoder import StackedEncoder

SUSPENDED = 75  # exit status of a process that saved its groups' state to resume (EX_TEMPFAIL)
SUPPORTED = {"task": ("fake_english",), "criterion": ("masked_lm", "xmlm_masked_lm"),
             "optimizer": ("adam", "xmlm_adamw"), "lr_scheduler": ("polynomial_decay",)}


class Run:
    """One fairseq-train command: its parsed config, and once `build()` ran, the task, the model initialised with
    the command's seed, the criterion and the training set, as fairseq-train builds them."""

    def __init__(self, argv, cfg):
        self.argv, self.cfg = list(argv), cfg
        self.task = self.model = self.criterion = None
        self.updates_per_epoch = self.total_updates = None

    @property
    def log_path(self):
        return self.cfg.common.log_file

    @property
    def checkpoint_path(self):
        return os.path.join(self.cfg.checkpoint.save_dir, "checkpoint_last.pt")

    def done(self):
        return os.path.exists(self.checkpoint_path) and os.path.exists(self.log_path)

    def build(self):
        from fairseq import tasks, utils

        cfg = self.cfg  # parse_run imported the user dir (parse_args_and_arch does) and checked the model config
        utils.set_torch_seed(cfg.common.seed)
        self.task = tasks.setup_task(cfg.task)
        self.model = self.task.build_model(cfg.model)
        self.criterion = self.task.build_criterion(cfg.criterion)
        self.task.load_dataset("train")
        self.updates_per_epoch = len(epoch_batches(self, 1))
        total = self.updates_per_epoch * cfg.optimization.max_epoch if cfg.optimization.max_epoch else math.inf
        self.total_updates = min(total, cfg.optimization.max_update or math.inf)
        if self.total_updates == math.inf:
            raise XmlmError("packed training needs --max-epoch or --max-update")
        return self


def strip_program(argv):
    """Drop `fairseq-train` / `python -m fairseq_cli.train` from the front of a command line."""
    for i, word in enumerate(argv):
        if word == "fairseq_cli.train" or os.path.basename(word) == "fairseq-train":
            return argv[i + 1:]
    return argv


def parse_run(argv):
    """fairseq's own parser and config conversion for one fairseq-train command line (which also imports its
    --user-dir); unsupported settings fail."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()

    def refuse(message):  # argparse would print its whole usage text and exit
        raise XmlmError(f"packed command {shlex.join(argv)[:80]}...: {message}")

    parser.error = refuse
    args = options.parse_args_and_arch(parser, input_args=strip_program(argv))
    with warnings.catch_warnings():  # hydra's deprecation notices, five per command
        warnings.simplefilter("ignore", UserWarning)
        cfg = convert_namespace_to_omegaconf(args)
    for section, names in SUPPORTED.items():
        chosen = getattr(cfg, section)._name
        if chosen not in names:
            raise XmlmError(f"packed training supports --{section.replace('_', '-')} {'|'.join(names)}, "
                            f"got {chosen}")
    if not cfg.common.log_file or not cfg.checkpoint.save_dir:
        raise XmlmError("each packed command needs --save-dir and --log-file")
    if cfg.optimization.update_freq != [1] or not cfg.dataset.batch_size or cfg.dataset.max_tokens:
        raise XmlmError("packed training needs --batch-size (no --max-tokens, no --update-freq)")
    if cfg.model.sep_emb or cfg.model.sep_layers:
        raise XmlmError("packed training supports shared embeddings and layers only (no --sep-emb / --sep-layers)")
    return Run(argv, cfg)


PARSES_PER_WORKER = 16  # a fresh process first imports torch and fairseq: about as long as 16 parses take


def parse_runs(commands, workers=None):
    """`parse_run` of every command, in order. fairseq's parser and hydra's composition take about 0.3 s a command
    on the GPU machine: the 5-seed sweep's 80 took about 25 s before its first training process started
    (docs/benchmarks.md, twenty-seventh session). So with many commands they are parsed in a pool of fresh
    processes (`workers`, default: one per PARSES_PER_WORKER commands, at most half the cores); an error is raised
    here as in the pool."""
    if workers is None:
        workers = min(len(commands) // PARSES_PER_WORKER, (os.cpu_count() or 1) // 2)
    if workers < 2:
        return [parse_run(argv) for argv in commands]
    # spawned, not forked: the caller may have threads (the recipe's) and the GPU open
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(parse_run, commands, chunksize=-(-len(commands) // workers)))


def epoch_batches(run, epoch):
    """fairseq's batches for `epoch` as arrays of item ids, in the order fairseq-train would feed them (the dataset's
    batches are of slots that it maps to items per epoch: `MaskedLanguageDataset.item_of_slot`)."""
    cfg, dataset = run.cfg, run.task.dataset("train")
    iterator = run.task.get_batch_iterator(
        dataset=dataset, max_tokens=None, max_sentences=cfg.dataset.batch_size,
        max_positions=run.task.max_positions(), required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, epoch=epoch, num_workers=0)
    dataset.set_epoch(epoch)
    items = dataset.item_of_slot()
    return [np.asarray(b) if items is None else items[np.asarray(b)]
            for b in iterator.ordered_batches(epoch, False, True)]


def group_key(run):
    """Runs with equal keys may step together: one model shape (with or without lang-pos), one schedule, one
    optimiser, one training set. Seeds may differ: each run keeps its own seed's initialisation and batches, and a
    step pads to the longest of its runs' batches, which is why `grouped` keeps seeds apart."""
    c, t, m = run.cfg, run.cfg.task, run.cfg.model
    return (m.encoder_layers, m.encoder_embed_dim, m.encoder_ffn_embed_dim, m.encoder_attention_heads,
            m.activation_fn, m.dropout, m.attention_dropout, m.activation_dropout, t.no_parallel, t.data,
            t.mask_prob, t.tokens_per_sample, c.optimizer._name, adam_betas(c.optimizer), c.optimizer.adam_eps,
            c.optimizer.weight_decay, tuple(c.optimization.lr), c.optimization.clip_norm, c.optimization.max_epoch,
            c.optimization.max_update, c.lr_scheduler.warmup_updates, c.lr_scheduler.total_num_update,
            c.lr_scheduler.end_learning_rate, c.lr_scheduler.power, c.dataset.batch_size)


def adam_betas(optimizer_cfg):
    betas = optimizer_cfg.adam_betas
    return parse_betas(betas) if isinstance(betas, str) else tuple(float(b) for b in betas)  # fairseq: a list


def learning_rate(update, sched, peak):
    """The rate fairseq's trainer uses for update `update` (1-based): polynomial_decay at update - 1."""
    done = update - 1
    if sched.warmup_updates > 0 and done <= sched.warmup_updates:
        return peak * done / sched.warmup_updates
    if done >= sched.total_num_update:
        return sched.end_learning_rate
    remaining = 1 - (done - sched.warmup_updates) / (sched.total_num_update - sched.warmup_updates)
    return (peak - sched.end_learning_rate) * remaining ** sched.power + sched.end_learning_rate


def clip_scales(grads, clip_norm):
    """(N, 1) factors that clip each run's gradients (a list of (N, ...) tensors) to norm `clip_norm`, as fairseq's
    --clip-norm does for one run."""
    norms = torch.stack([g.float().reshape(g.size(0), -1).square().sum(1) for g in grads]).sum(0).sqrt()
    return (clip_norm / (norms + 1e-6)).clamp(max=1.0).unsqueeze(1)


def adam_update(flat, grad, exp_avg, exp_avg_sq, compute, hyper, beta1, beta2, weight_decay, scale):
    """One AdamW step of every run, in place, in one pass over some columns of the (N, P) buffers: the moments,
    decoupled weight decay, the step and the low-precision copy `compute` (None in fp32), from the gradients `grad`
    (N, columns, any dtype) times `scale` (None, or `clip_scales`).
    hyper = (lr, eps, 1 - beta1^t, sqrt(1 - beta2^t)) as a tensor, so that compiled it serves every step."""
    g = grad.float()
    if scale is not None:
        g = g * scale
    lr, eps, bias_correction1, bias_correction2_sqrt = hyper.unbind()
    exp_avg.lerp_(g, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    flat.mul_(1 - lr * weight_decay)
    flat.sub_(lr / bias_correction1 * exp_avg / (exp_avg_sq.sqrt() / bias_correction2_sqrt + eps))
    if compute is not None:
        compute.copy_(flat)


class AdamState:
    """Adam over the flat (N, P) master weights `flat`, whose gradients come as one tensor for each (start, end) of
    `columns` (`StackedEncoder.gradients`): torch's AdamW formula, one `adam_update` a segment, compiled with
    `compile` into one elementwise kernel each (after a reduction when clipping). Where torch's fused AdamW needs the
    gradients widened to fp32 first and the bf16 copy refreshed after, this reads and writes each buffer once. For
    fairseq's `adam`, which adds eps before the bias correction, that is the same update with eps / sqrt(1 -
    beta2^t), given at each step; `xmlm_adamw` is torch's own."""

    def __init__(self, flat, columns, betas, eps, weight_decay, torch_style, clip_norm=0.0, compute=None,
                 compile=False):
        self.flat, self.compute = flat, (None if compute is flat else compute)
        self.exp_avg, self.exp_avg_sq = torch.zeros_like(flat), torch.zeros_like(flat)
        # each segment's columns of flat, exp_avg, exp_avg_sq and compute, as views made once
        self.segments = [tuple(None if buffer is None else buffer[:, start:end]
                               for buffer in (flat, self.exp_avg, self.exp_avg_sq, self.compute))
                         for start, end in columns]
        self.betas, self.eps, self.weight_decay, self.torch_style = betas, eps, weight_decay, torch_style
        self.clip_norm = clip_norm
        self.update = torch.compile(adam_update) if compile else adam_update
        self.clip_scales = torch.compile(clip_scales) if compile else clip_scales
        self.step_count = 0
        # this step's (lr, eps, 1 - beta1^t, sqrt(1 - beta2^t)), in one place on the device: a CUDA graph of the
        # step reads it there at every replay
        self.hyper = torch.zeros(4, device=flat.device)

    def schedule(self, lr):
        """Count the step and queue its rate and bias corrections for `apply`."""
        self.step_count += 1
        bias_correction2_sqrt = math.sqrt(1 - self.betas[1] ** self.step_count)
        eps = self.eps if self.torch_style else self.eps / bias_correction2_sqrt
        hyper = torch.tensor([lr, eps, 1 - self.betas[0] ** self.step_count, bias_correction2_sqrt])
        if self.flat.is_cuda:  # pinned: the copy queues behind the GPU's work instead of waiting for it
            hyper = hyper.pin_memory()
        self.hyper.copy_(hyper, non_blocking=True)

    def apply(self, grads):
        """The update with the last `schedule`d values and `grads`, one tensor a segment."""
        scale = self.clip_scales(grads, self.clip_norm) if self.clip_norm > 0 else None
        for (flat, exp_avg, exp_avg_sq, compute), grad in zip(self.segments, grads, strict=True):
            # every gradient as (N, columns): one compiled version serves weights of any shape
            self.update(flat, grad.reshape(grad.size(0), -1), exp_avg, exp_avg_sq, compute, self.hyper, *self.betas,
                        self.weight_decay, scale)

    def step(self, lr, grads):
        self.schedule(lr)
        self.apply(grads)

    def state_dict(self):
        return {"exp_avg": self.exp_avg, "exp_avg_sq": self.exp_avg_sq, "adam_steps": self.step_count}

    def load_state_dict(self, state):
        self.exp_avg.copy_(state["exp_avg"])
        self.exp_avg_sq.copy_(state["exp_avg_sq"])
        self.step_count = state["adam_steps"]


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


def record_line(tag, record):
    """A log line in fairseq's json format, as `evaluation.figures.read_fairseq_log` and people read them."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    values = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in record.items()}
    return f"{stamp} | INFO | {tag} | {json.dumps(values)}\n"


def validate(run, state_dict, epoch, updates, device):
    """fairseq's validation of one run: the task's valid_step over --max-valid-steps batches (and its
    --eval-multilinguality hook), reduced by the task's metrics into a `valid` record."""
    from fairseq import metrics, utils

    model, task, cfg = run.model, run.task, run.cfg
    model.load_state_dict(state_dict)
    model.to(device).eval()
    if "valid" not in task.datasets:
        task.load_dataset("valid")
    task.begin_valid_epoch(epoch, model)
    iterator = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_tokens=None,
        max_sentences=cfg.dataset.batch_size_valid or cfg.dataset.batch_size, max_positions=task.max_positions(),
        required_batch_size_multiple=cfg.dataset.required_batch_size_multiple, seed=cfg.common.seed,
        num_workers=0).next_epoch_itr(shuffle=False)
    outputs = []
    with torch.no_grad():
        for sample in islice(iterator, cfg.dataset.max_valid_steps or None):
            outputs.append(task.valid_step(utils.move_to_cuda(sample, device) if device.type == "cuda" else sample,
                                           model, run.criterion)[2])
    with metrics.aggregate(new_root=True) as aggregated:
        task.reduce_metrics(outputs, run.criterion)
    stats = {f"valid_{k}": float(v) for k, v in aggregated.get_smoothed_values().items()}
    model.train()
    return {"epoch": epoch, **stats, "valid_num_updates": updates}


class BackgroundValidation:
    """`validate` on a thread of its own (on a GPU, also a CUDA stream of its own), one at a time, while the groups
    train on. Inside the training loop each validation held up the whole team: an H200's BERT-base + BERT-small team
    took 1.7-3.8 s longer for an epoch holding the curve runs' validations (IDs 0, 15, 30) than the 2.76 s of one
    without, about 2 minutes of the 5-seed sweep (docs/benchmarks.md, twenty-eighth session).
    The training never writes what a validation reads: the weights are a snapshot, a run's fairseq model and task
    serve only its validations, and neither the valid batches nor their masks draw from numpy's global generator,
    which the training thread's epoch shuffles use."""

    def __init__(self, device):
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation")

    def submit(self, run, state_dict, epoch, updates):
        """A future of run's `valid` record with `state_dict`, a snapshot that nothing else writes."""
        if self.stream is not None:  # the snapshot is made on the training thread's stream
            self.stream.wait_stream(torch.cuda.current_stream(self.device))
        return self.pool.submit(self._validate, run, state_dict, epoch, updates)

    def _validate(self, run, state_dict, epoch, updates):
        if self.stream is None:
            return validate(run, state_dict, epoch, updates, self.device)
        with torch.cuda.stream(self.stream):
            record = validate(run, state_dict, epoch, updates, self.device)
        self.stream.synchronize()  # the snapshot's memory belongs to the training stream: freed once read
        return record

    def wait(self):
        """Until every validation submitted so far has ended."""
        self.pool.submit(lambda: None).result()

    def close(self):
        self.pool.shutdown(cancel_futures=True)


def save_checkpoint(run, state_dict, epoch):
    """checkpoint_last.pt through fairseq's Trainer, so it reads like any fairseq-train checkpoint."""
    from fairseq.trainer import Trainer

    run.model.load_state_dict(state_dict)
    trainer = Trainer(run.cfg, run.task, run.model, run.criterion)
    trainer.set_num_updates(run.total_updates)
    trainer.consolidate_optimizer()  # fairseq-train does this before every save
    os.makedirs(run.cfg.checkpoint.save_dir, exist_ok=True)
    partial = run.checkpoint_path + ".partial"
    trainer.save_checkpoint(partial, {"train_iterator": {"epoch": epoch, "iterations_in_epoch": 0, "shuffle": True},
                                      "val_loss": None})
    os.replace(partial, run.checkpoint_path)


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
# meets at most one shape per batch of its epoch: 48 for the 69 batches of Dufter's training set (docs/benchmarks.md).
MAX_GRAPHS = 256


class PackedGroup:
    """The runs of one group_key as one stacked model with its optimiser and random streams."""

    def __init__(self, runs, device, precision="bf16", compile=False, cuda_graphs=False):
        check_cuda_graphs(cuda_graphs, device)
        self.runs, self.device = runs, device
        first = runs[0].cfg
        torch.manual_seed(first.common.seed)  # dropout draws of the group
        # On a GPU the dropout draws come from a generator state of the group's own, which `step` makes the default
        # generator's: groups beside each other on streams (`train_groups`) then neither share one nor race for it
        # (each replay of a CUDA graph first writes its generator's offset to the device, on its own stream).
        self.cuda_generator = None if device.type != "cuda" else torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()]
        self.dropout_rng = self.cuda_generator.clone_state() if self.cuda_generator is not None else None
        self.generator = torch.Generator(device=device).manual_seed(first.common.seed)  # masking draws
        self.stacked = StackedEncoder([run.model for run in runs], device,
                                      torch.bfloat16 if precision == "bf16" else torch.float32, compile)
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
        A group stepping on a stream of its own (`train_groups`) captures on that stream. torch keeps a cuBLAS
        workspace per (handle, stream) and a graph's matrix products keep the one of the stream they were captured
        on: captured on torch's one default capture stream, two groups' graphs replayed at once on their streams
        wrote into the same workspace (NaN losses in bf16, docs/benchmarks.md, nineteenth session)."""
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


def resume_path(runs):
    """Where a suspended group keeps its state: beside its first run's checkpoint."""
    return os.path.join(runs[0].cfg.checkpoint.save_dir, "packed_resume.pt")


def read_resume(runs):
    """The saved state of this very group (same commands, logs still there), or None."""
    path = resume_path(runs)
    if not os.path.exists(path):
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:  # the group can start over
        print(f"pack: {path} is unreadable ({type(err).__name__}): starting afresh", file=sys.stderr)
        return None
    if not isinstance(state, dict) or state.get("commands") != [run.argv for run in runs] or not all(
            os.path.exists(run.log_path + ".partial") for run in runs):
        print(f"pack: {path} belongs to another group or lost its logs: starting afresh", file=sys.stderr)
        return None
    return state


def train_group(runs, device, precision="bf16", progress=None, stop=None, compile=False, cuda_graphs=False,
                take_turn=None, take_warm_up=None):
    """`train_groups` of one group: its timing facts, or None when suspended."""
    facts = train_groups([runs], device, precision, [progress], stop, compile, cuda_graphs, take_turn, take_warm_up)
    return None if facts is None else facts[0]


def train_groups(chunks, device, precision="bf16", progress=None, stop=None, compile=False, cuda_graphs=False,
                 take_turn=None, take_warm_up=None):
    """Train each chunk of runs (one group_key each) as a group, all groups in lockstep: one update of each a round,
    each group on a CUDA stream of its own, so that one group's kernels fill the GPU where another's leave it idle
    (on an H100 a BERT-base group and a BERT-small group took 52.24 ms a round against 54.32 ms one after the other,
    with the no-parallel group too 66.90 against 72.39 ms; docs/benchmarks.md, twentieth session). A group whose
    updates end first leaves the round. Writes each run's log and checkpoint. Returns each group's timing facts, or
    None when `stop()` turned true before the end: every group then saved its state (`resume_path`) and the next
    call with the same chunks goes on from there, with the same result as an uninterrupted run. On a GPU a group's
    result does not depend on the groups beside it: each has its own random streams and captures its graphs on its
    own stream (`benchmarks/lockstep_equal.py`). `progress`: one function (or None) per chunk, given a line per
    epoch.

    With `take_turn` (a function returning a held lock to close at the end, or None when stopped while waiting,
    see `take_gpu`), the groups train their first epoch (compiling, capturing their CUDA graphs) beside whichever
    process holds the GPU, then wait for their turn: warm-ups no longer stand between one process's training and
    the next's. With `take_warm_up` (the same kind of function) that first epoch waits for a lock of its own,
    released when the epoch ends: processes of one model shape then compile one after another, and each after the
    first finds the compiled layers in inductor's cache instead of compiling them beside the others on the same CPU
    cores (docs/benchmarks.md, twenty-first session).

    Logs grow as `<log>.partial` and are renamed once the run's checkpoint is saved; a failure removes those of the
    groups that did not finish.
    """
    runs = [run for chunk in chunks for run in chunk]
    for run in runs:
        os.makedirs(os.path.dirname(os.path.abspath(run.log_path)), exist_ok=True)
    streams = device.type == "cuda" and len(chunks) > 1
    members, turn, warming = [], [], []  # take_turn's lock, once given; take_warm_up's, while held
    validations = BackgroundValidation(device)
    try:
        for chunk, report in zip(chunks, progress or [None] * len(chunks), strict=True):
            members.append(GroupTraining(chunk, device, precision, compile, cuda_graphs, report, streams,
                                         validations))
        facts = _train_groups(members, stop or (lambda: False), take_turn, turn, take_warm_up, warming)
    except BaseException:
        for member in members:
            member.discard_logs()
        raise
    finally:
        validations.close()
        for lock in turn + warming:
            lock.close()
    for member in members:
        if not member.finished:
            member.close_logs()
    return facts


def _train_groups(members, stop, take_turn, turn, take_warm_up, warming):
    if take_warm_up is not None:
        warming += [lock for lock in [take_warm_up()] if lock]
    seconds_before = max(member.seconds_before for member in members)
    started = time.perf_counter() - seconds_before
    warm_rounds = max(member.per_epoch for member in members)  # from here on, the groups train in their turn
    rounds = 0
    refused = take_warm_up is not None and not warming  # stopped while waiting to warm up
    while any(not member.finished for member in members):
        if rounds == warm_rounds:
            release_warm_up_memory(members[0])
        if warming and rounds >= warm_rounds:  # compiled: the next process of this shape may warm up
            warming.pop().close()
        due = take_turn is not None and not turn and rounds >= warm_rounds
        if due:
            waiting_since = time.perf_counter()
            turn += [lock for lock in [take_turn()] if lock]
            started += time.perf_counter() - waiting_since  # waiting is not training time
        if stop() or refused or (due and not turn):  # stopped, maybe while waiting to warm up or for the turn
            for member in members:
                member.suspend(time.perf_counter() - started)
            return None
        for member in members:
            if not member.finished:
                member.update(started)
        rounds += 1
    return [member.facts for member in members]


def release_warm_up_memory(member):
    """After the warm-up (the first epoch: compiling, each batch shape's first update run as is, then captured), give
    the memory those first updates left cached back to the GPU, before the next process warms up beside this one:
    a CUDA graph keeps what it needs in its own pool. Reports the process's peak and what it keeps."""
    device = member.group.device
    if device.type != "cuda":
        return
    peak = torch.cuda.max_memory_reserved(device)
    torch.cuda.empty_cache()
    if member.progress is not None:
        member.progress(f"warmed up: GPU memory {peak / 2 ** 30:.1f} GiB at most, "
                        f"{torch.cuda.memory_reserved(device) / 2 ** 30:.1f} GiB kept")


class GroupTraining:
    """One group's training: its PackedGroup, its runs' logs, and where it is (epoch, step in it, loss sums),
    resumed from its saved state if there is one. Everything it does runs on its own CUDA stream, if given one."""

    def __init__(self, runs, device, precision, compile, cuda_graphs, progress, stream, validations):
        self.runs, self.progress = runs, progress
        self.validations, self.validating = validations, []  # its BackgroundValidation; (log, future) in order
        self.stream = torch.cuda.Stream(device) if stream else None
        self.total, self.per_epoch = runs[0].total_updates, runs[0].updates_per_epoch
        if any((run.total_updates, run.updates_per_epoch) != (self.total, self.per_epoch) for run in runs):
            raise XmlmError("runs packed together must have the same number of updates per epoch and in all")
        self.group = PackedGroup(runs, device, precision, compile, cuda_graphs)
        self.group.before_capture = validations.wait
        self.resume = read_resume(runs)
        self.logs = [open(run.log_path + ".partial", "a" if self.resume else "w") for run in runs]
        zeros = torch.zeros(len(runs), device=device)
        # the epoch in progress (its batches, the next step) and the loss sums of its steps so far
        self.epoch, self.step, self.schedules, self.loss_sum, self.target_count = 0, 0, None, zeros, zeros.clone()
        self.tokens_seen, self.seconds_before, self.facts = 0, 0.0, None
        if self.resume:
            self.group.load_state_dict(self.resume["group"])
            self.epoch, self.step = self.resume["epoch"], self.resume["step"]
            self.schedules = [epoch_batches(run, self.epoch) for run in runs]
            self.loss_sum, self.target_count = self.resume["loss_sum"].to(device), self.resume["target_count"].to(
                device)
            self.tokens_seen, self.seconds_before = self.resume["tokens"], self.resume["seconds"]
            print(f"pack: resuming at update {self.group.updates} (epoch {self.epoch})", file=sys.stderr, flush=True)
        else:
            for run, log in zip(runs, self.logs):
                log.write(record_line("packed", {"command": shlex.join(run.argv), "runs_in_group": len(runs),
                                                 "validation_products": fp32_products(device)}))
        if self.stream is not None:  # after the weights and state set on the default stream
            self.stream.wait_stream(torch.cuda.current_stream(device))

    @property
    def finished(self):
        return self.facts is not None

    def on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()

    def update(self, started):
        """One update; at the end of an epoch its `train` records; after the last, validation and checkpoints."""
        with self.on_stream():
            group, runs = self.group, self.runs
            if self.schedules is None:
                self.epoch += 1
                self.schedules = [epoch_batches(run, self.epoch) for run in runs]
                self.loss_sum.zero_()
                self.target_count.zero_()
            losses, counts, batch = group.step([schedule[self.step] for schedule in self.schedules])
            self.tokens_seen += batch[-1]
            self.loss_sum += losses
            self.target_count += counts
            self.step += 1
            self._validate(group.validations_due())
            if self.step == self.per_epoch or group.updates == self.total:
                self._end_epoch(time.perf_counter() - started)
            if group.updates == self.total:
                self._finish(time.perf_counter() - started)

    def _validate(self, slots):
        for slot in slots:
            future = self.validations.submit(self.runs[slot], self.group.stacked.state_dict(slot), self.epoch,
                                             self.group.updates)
            self.validating.append((self.logs[slot], future))

    def _write_validations(self, wait=False):
        """The `valid` records of the validations that have ended (with `wait`: of all), in the order they began:
        each after the train records of the epochs that passed meanwhile."""
        while self.validating and (wait or self.validating[0][1].done()):
            log, future = self.validating.pop(0)
            log.write(record_line("valid", future.result()))
            log.flush()

    def _end_epoch(self, elapsed):
        group = self.group
        mean_loss = (self.loss_sum / self.target_count.clamp(min=1) / math.log(2)).tolist()  # base 2, as fairseq
        next_lr = learning_rate(group.updates + 1, group.schedule, group.peak_lr)
        for log, loss in zip(self.logs, mean_loss):
            log.write(record_line("train", {"epoch": self.epoch, "train_loss": loss, "train_ppl": 2 ** loss,
                                            "train_lr": next_lr, "train_num_updates": group.updates,
                                            "train_wall": elapsed}))
            log.flush()
        self._write_validations()
        if self.progress:
            clock = time.strftime("%H:%M:%S")  # so that a sweep's processes can be laid side by side afterwards
            self.progress(f"epoch {self.epoch} update {group.updates}/{self.total} at {clock}: "
                          f"{group.updates / elapsed:.1f} updates/s, "
                          f"{group.updates * len(self.runs) / elapsed:.0f} run-updates/s, "
                          f"mean loss {np.mean(mean_loss):.2f}")
        self.schedules, self.step = None, 0

    def _finish(self, seconds):
        group = self.group
        self._validate(group.validations_due(final=True))
        self._write_validations(wait=True)  # and the runs' models are free to save
        for slot, (run, log) in enumerate(zip(self.runs, self.logs)):
            save_checkpoint(run, group.stacked.state_dict(slot), self.epoch)
            log.write(record_line("packed", {"updates": group.updates, "seconds": seconds,
                                             "tokens_per_s": self.tokens_seen / seconds}))
        for run, log in zip(self.runs, self.logs):
            log.close()
            os.replace(run.log_path + ".partial", run.log_path)
        if self.resume:
            os.remove(resume_path(self.runs))
        self.facts = {"runs": len(self.runs), "updates": group.updates, "seconds": seconds,
                      "tokens": self.tokens_seen}
        if group.graphs is not None:
            self.facts.update(cuda_graphs=len(group.graphs), capture_seconds=round(group.capture_seconds, 1))

    def suspend(self, seconds):
        """Save where the group is (`resume_path`), to go on from there in a later process."""
        if self.finished:
            return
        self._write_validations(wait=True)
        with self.on_stream():
            between = self.schedules is None  # the next update starts the next epoch
            state = {"commands": [run.argv for run in self.runs], "group": self.group.state_dict(),
                     "epoch": self.epoch + between, "step": self.step,
                     "loss_sum": self.loss_sum * (not between), "target_count": self.target_count * (not between),
                     "tokens": self.tokens_seen, "seconds": seconds}
            path = resume_path(self.runs)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            torch.save(state, path + ".partial")
            os.replace(path + ".partial", path)
        for log in self.logs:
            log.flush()

    def close_logs(self):
        """A suspended group's logs stay `.partial`, to go on in the next process."""
        for log in self.logs:
            log.close()

    def discard_logs(self):
        """After a failure: the logs of a group that did not finish go."""
        if self.finished:
            return
        for run, log in zip(self.runs, self.logs):
            log.close()
            os.remove(run.log_path + ".partial")


# Small models stack one seed's runs only from this many on. A step of stacked BERT-small runs costs about 3 ms of
# kernels whatever the group's size, plus about 0.86 ms per run at one seed's padding (H100, docs/benchmarks.md):
# below about 4 runs a seed, five seeds' padding costs less than five groups' steps.
SEPARATE_SEEDS_FROM = 4


def grouped(runs, max_group, max_bytes=None):
    """The runs split by `group_key` and, mostly, by seed; at most `max_group` to a chunk and, given max_bytes, at
    most as many as `estimated_gpu_bytes` puts under it (at least one).

    fairseq cuts batches from sentences sorted by length and each seed shuffles them, so seeds stacked together pad
    to the longest of their batches: 1.64 tokens per real token for Dufter's five seeds against 1.02 for one, in
    epoch 1 of his training set (docs/benchmarks.md). A key's runs are therefore grouped by seed, unless the model
    is small (not `fills_gpu`) and some seed has fewer than SEPARATE_SEEDS_FROM runs of it."""
    groups = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    chunks = []
    for members in groups.values():
        size = max_group if max_bytes is None else max(1, min(max_group, int(max_bytes // estimated_gpu_bytes(
            members[:1]))))
        seeds = {}
        for run in members:
            seeds.setdefault(run.cfg.common.seed, []).append(run)
        separate = fills_gpu(members) or min(map(len, seeds.values())) >= SEPARATE_SEEDS_FROM
        for part in (seeds.values() if separate else [members]):
            chunks += [part[i:i + size] for i in range(0, len(part), size)]
    return chunks


def take_gpu(lock_path, stop, label):
    """Wait until this process holds `lock_path` (one file per set of visible GPUs, see `take_lock`), checking
    `stop()` meanwhile; returns the held lock (closing it lets the next process in), or None when stopped."""
    return take_lock(f"{lock_path}.{visible_gpus()}", stop, label, "the GPU", "waiting for the GPU")


def take_warm_up(lock_path, chunks, stop, label):
    """`take_lock` of `lock_path` for the model shapes of `chunks` and the visible GPUs (one file per set of shapes
    and of GPUs): the turn to warm up (compile) among the processes of those shapes on those GPUs. Per GPU, so that
    on several GPUs the first group of each still warms up at once."""
    shape = "+".join(f"{len(c)}x{c[0].cfg.model.encoder_layers}x{c[0].cfg.model.encoder_embed_dim}x"
                     f"{c[0].cfg.model.encoder_ffn_embed_dim}x{c[0].cfg.model.encoder_attention_heads}" for c in chunks)
    return take_lock(f"{lock_path}.{visible_gpus()}.{shape}", stop, label, "the warm-up turn of its shape",
                     "waiting to warm up after the other group of its shape")


def visible_gpus():
    """The visible GPUs as part of a file name: "0_1" for CUDA_VISIBLE_DEVICES=0,1, "all" when it is not set."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "all").replace(",", "_")


class HeldLock:
    """A lock file this process holds, as a POSIX record lock (`fcntl.lockf`). Such a lock belongs to the process,
    not to the open file: a child process that inherited the descriptor (anything forked while it was held) does
    not keep it after `close()`, as it would keep an flock. Taking and letting go are logged with the clock, so that
    a sweep's logs show who held what when (docs/benchmarks.md, twenty-sixth session: in a 5-seed sweep a process
    was still waiting to warm up 7 minutes after the turn's holder had warmed up, for a reason not found)."""

    def __init__(self, file, label, what):
        self.file, self.label, self.what = file, label, what
        print(f"{label}: took {what} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)

    @property
    def closed(self):
        return self.file.closed

    def close(self):
        if not self.file.closed:
            self.file.close()  # closing any descriptor of the file ends this process's record locks on it
            print(f"{self.label}: let go of {self.what} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)


def take_lock(path, stop, label, what, waiting):
    """Wait until this process holds `path` (an exclusive record lock, `HeldLock`), checking `stop()` meanwhile and
    printing "`label`: `waiting` (path) at time" once if it has to wait; returns the `HeldLock` (closing it lets the
    next process in), or None when stopped."""
    lock, waited = open(path, "a"), False
    while True:
        try:
            fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return HeldLock(lock, label, what)
        except OSError as error:  # held elsewhere: EAGAIN or EACCES, as the system reports it
            if error.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if not waited:
            print(f"{label}: {waiting} ({path}) at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
            waited = True
        if stop():
            lock.close()
            return None
        time.sleep(0.2)


def train_packed(commands, max_group=40, precision="bf16", device=None, stop=None, compile=False, cuda_graphs=False,
                 gpu_lock=None, lockstep=False, warm_up_lock=None):
    """Parse every command, group them, train each group; returns a summary per group, None for a group that
    `stop()` suspended (the groups after it do not start). With `lockstep` all groups train at once
    (`train_groups`), else one after another. With `gpu_lock` (a path), groups train past their first epoch only
    while this process holds that lock (`take_gpu`): processes whose groups keep the GPU busy (CUDA graphs) take
    turns, and the next one builds its runs and warms up (`train_groups`' take_turn) while the GPU is still busy
    with the last. With `warm_up_lock` (a path), the processes of one model shape warm up one at a time
    (`take_warm_up`)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    check_cuda_graphs(cuda_graphs, device)  # before the runs are built
    stop = stop or (lambda: False)
    runs = parse_runs(commands)
    pending = [run for run in runs if not run.done()]
    for run in runs:
        if run.done():
            print(f"pack: {run.checkpoint_path} exists, skipped", file=sys.stderr)
    chunks = grouped(pending, max_group)
    labels = [f"pack group {number}/{len(chunks)} ({len(chunk)} runs, {chunk[0].cfg.model.encoder_layers} x "
              f"{chunk[0].cfg.model.encoder_embed_dim}d)" for number, chunk in enumerate(chunks, 1)]
    summary = []
    for team in ([list(range(len(chunks)))] if lockstep and chunks else [[i] for i in range(len(chunks))]):
        for i in team:
            print(f"{labels[i]}: building", file=sys.stderr, flush=True)
            for run in chunks[i]:
                run.build()
            print(f"{labels[i]}: training from {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)
        label = " + ".join(labels[i] for i in team)
        facts = train_groups([chunks[i] for i in team], device, precision,
                             progress=[lambda text, label=labels[i]: print(f"{label} {text}", file=sys.stderr,
                                                                           flush=True) for i in team],
                             stop=stop, compile=compile, cuda_graphs=cuda_graphs,
                             take_turn=(lambda: take_gpu(gpu_lock, stop, label)) if gpu_lock else None,
                             take_warm_up=(lambda: take_warm_up(warm_up_lock, [chunks[i] for i in team], stop, label))
                             if warm_up_lock else None)
        for i in team:
            for run in chunks[i]:  # the next groups' models take the memory
                run.task = run.model = run.criterion = None
        if facts is None:
            for i in team:
                print(f"{labels[i]}: suspended, state in {resume_path(chunks[i])}; rerun to resume", file=sys.stderr,
                      flush=True)
            summary += [None] * len(team)
            break
        for i, group_facts in zip(team, facts):
            print(f"{labels[i]}: done in {group_facts['seconds']:.0f}s at {time.strftime('%H:%M:%S')}, "
                  f"{group_facts['updates'] * group_facts['runs'] / group_facts['seconds']:.0f} run-updates/s",
                  file=sys.stderr, flush=True)
        summary += facts
    return summary


def estimated_gpu_bytes(runs):
    """A rough upper bound of a group's GPU memory, to keep groups side by side from running out of it: per run,
    20 bytes a weight (fp32 master, gradient, two Adam moments, bf16 copy) and the bf16 activations that backward
    keeps for a batch of the longest sentences (about 5 hidden-size and 2 FFN-size values per token and layer: 3
    stacked BERT-base runs peaked at 20.6 GB on an H200, their longest batch 256 x 93 tokens, docs/benchmarks.md),
    with 25 % slack. A BERT-base run comes to about 12 GB, a BERT-small one to about 0.9 GB."""
    m, c = runs[0].cfg.model, runs[0].cfg
    d, f, layers = m.encoder_embed_dim, m.encoder_ffn_embed_dim, m.encoder_layers
    tokens = c.dataset.batch_size * c.task.tokens_per_sample
    activations = layers * tokens * (5 * d + 2 * f) * 2
    return len(runs) * (20 * weight_count(runs[0]) + 1.25 * activations)


def weight_count(run):
    """About how many weights one run's model has: its layers and the embeddings of a Bible-sized vocabulary."""
    m = run.cfg.model
    d = m.encoder_embed_dim
    return m.encoder_layers * (4 * d * d + 2 * d * m.encoder_ffn_embed_dim) + 20_000 * d


def fills_gpu(runs):
    """Whether a group keeps a GPU busy by itself, so that a second such group beside it only takes turns: two
    BERT-base groups side by side made 40 run-updates/s together, one alone 51.3; one beside BERT-small groups was
    not slowed (H100, docs/benchmarks.md). BERT-base has about 100 M weights, BERT-small 2 M."""
    return weight_count(runs[0]) >= 10_000_000


def lockstep_teams(chunks):
    """The groups as they share processes (`train_groups`): each group that fills the GPU with one that does not, of
    the same length (data, epochs, updates, batch size) where there is one (on an H100 a round of two groups on
    streams of their own took 1/1.040 of their updates one after another, docs/benchmarks.md, twentieth session);
    every other group alone, the small ones first. A small group compiles in a fraction of a large team's warm-up,
    so the GPU trains it while the large teams compile: in the 5-seed sweep the first large team trained 144 s after
    the start, with the GPU mostly idle until then (H200, docs/benchmarks.md, twenty-eighth session)."""
    def length(chunk):
        cfg = chunk[0].cfg
        return cfg.task.data, cfg.task.no_parallel, cfg.optimization.max_epoch, cfg.optimization.max_update, \
            cfg.dataset.batch_size

    large, small = [c for c in chunks if fills_gpu(c)], [c for c in chunks if not fills_gpu(c)]
    teams = []
    for chunk in large:
        partner = next((c for c in small if length(c) == length(chunk)), None)
        if partner is not None:
            small.remove(partner)
        teams.append([chunk] + ([partner] if partner else []))
    return [[chunk] for chunk in small] + teams


def train_side_by_side(commands, workdir, max_group=40, precision="bf16", slots=0, then=None, compile=None,
                       cuda_graphs=None, lockstep=False, then_beside=None, tf32=False):
    """Every group (see `group_key`) in a packed_training process, `slots` processes at a time on the GPU. A group
    takes at most 60 % of a GPU's memory budget (by `estimated_gpu_bytes`: three BERT-base runs on an 80 GB GPU);
    larger models start first; with several GPUs each process runs on one of them, the least loaded.
    `compile` (default: on a GPU) compiles the stacked layers and the optimizer step; `cuda_graphs` (default: on a
    GPU) replays each batch shape's whole update as a CUDA graph, and the processes then train one at a time per GPU
    (`take_gpu`) while the others build their runs and train their first epoch (compiling; compiled, one process of
    a model shape at a time, `take_warm_up`). With `lockstep` a group that fills the GPU shares its process with
    small ones, in lockstep (`lockstep_teams`, `train_groups`): its rounds are faster, but such a process compiles
    its groups one after another, and is larger, so fewer of them warm up beside the one training
    (docs/benchmarks.md, twentieth session). Without graphs, groups train side by side, so one group's Python
    overlaps the others' kernels, and a group that fills a GPU (`fills_gpu`) never shares one with another such
    group; with graphs, at most two such processes share a GPU.
    `then` maps a command (tuple of its argv) to the commands to run once its group has trained (its evaluation),
    so a sweep cut short keeps every result it finished; `then_beside` (the same kind of map, optional per command)
    what replaces them while other groups have yet to train (`run_packed`). `tf32`: the validations' matrix
    products in TF32 (packed_training --tf32). Writes workdir/commands.<i>.txt,
    summary.<i>.json and logs/<i>.log; returns the wall time and the per-process summaries."""
    from fairseq_xmlm.gpu_pack import run_packed, several_gpus

    os.makedirs(workdir, exist_ok=True)
    capacity = 0.9 * torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    compile = torch.cuda.is_available() if compile is None else compile
    cuda_graphs = torch.cuda.is_available() if cuda_graphs is None else cuda_graphs
    # with CUDA graphs a group keeps a GPU busy by itself (side by side, three groups made 0.91 of what they make
    # taking turns, docs/benchmarks.md): the groups train one at a time per GPU, under one lock
    locks = ["--gpu-lock", os.path.join(os.path.abspath(workdir), "gpu.lock")] if cuda_graphs else []
    # compiled, the processes of one model shape warm up one after another: the later ones find the layers in
    # inductor's cache (docs/benchmarks.md, twenty-first session)
    locks += ["--warm-up-lock", os.path.join(os.path.abspath(workdir), "warm-up.lock")] if compile else []
    chunks = grouped(parse_runs(commands), max_group, capacity and 0.6 * capacity)
    # the longest groups (larger models, more runs) first, so none is left to run alone at the end
    chunks.sort(key=lambda chunk: (-chunk[0].cfg.model.encoder_embed_dim, -len(chunk)))
    teams = lockstep_teams(chunks) if lockstep else [[chunk] for chunk in chunks]
    processes, summaries = [], []
    for index, team in enumerate(teams):
        listing = os.path.join(workdir, f"commands.{index}.txt")
        summary = os.path.join(workdir, f"summary.{index}.json")
        with open(listing, "w") as f:
            f.writelines(shlex.join(run.argv) + "\n" for chunk in team for run in chunk)
        processes.append([sys.executable, "-m", "fairseq_xmlm.packed_training", listing, "--max-group", str(max_group),
                          "--precision", precision, "--summary", summary] + (["--compile"] if compile else [])
                         + (["--cuda-graphs"] if cuda_graphs else []) + locks
                         + (["--lockstep"] if len(team) > 1 else []) + (["--tf32"] if tf32 else []))
        summaries.append(summary)
    slots = slots or min(len(processes), max(1, (os.cpu_count() or 2) // 2))
    devices = several_gpus()  # each process on one of them, spread by memory
    logs = os.path.join(workdir, "logs")
    print(f"pack: {len(commands)} runs in {len(processes)} groups, at most {slots} processes at a time and as many "
          f"as fit in GPU memory ({len(devices or [0])} GPUs); progress in {logs}/", file=sys.stderr, flush=True)
    started = time.perf_counter()
    then, then_beside = then or {}, then_beside or {}

    def follow_ups(beside):
        """Each process's follow-ups: its runs' `then`, or their `then_beside` where a run has one."""
        return [[c for chunk in team for run in chunk
                 for c in (beside and then_beside.get(tuple(run.argv)) or then.get(tuple(run.argv), []))]
                for team in teams]

    # With graphs, two processes that fill a GPU: the one training and the next one warming up, which then waits
    # with its graphs captured. A third would only hold memory: at 100 epochs three teams of 3 BERT-base + 11
    # BERT-small held 36, 43 and over 60 GiB and the third's warm-up ran an H200 out of memory, while the next
    # one's start and warm-up (about a minute) fit in the training of the one before (about 5 minutes;
    # docs/benchmarks.md, twenty-ninth session). At the end, the last evaluations all at once: all that is left.
    run_packed(processes, slots, logs, costs=[sum(map(estimated_gpu_bytes, team)) for team in teams],
               capacity=capacity, devices=devices, then=follow_ups(False),
               fills=[fills_gpu(team[0]) for team in teams], fills_per_gpu=2 if cuda_graphs else 1,
               then_beside=follow_ups(True), end_slots=os.cpu_count())
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "slots": slots, "processes": [json.load(open(path)) for path in summaries]}


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("commands", help="file with one fairseq-train command per line")
    parser.add_argument("--max-group", type=int, default=40, help="most runs stacked into one model")
    parser.add_argument("--precision", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--summary", help="write the per-group timings here (json)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the stacked layers and the optimizer step (worth it on a GPU)")
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="replay each batch shape's whole update as a CUDA graph (GPU only)")
    parser.add_argument("--gpu-lock", help="train a group past its first epoch only while holding this lock file "
                        "(a record lock): processes take turns on the GPU")
    parser.add_argument("--warm-up-lock", help="train a group's first epoch (compiling) only while holding this lock "
                        "file, one per model shape and GPU: processes of one shape compile one after another")
    parser.add_argument("--lockstep", action="store_true",
                        help="train all groups at once, one update of each a round (each on a CUDA stream of its own)")
    parser.add_argument("--time-limit", type=float, default=0,
                        help="suspend after this many seconds (as on SIGTERM or Ctrl-C); 0: no limit")
    parser.add_argument("--tf32", action="store_true",
                        help="the validations' fp32 matrix products in TF32 on a GPU (the training's are bf16; with "
                             "--precision fp32, the training's too)")
    args = parser.parse_args(argv)
    if args.tf32:
        allow_tf32()
    if args.max_group < 1:
        raise XmlmError(f"--max-group must be at least 1, got {args.max_group}")
    started = time.perf_counter()
    signalled = []
    # SIGTERM or Ctrl-C: finish the step, save the state, exit SUSPENDED
    previous = {signum: signal.signal(signum, lambda *_: signalled.append(True))
                for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        summary = train_packed(read_commands(args.commands), args.max_group, args.precision, stop=lambda: bool(
            signalled or (args.time_limit and time.perf_counter() - started > args.time_limit)), compile=args.compile,
            cuda_graphs=args.cuda_graphs, gpu_lock=args.gpu_lock, lockstep=args.lockstep,
            warm_up_lock=args.warm_up_lock)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if summary and summary[-1] is None:
        sys.exit(SUSPENDED)
    total = time.perf_counter() - started
    print(f"pack: {sum(g['runs'] for g in summary)} runs in {len(summary)} groups, {total:.0f}s", file=sys.stderr)
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"groups": summary, "seconds": total}, f, indent=1)


if __name__ == "__main__":
    main()
