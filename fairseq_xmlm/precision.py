"""bf16 on the GPU without fairseq's `--bf16`.

fairseq's `--bf16` cannot run on a GPU: its option parser turns `--bf16` into `--tpu` (fairseq/options.py), and the
trainer then asks torch_xla for a device ('NoneType' object has no attribute 'xla_device'). It would also cast the
whole model, LayerNorms and softmax included, to bf16. Instead `partially_shared_roberta --amp-bf16` runs its
forward pass under autocast: matrix products and attention in bf16, parameters, optimizer state, LayerNorm and the
loss in fp32, no loss scaling needed (bf16 has fp32's exponent range). Use it with a plain fp32 optimizer, e.g.
`--optimizer xmlm_adamw`, and without `--fp16` / `--amp`.
"""
import torch


def bf16_autocast(device, enabled):
    """Autocast context: bf16 matrix work on `device` when enabled, a no-op otherwise."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
