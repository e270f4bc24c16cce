"""bf16 on the GPU without fairseq's `--bf16`.

fairseq's `--bf16` cannot run on a GPU: its option parser turns `--bf16` into `--tpu` (fairseq/options.py), and the
trainer then asks torch_xla for a device ('NoneType' object has no attribute 'xla_device'). It would also cast the
whole model, LayerNorms and softmax included, to bf16. Instead `partially_shared_roberta --amp-bf16` runs its
forward pass under autocast: matrix products and attention in bf16, parameters, optimizer state, LayerNorm and the
loss in fp32, no loss scaling needed (bf16 has fp32's exponent range). Use it with a plain fp32 optimizer, e.g.
`--optimizer xmlm_adamw`, and without `--fp16` / `--amp`.
"""
import torch


def allow_tf32():
    """fp32 matrix products with TF32 inputs (fp32 sums) on a GPU, for the rest of the process (`--tf32` options)."""
    torch.backends.cuda.matmul.allow_tf32 = True


def fp32_products(device):
    """What fp32 matrix products on `device` compute in: "tf32" on a GPU where `allow_tf32` allowed it, else "fp32"."""
    return "tf32" if device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32 else "fp32"


def bf16_autocast(device, enabled):
    """Autocast context: bf16 matrix work on `device` when enabled, a no-op otherwise."""
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=enabled)
