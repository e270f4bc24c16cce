"""A run's validation as fairseq-train's (the task's `valid_step` over --max-valid-steps batches, with its
--eval-multilinguality hook), computed beside the training instead of inside its loop.

Validation runs only at --validate-interval-updates and at a run's end, not after every epoch, in fp32 (with the
CLI's --tf32, its matrix products in TF32 on a GPU, as `xmlm-eval-mult --tf32`).
"""
from concurrent.futures import ThreadPoolExecutor
from itertools import islice

import torch


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
    train on. Inside the training loop each validation held up the whole team: a BERT-base + BERT-small team took
    1.7-3.8 s longer for an epoch holding the curve runs' validations (IDs 0, 15, 30) than the 2.76 s of one without,
    about 2 minutes of the 5-seed sweep; beside it, 0.5-0.75 s (2026-11-28, one H200, commit 532c27d against
    b60f796, on two machines).
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
