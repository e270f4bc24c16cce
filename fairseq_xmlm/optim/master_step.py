"""xmlm_adamw's `--fused-master-step`: one Triton kernel takes the flat low-precision gradient, applies AdamW to the
flat fp32 master weights and writes the low-precision weights the model reads.

Without it an update of `FlatMasterWeights` is six passes over the parameters after the gradients' gathering: the
gradient cast to fp32, multiplied by 1 / sample size, multiplied again when clipped, torch's fused AdamW, the master
cast back to bf16, and that copied into the parameters (1.3 ms an update at the Conneau config on an H200,
`docs/results/profile/`). Here the factors wait as a number and a GPU scalar until the step, the gradient's norm
is taken from the low-precision gradient (the same values), and the parameters are views of the weights the kernel
writes: one pass. For one process the kernel also reads each parameter's gradient where autograd left it
(`ParameterBlocks`: a table of the gradients' addresses), with no gathering copy into one flat gradient first: at
the Conneau config on an H200 the copy took 0.29 ms an update, and gather, norm and step 0.93 ms against 0.85 in
place (`benchmarks/master_step_speed.py`). The flat gradient stays for the all-reduce of several ranks.

The update is torch's AdamW (`torch.optim.AdamW`, decoupled weight decay; the paper of it: Loshchilov & Hutter 2019,
Algorithm 2), per element with the step count t after its increment:
    p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
    p <- p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
in fp32, b^t as exp2(t log2 b). Its state is torch's own (`step`, `exp_avg`, `exp_avg_sq` of the master tensor), so
checkpoints pass between the two paths. A step flagged as non-finite (the `found_inf` of `step_unless_nonfinite`)
changes nothing, the step count included, as in torch's fused kernel.
"""
import math

import torch

import triton
import triton.language as tl

BLOCK = 4096  # elements a program: 8 warps of 16-byte loads of fp32, four per thread
ALIGN = 8  # elements: what the parameters' places in the flat master must be multiples of to be read 16 bytes wide


@triton.jit
def _adamw_kernel(grad, master, exp_avg, exp_avg_sq, weights, factor_at, skip_at, step_at, size, scale, lr,
                  beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay, tensor_of_block, start_of_block,
                  tensor_offsets, tensor_sizes, BLOCK: tl.constexpr, FACTOR: tl.constexpr, SKIP: tl.constexpr,
                  GATHER: tl.constexpr, ALIGN: tl.constexpr):
    """`grad`: the flat gradient; with GATHER the table of each parameter's gradient address (int64), a program
    stepping block `start_of_block` of parameter `tensor_of_block`, which starts at `tensor_offsets` in the flat
    master."""
    if SKIP:
        if tl.load(skip_at) != 0:
            return
    numbers = (factor_at, step_at, scale, lr, beta1, beta2, log2_beta1, log2_beta2, eps, weight_decay)
    if GATHER:
        # The hints (true by `ParameterBlocks.fits`) and an unmasked full block let the loads and stores be 16 bytes
        # wide: the compiler cannot see it in numbers read from memory.
        block = tl.program_id(0)
        tensor = tl.load(tensor_of_block + block)
        start = tl.multiple_of(tl.load(start_of_block + block), BLOCK)
        local = start + tl.arange(0, BLOCK)
        at = tl.multiple_of(tl.load(tensor_offsets + tensor), ALIGN) + local
        grad_at = tl.multiple_of(tl.load(grad + tensor).to(tl.pointer_type(weights.dtype.element_ty)), 16) + local
        tensor_size = tl.load(tensor_sizes + tensor)
        if start + BLOCK <= tensor_size:
            _adamw_elements(grad_at, at, tl.full([BLOCK], 1, tl.int1), master, exp_avg, exp_avg_sq, weights, *numbers,
                            FACTOR)
        else:
            _adamw_elements(grad_at, at, local < tensor_size, master, exp_avg, exp_avg_sq, weights, *numbers, FACTOR)
    else:
        at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        _adamw_elements(grad + at, at, at < size, master, exp_avg, exp_avg_sq, weights, *numbers, FACTOR)


@triton.jit
def _adamw_elements(grad_at, at, inside, master, exp_avg, exp_avg_sq, weights, factor_at, step_at, scale, lr, beta1,
                    beta2, log2_beta1, log2_beta2, eps, weight_decay, FACTOR: tl.constexpr):
    """The update of the elements `at` of the flat tensors, where `inside`."""
    g = tl.load(grad_at, mask=inside, other=0.0).to(tl.float32) * scale
    if FACTOR:
        g = g * tl.load(factor_at).to(tl.float32)
    p = tl.load(master + at, mask=inside, other=0.0)
    m = tl.load(exp_avg + at, mask=inside, other=0.0)
    v = tl.load(exp_avg_sq + at, mask=inside, other=0.0)
    t = tl.load(step_at).to(tl.float32)
    step_size = lr / (1.0 - tl.exp2(t * log2_beta1))
    root_correction2 = tl.sqrt(1.0 - tl.exp2(t * log2_beta2))
    p = p * (1.0 - lr * weight_decay)
    m = beta1 * m + (1.0 - beta1) * g
    v = beta2 * v + (1.0 - beta2) * g * g
    p = p - step_size * m / (tl.sqrt(v) / root_correction2 + eps)
    tl.store(master + at, p, mask=inside)
    tl.store(exp_avg + at, m, mask=inside)
    tl.store(exp_avg_sq + at, v, mask=inside)
    tl.store(weights + at, p.to(weights.dtype.element_ty), mask=inside)


class ParameterBlocks:
    """Where the parameters of a flat master lie in it, in blocks of BLOCK elements for `_adamw_kernel`'s GATHER
    programs (one block never spans two parameters), and the device tables of their gradients' addresses."""

    @staticmethod
    def fits(sizes):
        """Whether the gathering programs can read and write 16 bytes at a time: every parameter but the last a
        multiple of ALIGN elements (else at half the rate, slower than gathering: 1.14 against 0.57 ms at the Conneau
        config on an H200). Our models' parameters are multiples of their width but the output biases, one a
        dictionary (the last parameter in the Default row; with --sep-emb the first language's is not)."""
        return all(n % ALIGN == 0 for n in sizes[:-1])

    def __init__(self, sizes, device):
        counts = torch.tensor([triton.cdiv(n, BLOCK) for n in sizes])
        self.programs = int(counts.sum())
        self.tensor_of_block = torch.repeat_interleave(torch.arange(len(sizes)), counts).int().to(device)
        self.start_of_block = torch.cat([torch.arange(c) * BLOCK for c in counts.tolist()]).to(device)
        sizes = torch.tensor(sizes)
        self.tensor_offsets = (sizes.cumsum(0) - sizes).to(device)
        self.tensor_sizes = sizes.to(device)
        self.device = device
        self._address_tables = {}

    @staticmethod
    def aligned(grads):
        """Whether every gradient starts on 16 bytes (the caching allocator's blocks do; a view need not)."""
        return all(g.data_ptr() % 16 == 0 for g in grads)

    def address_table(self, grads):
        """The gradients' addresses on the device. Autograd leaves them at the same addresses update after update
        (the CUDA graphs' memory, the caching allocator), so a table is made once per set of addresses, and copied
        from pinned memory without a wait on the GPU."""
        addresses = tuple(g.data_ptr() for g in grads)
        table = self._address_tables.get(addresses)
        if table is None:
            if len(self._address_tables) >= 4:
                self._address_tables.clear()
            host = torch.tensor(addresses, dtype=torch.int64)
            if self.device.type == "cuda":
                host = host.pin_memory()
            table = self._address_tables[addresses] = host.to(self.device, non_blocking=True)
        return table


def adamw_state(optimizer, master):
    """torch.optim.AdamW's state of `master`, made as its own first step would make it (a fused optimizer keeps the
    step count on the device) where it has none yet."""
    state = optimizer.state[master]
    if not state:
        on_device = optimizer.defaults.get("fused") or optimizer.defaults.get("capturable")
        state["step"] = torch.zeros((), dtype=torch.float32, device=master.device if on_device else "cpu")
        state["exp_avg"] = torch.zeros_like(master, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(master, memory_format=torch.preserve_format)
    return state


def fused_adamw_step(optimizer, master, grad, weights, scale=1.0, factor=None, skip=None, blocks=None):
    """One AdamW step of the fp32 tensor `master` (torch.optim.AdamW `optimizer`'s only parameter) from the
    low-precision gradient `grad` times `scale` (a number) and `factor` (a GPU scalar or None); writes the new master
    rounded to `weights`. `skip`: a scalar tensor, non-zero where the step must change nothing. `grad` is the flat
    gradient, or with `blocks` (`ParameterBlocks`) the list of the parameters' contiguous gradients, read in place."""
    group = optimizer.param_groups[0]
    if group.get("amsgrad") or group.get("maximize"):
        raise ValueError("the fused master step has no amsgrad or maximize")
    beta1, beta2 = group["betas"]
    state = adamw_state(optimizer, master)
    step = state["step"]
    if step.device != master.device:
        raise ValueError("the fused master step needs the step count beside the weights (torch's fused AdamW)")
    step.add_(1 if skip is None else 1 - skip.to(step.dtype))
    size = master.numel()
    if blocks is None:
        programs, tables = triton.cdiv(size, BLOCK), (master,) * 4  # the tables unread
    else:
        programs, grad = blocks.programs, blocks.address_table(grad)
        tables = (blocks.tensor_of_block, blocks.start_of_block, blocks.tensor_offsets, blocks.tensor_sizes)
    _adamw_kernel[(programs,)](
        grad, master, state["exp_avg"], state["exp_avg_sq"], weights,
        master if factor is None else factor, master if skip is None else skip, step, size,
        float(scale), float(group["lr"]), beta1, beta2, math.log2(beta1) if beta1 > 0 else -math.inf,
        math.log2(beta2) if beta2 > 0 else -math.inf, group["eps"], group["weight_decay"], *tables,
        BLOCK=BLOCK, FACTOR=factor is not None, SKIP=skip is not None, GATHER=blocks is not None, ALIGN=ALIGN,
        num_warps=8)
