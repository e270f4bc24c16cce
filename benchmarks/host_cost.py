"""What one update of the Conneau `bible` recipe costs the host (CPU), part by part, on a CPU.

    python3 benchmarks/host_cost.py --out DIR [--data-root data-bin/conneau] [--rows default,sep_emb,sep_l1_3]
        [--batches 60] [--rounds 3] [--steps 20] [--step-batch 4] [--step-tokens 32]

Each row trains with the recipe's own fairseq-train arguments (`experiments/conneau/recipe.train_command`, preset
bible) on the row's data under --data-root (`en_fr_joint` for Default, `en_fr_separate` for the Sep rows, as
`python -m fairseq_xmlm.experiments.conneau bible --pairs en-fr --rows default,sep_emb --prepare-only` writes them).
Two parts, in CPU time of this thread (torch on one thread; the data loader in-process, as --num-workers 0):

- data: per batch of 64 streams x 256 tokens of the task's batch iterator: reading the samples, padding them,
  masking (the row's --random-replace), the rest of the collater, and `next()` on fairseq's epoch iterator (all of
  it). Every part is timed on the same batches in the current path and in the earlier one (`per_item`
  MaskedLanguageDataset, `sort_twice` Masker), alternating, over --rounds rounds (the fastest round counts), and the
  two paths' batches are compared for equality.
- step: fairseq's Trainer.train_step with the recipe's --fp16 --memory-efficient-fp16, its model shrunk to 16 wide
  (8 layers, 4 heads as the preset) and its batch to --step-batch x --step-tokens, so that the CPU's arithmetic is
  small next to the host's own work (which does not depend on the shapes): forward (criterion with model), backward,
  optimizer (gradient gathering, unscaling, clipping, AdamW, zeroing, learning rate), logging (fairseq's metrics),
  the rest of train_step. It also counts the operators dispatched per step (each one a kernel launch or more on a
  GPU) and the ones that make a GPU run wait for the host (.item(), nonzero, ...), with where they are called from.

Writes DIR/host_cost.json (every figure) and DIR/<row>.profile.txt (cProfile of the data path and of the steps).
"""
import argparse
import collections
import copy
import cProfile
import dataclasses
import io
import json
import os
import pstats
import sys
import time
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
SYNCING_OPS = ("aten._local_scalar_dense", "aten.nonzero", "aten.is_nonzero", "aten.masked_select", "aten.unique")


def recipe_arguments(row, data_root, extra=()):
    """fairseq-train's arguments of the en-fr run of `row` under the bible preset, as the recipe writes them."""
    from fairseq_xmlm.experiments.conneau import recipe

    argv = recipe.train_command(recipe.Run("en-fr", row, 1), "bible", data_root, "/tmp/xmlm-host-cost-checkpoints")
    return argv[3:] + list(extra)  # without `python -m fairseq_cli.train`


def parse(argv):
    from fairseq import options, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    utils.import_user_module(cfg.common)
    return cfg


def cpu_ms(fn, *args):
    start = time.thread_time()
    result = fn(*args)
    return (time.thread_time() - start) * 1e3, result


def earlier_path(dataset):
    """The same dataset on the earlier code path: items read one by one, fairseq's padding, the ranking sorted
    twice."""
    old = copy.copy(dataset)
    old.per_item = True
    old.masker = dataclasses.replace(dataset.masker, sort_twice=True)
    return old


def data_parts(dataset, indices):
    """CPU ms of one batch's parts and the batch."""
    from fairseq.data import data_utils
    from fairseq_xmlm.data.mlm_dataset import pad_right

    ms = {}
    ms["fetch"], samples = cpu_ms(dataset.__getitems__, indices)
    rows = [s["tokens"] for s in samples]
    pad = data_utils.collate_tokens if dataset.per_item else pad_right
    ms["pad"], tokens = cpu_ms(pad, rows, dataset.pad)
    langs = torch.tensor([s["lang"] for s in samples])
    generator = torch.Generator().manual_seed(0)
    ms["mask"], _ = cpu_ms(dataset.masker, tokens, dataset.mask_ids[langs], dataset.candidate_set[langs], generator,
                           dataset.pad)
    collater_ms, batch = cpu_ms(dataset.collater, samples)
    ms["collater rest"] = collater_ms - ms["pad"] - ms["mask"]
    return ms, batch


def same_batch(a, b):
    return a.keys() == b.keys() and all(
        same_batch(a[k], b[k]) if isinstance(a[k], dict) else
        torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k] for k in a)


def measure_data(task, n_batches, rounds):
    """{path: {part: CPU ms per batch}} for the current and the earlier path, and whether their batches agree."""
    task.load_dataset("train")
    new = task.datasets["train"]
    paths = {"new": new, "old": earlier_path(new)}
    iterator = task.get_batch_iterator(new, max_sentences=64, seed=1, disable_iterator_cache=True)
    batches = iterator.frozen_batches
    chosen = [batches[int(i * len(batches) / n_batches)] for i in range(n_batches)]  # both languages
    best = {name: collections.defaultdict(lambda: float("inf")) for name in paths}
    identical = True
    for _ in range(rounds):
        for name in ("old", "new"):
            totals, made = collections.defaultdict(float), []
            for indices in chosen:
                ms, batch = data_parts(paths[name], indices)
                made.append(batch)
                for part, value in ms.items():
                    totals[part] += value
            epoch = task.get_batch_iterator(paths[name], max_sentences=64, seed=1,
                                            disable_iterator_cache=True).next_epoch_itr(shuffle=True)
            totals["iterator next()"], _ = cpu_ms(lambda: [next(epoch) for _ in chosen])
            for part, value in totals.items():
                best[name][part] = min(best[name][part], value / len(chosen))
            if name == "old":
                reference = made
            else:
                identical &= all(same_batch(a, b) for a, b in zip(reference, made))
    return {name: dict(parts) for name, parts in best.items()}, identical


class PartTimer:
    """CPU ms spent in wrapped methods, by part."""

    def __init__(self):
        self.ms = collections.defaultdict(float)

    def wrap(self, owner, name, part):
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                self.ms[part] += (time.thread_time() - start) * 1e3

        setattr(owner, name, timed)


class OperatorCount(TorchDispatchMode):
    """Operators dispatched below autograd, backward included, views left out (roughly one GPU kernel launch each),
    and the calls that make the host read a tensor's value (on a GPU: wait for it), by their Python caller."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.syncs = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        returns = func._schema.returns
        self.ops += not (returns and returns[0].alias_info is not None and not returns[0].alias_info.is_write)
        name = str(func.overloadpacket)
        if name in SYNCING_OPS:
            frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename]
            caller = frames[-1]
            self.syncs[f"{name} {os.path.relpath(caller.filename, REPO)}:{caller.lineno} {caller.name}"] += 1
        return func(*args, **(kwargs or {}))


def build_trainer(cfg, trainer_class=None):
    """(fairseq's Trainer, or `trainer_class`, of `cfg`; its task with the train split loaded)."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    trainer_class = trainer_class or Trainer
    return trainer_class(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)), task


def measure_step(cfg, n_steps, profile):
    trainer, task = build_trainer(cfg)
    epoch = task.get_batch_iterator(task.datasets["train"], max_sentences=cfg.dataset.batch_size,
                                    seed=1).next_epoch_itr(shuffle=True)
    samples = [next(epoch) for _ in range(n_steps + 5)]
    for sample in samples[:5]:  # builds the optimizer, warms the allocator
        trainer.train_step([sample])
    timer, optimizer = PartTimer(), trainer.optimizer
    timer.wrap(trainer.criterion, "forward", "forward")
    timer.wrap(optimizer, "backward", "backward")
    for name in ("all_reduce_grads", "multiply_grads", "step", "zero_grad"):
        timer.wrap(optimizer, name, "optimizer")
    for name in ("clip_grad_norm", "lr_step_update"):
        timer.wrap(trainer, name, "optimizer")
    timer.wrap(trainer, "_reduce_and_log_stats", "logging")
    total = 0.0
    for sample in samples[5:]:
        ms, _ = cpu_ms(trainer.train_step, [sample])
        total += ms
    parts = {part: ms / n_steps for part, ms in timer.ms.items()}
    parts["rest of train_step"] = total / n_steps - sum(parts.values())
    parts["train_step"] = total / n_steps
    counter = OperatorCount()
    with counter:
        for sample in samples[5:8]:
            trainer.train_step([sample])
    profile.runcall(lambda: [trainer.train_step([s]) for s in samples[5:]])
    return parts, counter.ops / 3, {k: v / 3 for k, v in sorted(counter.syncs.items())}


def profile_text(profile, limit=40):
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(limit)
    return out.getvalue()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--data-root", default="data-bin/conneau", help="holds en_fr_joint and en_fr_separate")
    parser.add_argument("--rows", default="default,sep_emb,sep_l1_3")
    parser.add_argument("--batches", type=int, default=60, help="batches of 64 x 256 per data measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-batch", type=int, default=4)
    parser.add_argument("--step-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(1)
    os.makedirs(args.out, exist_ok=True)
    results = {"torch": torch.__version__, "argv": sys.argv[1:], "rows": {}}
    for row in args.rows.split(","):
        cfg = parse(recipe_arguments(row, args.data_root))
        from fairseq import tasks

        profile = cProfile.Profile()
        data, identical = profile.runcall(measure_data, tasks.setup_task(cfg.task), args.batches, args.rounds)
        data_profile = profile_text(profile)
        tiny = ["--fp16", "--memory-efficient-fp16", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "16",
                "--batch-size", str(args.step_batch), "--tokens-per-sample", str(args.step_tokens)]
        profile = cProfile.Profile()
        step, ops, syncs = measure_step(parse(recipe_arguments(row, args.data_root, tiny)), args.steps, profile)
        with open(os.path.join(args.out, f"{row}.profile.txt"), "w") as f:
            f.write(f"data path (both paths, {args.rounds} rounds)\n{data_profile}\n"
                    f"train steps\n{profile_text(profile)}")
        results["rows"][row] = {"data_ms_per_batch": data, "data_identical": identical, "step_ms": step,
                                "ops_per_step": ops, "host_reads_per_step": syncs}
        print(f"\n== {row}: data per batch of 64 x 256 (CPU ms; old = earlier path, same run); batches identical: "
              f"{identical}")
        print(f"{'part':<18}{'old':>9}{'new':>9}{'new/old':>9}")
        for part in data["new"]:
            old, new = data["old"][part], data["new"][part]
            print(f"{part:<18}{old:9.3f}{new:9.3f}{new / old if old > 0 else float('nan'):9.2f}")
        print(f"-- {row}: train_step, {args.step_batch} x {args.step_tokens} tokens, 16 wide (CPU ms per step)")
        for part, ms in step.items():
            print(f"{part:<22}{ms:9.3f}")
        print(f"operators per step {ops:.0f}; host reads per step {sum(syncs.values()):.0f}:")
        for where, n in syncs.items():
            print(f"  {n:4.0f}  {where}")
        if not identical:
            print(f"{row}: the earlier path's batches differ from the current path's", file=sys.stderr)
    with open(os.path.join(args.out, "host_cost.json"), "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
