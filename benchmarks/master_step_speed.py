"""How long does `--fused-master-step` take an update at the Conneau config on the GPU, with the gradients gathered
into its flat gradient by a `torch.cat` and by one multi-tensor copy?

    python3 benchmarks/master_step_speed.py --out DIR [--repeats 100]

The parameters are the Conneau config's (8 layers of 768, feed-forward 3,072, the synthetic data's 32,000 words),
bf16, each gradient a tensor of its own as autograd leaves them. Each row is `repeats` calls captured in one CUDA
graph and replayed, timed with CUDA events (the host's launches are not in the figures). The rows:
- `gather`: the gradients copied into the flat gradient by a `torch.cat`; `gather, multi-tensor copy`: the same
  copies as one `torch._foreach_copy_` into views of the flat gradient (as `FlatMasterWeights` gathers them);
- `norm, flat`: the gradient's 2-norm that clipping takes, from the flat gradient;
- `step, flat`: our AdamW kernel reading the flat gradient;
- `update, flat` and `update, flat, multi-tensor copy`: gather, norm and step, what an update spends in them.
(Until the multi-tensor copy, the kernel could also read each gradient where autograd left it, through a table of
their addresses: 0.85 ms an update, against 0.77 with the multi-tensor copy; docs/performance.md.)
Prints a table; writes DIR/master_step_speed.json. Not a test.
"""
import sys

import torch

from _common import CONNEAU, SYNTH_VOCAB, graph_ms, run_kernel_benchmark
from fairseq_xmlm.optim.master_step import fused_adamw_step


def parameter_shapes(layers, dim, ffn, tokens, vocab, **_):
    """The shapes of a `partially_shared_roberta` model's parameters, Default row."""
    layer = [(3 * dim, dim), (3 * dim,), (dim, dim), (dim,), (dim,), (dim,),
             (ffn, dim), (ffn,), (dim, ffn), (dim,), (dim,), (dim,)]
    return [(vocab, dim), (tokens, dim), (dim,), (dim,)] + layer * layers + [(dim, dim), (dim,), (dim,), (dim,),
                                                                                  (vocab,)]


def measure(repeats):
    generator = torch.Generator(device="cuda").manual_seed(0)
    grads = [torch.randn(shape, generator=generator, device="cuda").bfloat16()
             for shape in parameter_shapes(vocab=SYNTH_VOCAB, **CONNEAU)]
    sizes = [g.numel() for g in grads]
    master = torch.randn(sum(sizes), generator=generator, device="cuda")
    flat = torch.empty_like(master, dtype=torch.bfloat16)
    weights = torch.empty_like(flat)
    optimizer = torch.optim.AdamW([master], lr=1e-4, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, fused=True)
    factor = torch.tensor(0.5, device="cuda")

    def gather():
        torch.cat([g.reshape(-1) for g in grads], out=flat)

    flat_views = [view.view_as(g) for view, g in zip(flat.split(sizes), grads)]

    def gather_multi_tensor():
        torch._foreach_copy_(flat_views, grads)

    def norm_flat():
        return torch.linalg.vector_norm(flat, dtype=torch.float32)

    def step_flat():
        fused_adamw_step(optimizer, master, flat, weights, 1e-3, factor)

    def update_flat():
        gather()
        norm_flat()
        step_flat()

    def update_flat_multi_tensor():
        gather_multi_tensor()
        norm_flat()
        step_flat()

    rows = {name: {"ms": graph_ms(function, repeats)} for name, function in (
        ("gather", gather), ("gather, multi-tensor copy", gather_multi_tensor), ("norm, flat", norm_flat),
        ("step, flat", step_flat), ("update, flat", update_flat),
        ("update, flat, multi-tensor copy", update_flat_multi_tensor))}
    # bytes an element: the step reads the bf16 gradient and 3 fp32 tensors, writes those and the bf16 weights
    moved = {"gather": 4, "gather, multi-tensor copy": 4, "norm, flat": 2, "step, flat": 28}
    for name, row in rows.items():
        if name in moved:
            row["tb_per_s"] = moved[name] * master.numel() / row["ms"] / 1e9
        rate = f"  {row['tb_per_s']:5.2f} TB/s" if name in moved else ""
        print(f"{name:32s} {row['ms'] * 1e3:7.1f} us{rate}", flush=True)
    return rows


def main(argv=None):
    return run_kernel_benchmark(__doc__, "master_step_speed", measure, argv, config="conneau", vocab=SYNTH_VOCAB,
                                timing="CUDA graph of repeats calls")


if __name__ == "__main__":
    sys.exit(main())
