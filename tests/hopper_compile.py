"""Compiles the stacked encoder's attention kernels (`packed.attention_kernels`) for a Hopper GPU (sm_90) with
Triton's own ptxas, no GPU needed: what CI can check of the GPU's side (`test_short_attention.py` runs this in a
process without Triton's interpreter). Prints each kernel and its shared memory; fails on any compile error."""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fairseq_xmlm.packed import attention_kernels

TYPES = {"qkv": "*bf16", "bias": "*bf16", "out": "*bf16", "grad_out": "*bf16", "grad_qkv": "*bf16", "code": "*i8",
         "seed_at": "*i64", "lse": "*fp32", "kept": "*i32", "scale": "fp32", "rescale": "fp32"}  # the rest: i32

for kernel in (attention_kernels._attention_forward_kernel, attention_kernels._attention_backward_kernel):
    for block in (64, 128):  # rows of up to 64 tokens, and one sentence of up to 128
        constants = {"BLOCK": block, "HEAD": 64, "DROPOUT": True, "PRECISION": "tf32"}
        signature = {name: "constexpr" if name in constants else TYPES.get(name, "i32") for name in kernel.arg_names}
        source = ASTSource(fn=kernel, signature=signature,
                           constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()})
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 4 if block <= 64 else 8})
        print(f"{kernel.__name__} BLOCK={block}: sm_90, {compiled.metadata.shared} bytes of shared memory")
