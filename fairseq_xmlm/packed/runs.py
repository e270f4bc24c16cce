"""fairseq-train command lines as run records: each parsed by fairseq's own parser and, once `Run.build()` ran,
with the task, model (initialised with the command's seed, as fairseq-train does), criterion and training set that
fairseq builds for it; and the batches fairseq-train would feed it, epoch by epoch.
"""
import math
import multiprocessing
import os
import shlex
import warnings
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.errors import XmlmError

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
    def update_size(self):
        """Sentences of an update: --batch-size times --update-freq."""
        return self.cfg.dataset.batch_size * self.cfg.optimization.update_freq[0]

    @property
    def micro_batch(self):
        """Sentences of a micro-batch, whose padding its sentences attend to under --attend-padding, where an update
        accumulates several (--update-freq > 1); None: the update is one batch."""
        return self.cfg.dataset.batch_size if self.cfg.optimization.update_freq[0] > 1 else None

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
    if len(cfg.optimization.update_freq) != 1 or not cfg.dataset.batch_size or cfg.dataset.max_tokens:
        raise XmlmError("packed training needs --batch-size (no --max-tokens) and one --update-freq")
    if cfg.model.sep_emb or cfg.model.sep_layers:
        raise XmlmError("packed training supports shared embeddings and layers only (no --sep-emb / --sep-layers)")
    return Run(argv, cfg)


PARSES_PER_WORKER = 16  # a fresh process first imports torch and fairseq: about as long as 16 parses take


def parse_runs(commands, workers=None):
    """`parse_run` of every command, in order. fairseq's parser and hydra's composition take about 0.3 s a command:
    the 5-seed sweep's 80 took about 25 s before its first training process started (2026-11-28, one H200 machine's
    16 cores, commit 6a383bb). So with many commands they are parsed in a pool of fresh processes (`workers`,
    default: one per PARSES_PER_WORKER commands, at most half the cores); an error is raised here as in the pool."""
    if workers is None:
        workers = min(len(commands) // PARSES_PER_WORKER, (os.cpu_count() or 1) // 2)
    if workers < 2:
        return [parse_run(argv) for argv in commands]
    # spawned, not forked: the caller may have threads (the recipe's) and the GPU open
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(parse_run, commands, chunksize=-(-len(commands) // workers)))


def epoch_batches(run, epoch):
    """fairseq's batches for `epoch` as arrays of item ids, in the order fairseq-train would feed them (the dataset's
    batches are of slots that it maps to items per epoch: `MaskedLanguageDataset.item_of_slot`); with --update-freq K,
    one array per update: K consecutive batches, as fairseq's GroupedIterator hands them to the trainer (fewer at the
    end of the epoch), the short ones last so that the micro-batches are the array's consecutive `run.micro_batch`
    items (an update's sum of losses does not depend on the order of its sentences)."""
    cfg, dataset = run.cfg, run.task.dataset("train")
    iterator = run.task.get_batch_iterator(
        dataset=dataset, max_tokens=None, max_sentences=cfg.dataset.batch_size,
        max_positions=run.task.max_positions(), required_batch_size_multiple=cfg.dataset.required_batch_size_multiple,
        seed=cfg.common.seed, epoch=epoch, num_workers=0)
    dataset.set_epoch(epoch)
    items = dataset.item_of_slot()
    batches = [np.asarray(b) if items is None else items[np.asarray(b)]
               for b in iterator.ordered_batches(epoch, False, True)]
    every = cfg.optimization.update_freq[0]
    if every == 1:
        return batches
    return [np.concatenate(sorted(batches[i:i + every], key=len, reverse=True))  # stable: full ones in order
            for i in range(0, len(batches), every)]


def read_commands(path):
    """One shell-quoted command per non-empty line of a UTF-8 file; lines starting with # are comments."""
    if not os.path.isfile(path):
        raise XmlmError(f"command file not found: {path}")
    commands = []
    for number, line in enumerate(read_corpus(path), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            try:
                commands.append(shlex.split(line))
            except ValueError as err:  # an open quote
                raise XmlmError(f"{path}, line {number}: {err}") from None
    return commands
