"""How fast is the stacked encoder's attention on the GPU: its Triton kernels against SDPA with the mask?

    python3 benchmarks/attention_speed.py --out DIR/attention

For Dufter's two model shapes as the recipe stacks them (3 BERT-base runs: 12 heads of 64; 11 BERT-small runs: one
head of 64), batches of 256 sentences of several lengths, each sentence a random number of real tokens (at least
one sentence full), q, k and v with a bias of each model's: forward + backward of one layer's attention in bf16,
with attention dropout 0.1 and without, timed with CUDA events over --repeats eager calls after a warm-up. Before
that, the same without dropout against SDPA in fp32: the largest difference of the output and of the gradients (q,
k, v and bias), relative to the largest value.
SDPA here is what the stacked encoder ran before on the GPU: `packed.stacked.sdpa_attention` (SDPA's
memory-efficient kernels with the mask). An eager call costs the host a few hundred microseconds,
so the short lengths time the host more than the kernels (`packed_speed.py steps` times them in the training step).
Prints a table and the ratio; writes DIR/attention_speed.json. Not a test.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

from _common import cuda_ms
from fairseq_xmlm.packed.attention_kernels import short_attention
from fairseq_xmlm.packed.stacked import attention_code, sdpa_attention

SHAPES = {"bert_base_x3": (3, 12, 768), "bert_small_x11": (11, 1, 64)}  # runs, heads, hidden size
LENGTHS = (12, 20, 29, 40, 64, 93, 128)


def inputs(runs, heads, dim, length, generator, dtype):
    sentences = runs * 256
    real = torch.randint(1, length + 1, (sentences,), generator=generator, device="cuda")
    real[0] = length
    keep = torch.arange(length, device="cuda") < real.unsqueeze(1)
    qkv = torch.randn(runs, 256 * length, 3 * dim, generator=generator, device="cuda", dtype=dtype)
    bias = torch.randn(runs, 3 * dim, generator=generator, device="cuda", dtype=dtype)
    return qkv.requires_grad_(), bias.requires_grad_(), attention_code(keep), int(keep.sum())


def relative(got, expected):
    return float((got.float() - expected).abs().max() / expected.abs().max())


def difference(qkv, bias, code, heads, function):
    """Largest differences of the output and of the gradients (q, k, v and bias) from SDPA in fp32, relative to its
    largest."""
    grad = torch.randn(qkv.shape[:-1] + (qkv.size(-1) // 3,), device="cuda")
    exact = (qkv.detach().float().requires_grad_(), bias.detach().float().requires_grad_())
    expected = sdpa_attention(*exact, code, heads, 0.0)
    expected_grads = torch.autograd.grad(expected, exact, grad)
    got = function(qkv, bias, code, heads, 0.0)
    got_grads = torch.autograd.grad(got, (qkv, bias), grad.to(qkv.dtype))
    return relative(got, expected), max(map(relative, got_grads, expected_grads))


def time_ms(qkv, bias, code, heads, function, dropout, repeats):
    grad = torch.randn(qkv.shape[:-1] + (qkv.size(-1) // 3,), device="cuda", dtype=qkv.dtype)
    return cuda_ms(lambda: torch.autograd.grad(function(qkv, bias, code, heads, dropout), (qkv, bias), grad),
                   repeats)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("attention_speed: needs a GPU")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    print(f"[attention_speed] {torch.cuda.get_device_name()}, bf16, forward + backward, dropout 0.1", flush=True)
    print("| shape | length | real tokens | SDPA ms | Triton ms | SDPA / Triton | without dropout: SDPA ms | Triton ms "
          "| out diff | grad diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (runs, heads, dim) in SHAPES.items():
        for length in LENGTHS:
            qkv, bias, code, real = inputs(runs, heads, dim, length, generator, torch.bfloat16)
            out_diff, grad_diff = difference(qkv, bias, code, heads, short_attention)
            sdpa_ms, triton_ms, sdpa_plain_ms, triton_plain_ms = (
                time_ms(qkv, bias, code, heads, function, dropout, args.repeats)
                for dropout in (0.1, 0.0) for function in (sdpa_attention, short_attention))
            row = {"shape": name, "length": length, "real_tokens": real, "rows_of_attention": code.size(0),
                   "sdpa_ms": sdpa_ms, "triton_ms": triton_ms, "ratio": sdpa_ms / triton_ms,
                   "sdpa_no_dropout_ms": sdpa_plain_ms, "triton_no_dropout_ms": triton_plain_ms,
                   "output_difference": out_diff, "gradient_difference": grad_diff}
            rows.append(row)
            print(f"| {name} | {length} | {real} | {sdpa_ms:.3f} | {triton_ms:.3f} | {row['ratio']:.2f}x | "
                  f"{sdpa_plain_ms:.3f} | {triton_plain_ms:.3f} | {out_diff:.1e} | {grad_diff:.1e} |", flush=True)
    (out / "attention_speed.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                                          "argv": sys.argv[1:]}, indent=1))


if __name__ == "__main__":
    main()
