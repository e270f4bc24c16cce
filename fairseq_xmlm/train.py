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
"""
import logging
import os
import sys

import torch
from fairseq.distributed import utils as distributed_utils
from fairseq.trainer import Trainer

from fairseq_xmlm.errors import cli_errors
from fairseq_xmlm.optim.xmlm_adamw import start_gradient_all_reduce

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
    """fairseq's Trainer with one host wait per update under DDP (module docstring): its train_step is untouched;
    four of the helpers it calls are replaced.

    One process keeps fairseq's own path: there no rank waits for another, and on 4x H200 (2026-11-27, commit
    c863eb6) reading the statistics before the gradient norm made a 1-GPU update slower (30.7-31.0
    against 31.9-32.2 updates/s): the host queued the gradient's gathering, unscaling and norm only after the
    backward had ended, where fairseq's path queues them behind the backward."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._unchecked_grad_norm = None  # this rank's last gradient norm, checked across ranks with the next stats

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
