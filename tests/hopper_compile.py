"""Compiles our Triton kernels for a Hopper GPU (sm_90) with Triton's own ptxas, no GPU needed: the stacked
encoder's attention (`packed.attention_kernels`), the residual step's dropout + LayerNorm
(`models.dropout_norm`), the feed-forward GELU (`models.bias_gelu`) and xmlm_adamw's master step
(`optim.master_step`). What CI can check of the GPU's side (`test_kernels_compile.py` runs this in a process
without Triton's interpreter). Prints each kernel and its shared memory; fails on any compile error."""
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from fairseq_xmlm.models import bias_gelu, dropout_norm
from fairseq_xmlm.optim import master_step
from fairseq_xmlm.packed import attention_kernels

POINTERS = {"code": "*i8", "seed_at": "*i64", "lse": "*fp32", "kept": "*i32", "mean": "*fp32", "rstd": "*fp32",
            "partial_bias": "*fp32", "partial_weight": "*fp32", "partial_norm_bias": "*fp32",
            "partials": "*fp32", "master": "*fp32", "exp_avg": "*fp32", "exp_avg_sq": "*fp32", "factor_at": "*fp32",
            "skip_at": "*fp32", "step_at": "*fp32"}  # the rest: *bf16
NUMBERS = {name: "fp32" for name in ("scale", "rescale", "eps", "lr", "beta1", "beta2", "log2_beta1", "log2_beta2",
                                     "weight_decay")}  # the rest: i32


def compile_for_hopper(kernel, constants, warps, pointers):
    """Every pointer on 16 bytes, as Triton's JIT specialises a kernel for torch's allocations (its integer arguments
    are left unspecialised); prints how many of its global loads are 16 bytes wide."""
    signature = {name: "constexpr" if name in constants else NUMBERS.get(name, "i32") for name in kernel.arg_names}
    signature.update({name: POINTERS.get(name, "*bf16") for name in pointers if name in signature})
    aligned = {(kernel.arg_names.index(name),): [["tt.divisibility", 16]] for name in pointers if name in signature}
    source = ASTSource(fn=kernel, signature=signature, attrs=aligned,
                       constexprs={(kernel.arg_names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    options = " ".join(f"{name}={value}" for name, value in constants.items()
                       if name in ("BLOCK", "TURNS", "PROGRAMS", "WIDE", "EVEN"))
    wide_loads = compiled.asm["ptx"].count("ld.global.v4")
    print(f"{kernel.__name__} {options}: sm_90, {compiled.metadata.shared} bytes of shared memory, "
          f"{wide_loads} 16-byte loads")


ATTENTION_POINTERS = ("qkv", "bias", "out", "grad_out", "grad_qkv", "code", "seed_at", "lse", "kept")
for kernel in (attention_kernels._attention_forward_kernel, attention_kernels._attention_backward_kernel):
    for block in (64, 128):  # rows of up to 64 tokens, and one sentence of up to 128
        compile_for_hopper(kernel, {"BLOCK": block, "HEAD": 64, "DROPOUT": True, "PRECISION": "tf32"},
                           4 if block <= 64 else 8, ATTENTION_POINTERS)

NORM_POINTERS = ("x", "bias", "residual", "weight", "norm_bias", "seed_at", "out", "summed", "mean", "rstd",
                 "grad_out", "grad_x", "grad_residual", "partial_bias", "partial_weight", "partial_norm_bias")
norm = {"BLOCK": 1024, "DROPOUT": True}  # the Conneau config's 768 wide rows
compile_for_hopper(dropout_norm._forward_kernel, dict(norm, ROWS=dropout_norm.FORWARD_ROWS),
                   dropout_norm.FORWARD_WARPS, NORM_POINTERS)
compile_for_hopper(dropout_norm._backward_kernel, dict(norm, ROWS=dropout_norm.BACKWARD_ROWS, TURNS=12),
                   dropout_norm.BACKWARD_WARPS, NORM_POINTERS)
compile_for_hopper(dropout_norm._sum_partials_kernel, {"PROGRAMS": 512, "COLUMNS": dropout_norm.SUM_COLUMNS}, 4,
                   ("partials", "grad_bias", "grad_weight", "grad_norm_bias"))

GELU_POINTERS = ("x", "bias", "out", "grad_out", "grad_x", "partial_bias")
gelu = {"ROWS": bias_gelu.ROWS, "COLUMNS": bias_gelu.COLUMNS}
for wide, even in ((False, True), (True, False)):  # the Conneau config's tiles; int64 offsets with masked edges
    compile_for_hopper(bias_gelu._gelu_forward_kernel, dict(gelu, WIDE=wide, EVEN=even), bias_gelu.WARPS,
                       GELU_POINTERS)
    compile_for_hopper(bias_gelu._gelu_backward_kernel, dict(gelu, TURNS=35, WIDE=wide), bias_gelu.WARPS,
                       GELU_POINTERS)

compile_for_hopper(master_step._adamw_kernel, {"BLOCK": master_step.BLOCK, "FACTOR": True, "SKIP": True}, 8,
                   ("grad", "master", "exp_avg", "exp_avg_sq", "weights", "factor_at", "skip_at", "step_at"))
