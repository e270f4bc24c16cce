"""bf16 on the GPU without fairseq's `--bf16`.

fairseq's `--bf16` cannot run on a GPU: its option parser turns `--bf16` into `--tpu` (fairseq/options.py), and the
trainer then asks torch_xla for a device ('NoneType' object has no attribute 'xla_device'). `partially_shared_roberta`
has two ways instead, both with fp32 optimizer state and no loss scaling (bf16 has fp32's exponent range):
- `--amp-bf16`: the forward pass under autocast: matrix products and attention in bf16, parameters, LayerNorm and
  the loss in fp32. Autocast casts every weight again at each step.
- `--bf16-params`: the model's parameters and activations in bf16, as `--fp16` keeps them in fp16 (LayerNorm
  computes in fp32 inside its kernel, the loss's log-softmax in fp32); `--optimizer xmlm_adamw` keeps their fp32
  master copy. Without a loss scaler, xmlm-train's trainer (`train.py`) can run an update with no host read.
Use either with `--optimizer xmlm_adamw` and without `--fp16` / `--amp`.
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
