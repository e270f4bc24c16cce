"""`xmlm-train` (`python -m fairseq_xmlm.train`): fairseq-train, same arguments, same training loop, same results,
with a trainer whose data-parallel ranks wait for each other once per update instead of at every collective and
host read of fairseq's.

fairseq's Trainer reads GPU values back on the host all through an update. Each read stops the host until the GPU has
caught up, and the GPU then idles while the host works its way to the next kernel. Under DDP a read that follows a
collective also makes every rank wait for the slowest host. On 4 H100s at the Conneau config, these reads and the
collectives between them cost a 4-GPU update 5-9 ms over a 1-GPU one (4x H100 80GB, 2026-11-26 and 2026-11-27).
Per update, fairseq's trainer:
1. all-reduces the logged statistics in two collectives: one for the host's numbers, after a blocking copy to the
   GPU, and one for the GPU's tensors;
2. reads the summed sample size (`sample_size or 1.0`), then the gradient norm;
3. all-reduces the gradient norm in a third collective, to check that every rank has the same, and reads it;
4. after the optimizer step, reads each logged statistic again in fairseq's meters, so the host waits for the step
   before it can fetch the next batch.

Under DDP, `XmlmTrainer` sums the statistics in one collective and brings them to the host in one copy, before the
optimizer step. It hands the gradient norm on as a host tensor, and the norm's cross-rank check rides along in the next
update's statistics. After the optimizer step the host reads nothing and goes on to the next batch while the step
runs. With xmlm_adamw's flat fp16 gradient under legacy_ddp, it starts the gradient's all-reduce right after the
update's last backward (`start_gradient_all_reduce`), where fairseq's trainer waits for the statistics first.

On one process without a loss scaler (fp32, or `--bf16-params`) and with `--optimizer xmlm_adamw`, `XmlmTrainer`
runs an update with no host read at all (`train_step`): fairseq's reads the gradient norm twice (its finiteness
check and its `gnorm` meter) and every logged statistic once (the smoothed values it returns), so the GPU idles
while the host prepares each next update. Here a non-finite gradient norm skips the step on the GPU (xmlm_adamw's
`step_unless_nonfinite`) and raises FloatingPointError one update later, or at the next checkpoint; the logged
statistics stay GPU tensors until fairseq-train prints them, every --log-interval updates.
"""
import logging
import os
import sys

import torch
from fairseq.distributed import utils as distributed_utils
from fairseq.logging import metrics
from fairseq.trainer import Trainer

from fairseq_xmlm.errors import cli_errors
from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamW, start_gradient_all_reduce

logger = logging.getLogger("fairseq_xmlm.train")


def sum_over_ranks(values, device, group=None):
    """{name: number or tensor} summed over the ranks of `group` (None: one process) in one collective over one
    buffer, then copied to the host in one piece. Numbers and 0-dim tensors come back as Python floats, other
    tensors as float64 CPU tensors of their shape."""
    # by device type, as fairseq does: the trainer's device is "cuda", its tensors' "cuda:0"
    host = [(k, v) for k, v in values.items() if not torch.is_tensor(v) or v.device.type != device.type]
    on_device = [(k, v) for k, v in values.items() if torch.is_tensor(v) and v.device.type == device.type]
    parts = [v.detach().reshape(-1).double() for _, v in on_device]
    if host:
        numbers = torch.cat([torch.as_tensor(v, dtype=torch.double).reshape(-1) for _, v in host])
        if device.type == "cuda":  # pinned: the copy to the GPU is queued, the host does not wait for the GPU
            numbers = numbers.pin_memory()
        parts.append(numbers.to(device, non_blocking=True))
    buffer = torch.cat(parts)
    if group is not None:
        distributed_utils.all_reduce(buffer, group=group)
    flat = buffer.cpu()  # the update's one wait on the GPU
    summed, offset = {}, 0
    for k, v in on_device + host:
        n = v.numel() if torch.is_tensor(v) else 1
        piece = flat[offset:offset + n]
        offset += n
        summed[k] = piece.item() if not torch.is_tensor(v) or v.dim() == 0 else piece.view(v.shape)
    return {k: summed[k] for k in values}


def check_consistent_grad_norms(norms, amp=False):
    """fairseq's rule for one update's gradient norm on every rank: all finite and equal to 1e-6 relative (with
    --amp, all non-finite passes too: that step is skipped). Raises FloatingPointError, as fairseq does."""
    norms = torch.as_tensor(norms, dtype=torch.double)
    finite = bool(torch.isfinite(norms).all())
    if finite and bool(((norms - norms[0]).abs().max() / (norms[0] + 1e-6)) < 1e-6):
        return
    if amp and not finite:
        return
    detail = "\n".join(f"rank {r:3d} = {n:.8f}" for r, n in enumerate(norms.tolist()))
    raise FloatingPointError("Fatal error: gradients are inconsistent between workers (checked one update late, "
                             f"xmlm-train). grad_norm across the workers:\n{detail}")


class XmlmTrainer(Trainer):
    """fairseq's Trainer with one host wait per update under DDP, and none on one process without a loss scaler
    (module docstring). Under DDP its train_step is fairseq's; four of the helpers it calls are replaced.

    One process with fp16's loss scaler keeps fairseq's own path: there no rank waits for another, and on 4x H200
    (2026-11-27, commit c863eb6) reading the statistics before the gradient norm made a 1-GPU update slower
    (30.7-31.0 against 31.9-32.2 updates/s): the host queued the gradient's gathering, unscaling and norm only after
    the backward had ended, where fairseq's path queues them behind the backward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._unchecked_grad_norm = None  # this rank's last gradient norm, checked across ranks with the next stats
        self._pending_skip = None  # (update number, pinned host flag, CUDA event): a step skipped on the GPU?

    def reads_nothing_per_update(self):
        """Whether `train_step` takes the path without host reads (module docstring): one process, no loss scaler,
        xmlm_adamw (which can skip a step on the GPU), no EMA or BMUF."""
        common = self.cfg.common
        return (self.data_parallel_world_size == 1 and not (common.fp16 or common.bf16 or common.amp) and not self.tpu
                and not self.cfg.ema.store_ema and not self.cfg.optimization.use_bmuf
                and isinstance(self.optimizer, XmlmAdamW))

    @metrics.aggregate("train")  # as fairseq's, for callers other than fairseq-train's loop (which opens it too)
    def train_step(self, samples, raise_oom=False):
        """fairseq's train_step for one process (`reads_nothing_per_update`), less its host reads: the same forward and
        backward passes, gradient scaling, clipping, step and logged statistics."""
        if not self.reads_nothing_per_update():
            return super().train_step(samples, raise_oom)
        self._set_seed()
        self.model.train()
        self.criterion.train()
        self.zero_grad()
        metrics.log_start_time("train_wall", priority=800, round=0)
        logging_outputs, sample_size = [], 0
        for sample in samples:
            sample, is_dummy_batch = self._prepare_sample(sample)
            _, size, logging_output = self.task.train_step(sample, self.model, self.criterion, self.optimizer,
                                                           self.get_num_updates(), ignore_grad=is_dummy_batch)
            logging_outputs.append(logging_output)
            sample_size += size
            if self.cuda and self.get_num_updates() == 0:
                torch.cuda.empty_cache()  # as fairseq's: after the first step, against fragmentation
        if is_dummy_batch:
            sample_size *= 0
        sample_size = sample_size.float() if torch.is_tensor(sample_size) else float(sample_size)

        self.optimizer.all_reduce_grads(self.model)  # one process: nothing to reduce, unless the model reduces
        self.optimizer.multiply_grads(1.0 / (sample_size or 1.0))
        # fairseq's clipping, not this class's, which brings the norm to the host
        grad_norm = Trainer.clip_grad_norm(self, self.cfg.optimization.clip_norm)
        self._raise_if_step_skipped()  # the previous update's flag: long computed, the GPU has this update queued
        if self.optimizer.skips_on_device:
            self._note_skip(self.optimizer.step_unless_nonfinite(grad_norm))
        else:  # on the CPU a host read costs no idle GPU
            if not torch.isfinite(grad_norm).all():
                raise FloatingPointError("gradients are Nan/Inf")
            self.task.optimizer_step(self.optimizer, model=self.model, update_num=self.get_num_updates())

        self.set_num_updates(self.get_num_updates() + 1)
        if self.cuda and self.cuda_env is not None:
            gb_used = torch.cuda.max_memory_allocated() / 1024 / 1024 / 1024
            torch.cuda.reset_peak_memory_stats()
            metrics.log_scalar("gb_free", self.cuda_env.total_memory_in_GB - gb_used, priority=1500, round=1,
                               weight=0)
        # fairseq's _reduce_and_log_stats, without its finiteness check and its read of the smoothed values
        metrics.log_speed("ups", 1.0, priority=100, round=2)
        metrics.log_scalar("gnorm", grad_norm, priority=400, round=3)
        clip_norm = self.cfg.optimization.clip_norm
        if clip_norm > 0:  # in place of fairseq's torch.where of two new_tensor()s, each a copy from the host
            metrics.log_scalar("clip", (grad_norm > clip_norm).to(grad_norm.dtype) * 100, priority=500, round=1)
        self.task.reduce_metrics(logging_outputs, self.get_criterion())
        metrics.log_stop_time("train_wall")
        return {"sample_size": sample_size}  # fairseq-train only asks whether the update happened (not None)

    def _note_skip(self, skipped):
        """Queue the copy of this update's skip flag to the host, to be read one update later."""
        if self._pending_skip is None:
            self._pending_skip = (0, torch.zeros(1, pin_memory=True), torch.cuda.Event())
        _, host, event = self._pending_skip
        host.copy_(skipped, non_blocking=True)
        event.record()
        self._pending_skip = (self.get_num_updates() + 1, host, event)

    def _raise_if_step_skipped(self):
        if self._pending_skip is None or not self._pending_skip[0]:
            return
        update, host, event = self._pending_skip
        event.synchronize()  # waits for that copy only, not for the work queued after it
        if host.item():
            raise FloatingPointError(f"gradients are Nan/Inf at update {update}: its step was skipped on the GPU "
                                     "(xmlm-train checks one update late, without fairseq's NanDetector rerun)")
        self._pending_skip = (0, host, event)

    def save_checkpoint(self, filename, extra_state):
        self._raise_if_step_skipped()
        return super().save_checkpoint(filename, extra_state)

    def _aggregate_logging_outputs(self, logging_outputs, *extra_stats_to_sum, ignore=False):
        # In train_step (the model in training mode; valid_step evaluates) this follows the update's last backward:
        # the flat gradient's all-reduce is queued behind that backward, before the statistics' collective.
        if self.model.training:
            start_gradient_all_reduce(self.optimizer, self.model)
        return super()._aggregate_logging_outputs(logging_outputs, *extra_stats_to_sum, ignore=ignore)

    def _fast_stat_sync_sum(self, logging_outputs, *extra_stats_to_sum, ignore=False):
        values = {f"extra_stats_{i}": stat for i, stat in enumerate(extra_stats_to_sum)}
        log_keys = list(logging_outputs[0]) if logging_outputs else []
        for k in log_keys:
            if ignore:  # a dummy batch counts zero
                v = logging_outputs[0][k]
                v = torch.zeros_like(v) if torch.is_tensor(v) else 0
            else:
                v = sum(log[k] for log in logging_outputs if k in log)
            values["logging_outputs_" + k] = v
        # fairseq calls this under DDP only: each rank puts its last gradient norm in its own slot
        pending = self._unchecked_grad_norm
        values["grad_norms"] = torch.zeros(self.data_parallel_world_size, dtype=torch.double)
        values["grad_norms"][self.data_parallel_rank] = 0.0 if pending is None else pending
        summed = sum_over_ranks(values, self.device, self.data_parallel_process_group)
        if pending is not None:
            check_consistent_grad_norms(summed["grad_norms"], amp=self.cfg.common.amp)
            self._unchecked_grad_norm = None
        stats = [summed[f"extra_stats_{i}"] for i in range(len(extra_stats_to_sum))]
        return ([{k: summed["logging_outputs_" + k] for k in log_keys}] if log_keys else []), stats

    def clip_grad_norm(self, clip_norm):
        # The host reads the norm right away in any case (fp16's loss scaler, fairseq's isfinite check); as a host
        # tensor, fairseq's meters need not read it again after the optimizer step.
        return super().clip_grad_norm(clip_norm).detach().cpu()

    def _check_grad_norms(self, grad_norm):
        # fairseq all-reduces the norm in a collective of its own and reads it back; it rides along in the next
        # update's statistics instead (_fast_stat_sync_sum).
        if self.data_parallel_world_size > 1:
            self._unchecked_grad_norm = float(grad_norm)


def main(cfg):
    """fairseq_cli.train.main with XmlmTrainer: module-level, so that fairseq's spawned workers find it by name."""
    from fairseq_cli import train as fairseq_train

    fairseq_train.Trainer = XmlmTrainer  # fairseq_cli.train builds its trainer from this module-level name
    logger.info("trainer: XmlmTrainer (under DDP the ranks meet once per update)")
    fairseq_train.main(cfg)


@cli_errors
def cli_main():
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_xmlm  # noqa: F401  (registers the plugin; --user-dir fairseq_xmlm works as well)

    # fairseq-train's log format. fairseq_cli.train sets it before importing fairseq; here the plugin's imports came
    # first, and one of fairseq's tasks had set up the root logger its own way.
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", datefmt="%Y-%m-%d %H:%M:%S",
                        level=os.environ.get("LOGLEVEL", "INFO").upper(), stream=sys.stdout, force=True)
    args = options.parse_args_and_arch(options.get_training_parser())
    distributed_utils.call_main(convert_namespace_to_omegaconf(args), main)


if __name__ == "__main__":
    cli_main()
