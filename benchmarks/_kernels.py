"""torch.profiler's GPU kernels accounted: their time by kind of kernel (matrix products, attention, ...), the time
the GPU computes against the time NCCL's all-reduce kernels run beside no compute kernel, the GPU's idle time
charged to the host's phase, and a table of every kernel per step.
"""
import torch

KERNEL_KINDS = (  # (kind, substrings of kernel names), first match wins (flash kernels' names hold "cutlass")
    ("attention", ("flash", "fmha", "attention", "sdpa", "dot_do_o", "convert_dq")),  # the last two: cuDNN's backward
    ("matrix products", ("gemm", "nvjet", "cutlass", "sm90_xmma", "ampere_", "splitk")),
    ("all-reduce", ("nccl",)),
    ("optimizer", ("multi_tensor", "adam")),
    ("layer norm", ("layer_norm", "layernorm", "gammabeta")),
    ("dropout", ("dropout",)),
    ("softmax / loss", ("softmax", "nll_loss", "cross_entropy")),
    ("compiled (triton)", ("triton",)),
    ("copies and casts", ("copy", "catarray")),
    ("reductions", ("reduce",)),
)


def kernel_kind(name):
    lowered = name.lower()
    return next((kind for kind, keys in KERNEL_KINDS if any(key in lowered for key in keys)), "other elementwise")


def is_kernel(event):
    return event.device_type == torch.autograd.DeviceType.CUDA and not event.is_user_annotation


def kernel_times(events):
    """{kernel name: summed device us} over the GPU kernels of a profile (user annotations left out)."""
    times = {}
    for event in filter(is_kernel, events):
        times[event.name] = times.get(event.name, 0.0) + event.device_time
    return times


def is_all_reduce_kernel(event):
    return is_kernel(event) and kernel_kind(event.name) == "all-reduce"


def is_compute_kernel(event):
    """A kernel that is not NCCL's: an all-reduce kernel waiting for its peers occupies the GPU without working."""
    return is_kernel(event) and not is_all_reduce_kernel(event)


def union(spans):
    """The (start, end) spans merged into sorted, disjoint intervals."""
    merged = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def overlap(a, b):
    """Length of the intersection of two lists of sorted, disjoint intervals."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        total += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def stream_times(events):
    """(compute us, all-reduce us, exposed all-reduce us): the time at least one compute kernel runs, the time at
    least one NCCL kernel runs, and the part of the latter during which no compute kernel runs."""
    compute = union((e.time_range.start, e.time_range.end) for e in filter(is_compute_kernel, events))
    nccl = union((e.time_range.start, e.time_range.end) for e in filter(is_all_reduce_kernel, events))
    nccl_us = sum(end - start for start, end in nccl)
    return sum(end - start for start, end in compute), nccl_us, nccl_us - overlap(compute, nccl)


def idle_by_phase(events):
    """{phase: us}: the time between compute kernels, each gap charged to the innermost host-side annotation open
    when the gap began (fairseq's "forward", "backward", "clip-grads", "optimizer", ...; "train_step" for the
    trainer's own work, "between steps" for fairseq's loop: data loading and logging)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in filter(is_compute_kernel, events))
    notes = [(e.time_range.start, e.time_range.end, "train_step" if e.name.startswith("train_step-") else e.name)
             for e in events if e.device_type == torch.autograd.DeviceType.CPU and e.is_user_annotation]
    idle, busy_until = {}, spans[0][1] if spans else 0
    for start, end in spans[1:]:
        if start > busy_until:
            open_notes = [n for n in notes if n[0] <= busy_until < n[1]]
            phase = min(open_notes, key=lambda n: n[1] - n[0])[2] if open_notes else "between steps"
            idle[phase] = idle.get(phase, 0.0) + start - busy_until
        busy_until = max(busy_until, end)
    return idle


def write_kernel_table(events, steps, path):
    """Every kernel of the profiled steps: ms and launches per step, kind, name; the longest first."""
    times, launches = kernel_times(events), {}
    for event in filter(is_kernel, events):
        launches[event.name] = launches.get(event.name, 0) + 1
    rows = [f"{us / 1e3 / steps:.4f}\t{launches[name] / steps:g}\t{kernel_kind(name)}\t{name}"
            for name, us in sorted(times.items(), key=lambda kv: -kv[1])]
    path.write_text("ms_per_step\tlaunches_per_step\tkind\tkernel\n" + "\n".join(rows) + "\n")
