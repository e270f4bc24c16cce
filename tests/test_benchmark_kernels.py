"""The benchmarks' kernel accounting (benchmarks/_kernels.py, for profile_step.py and packed_speed.py): kernel kinds,
the GPU's idle time charged to the host's phase and the per-step kernel table, on hand-made profiler events (the
profile itself needs a GPU)."""
import importlib.util
import os
from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

spec = importlib.util.spec_from_file_location(
    "_kernels", os.path.join(os.path.dirname(__file__), "..", "benchmarks", "_kernels.py"))
kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernels)


def kernel(name, start, end):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, is_user_annotation=False,
                           time_range=SimpleNamespace(start=start, end=end), device_time=end - start)


def annotation(name, start, end, device_type=DeviceType.CPU):
    return SimpleNamespace(name=name, device_type=device_type, is_user_annotation=True,
                           time_range=SimpleNamespace(start=start, end=end), device_time=end - start)


@pytest.mark.parametrize("name,kind", [
    ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, cutlass::half_t>>",
     "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
     "attention"),
    ("void cudnn::fusion::compute_dot_do_o_specialized<false, 64>(void const*, void const*, void*)", "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<false>(void const*, void*, unsigned int)", "attention"),
    ("nvjet_sm90_hsh_192x192_64x4_1x2_h_bz_coopB_bias_TNN", "matrix products"),
    ("void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<c10::Half>", "layer norm"),
    ("ncclDevKernel_AllReduce_Sum_f16_RING_LL", "all-reduce"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::Half>>", "other elementwise"),
])
def test_kernel_kinds(name, kind):
    assert kernels.kernel_kind(name) == kind


def test_idle_time_goes_to_the_innermost_open_phase():
    events = [
        annotation("train_step-7", 0, 100), annotation("forward", 5, 40), annotation("optimizer", 60, 90),
        annotation("train_step-7", 0, 100, DeviceType.CUDA),  # the GPU-side copy of an annotation: not a kernel
        kernel("gemm", 10, 20), kernel("gemm", 25, 30),  # 5 us idle inside forward
        kernel("gemm", 28, 45),  # overlaps the previous kernel: no idle time
        kernel("adam", 50, 55),  # 5 us idle from 45, inside train_step only
        kernel("adam", 70, 80),  # 15 us idle from 55, in train_step; optimizer opens at 60, after the gap began
        kernel("copy", 85, 95),  # 5 us inside optimizer
        kernel("gemm", 101, 102),  # 6 us from 95: optimizer has closed, train_step is open
        kernel("gemm", 120, 130),  # 18 us after every annotation closed
    ]
    assert kernels.idle_by_phase(events) == {"forward": 5, "train_step": 26, "optimizer": 5, "between steps": 18}
    assert kernels.kernel_times(events) == {"gemm": 43, "adam": 15, "copy": 10}


def test_all_reduce_time_not_hidden_behind_compute_kernels():
    events = [
        kernel("gemm", 0, 10), kernel("gemm", 8, 20),  # one stream's kernels may touch: 20 us of compute
        kernel("ncclDevKernel_AllReduce_Sum_f16_RING_LL", 15, 30),  # 5 us beside the gemm, 10 beyond it
        kernel("layer_norm", 25, 27),  # ... less the 2 us of this one
        kernel("ncclDevKernel_AllReduce_Sum_f16_RING_LL", 40, 44),  # alone
    ]
    assert kernels.stream_times(events) == (22, 19, 12)
    # a spinning NCCL kernel is not compute: the gaps around it are idle
    assert kernels.idle_by_phase(events) == {"between steps": 5}


def test_union_and_overlap_of_intervals():
    assert kernels.union([(5, 6), (0, 2), (1, 3)]) == [[0, 3], [5, 6]]
    assert kernels.overlap([[0, 3], [5, 6]], [[2, 5.5]]) == 1.5


def test_kernel_table_lists_every_kernel_per_step_longest_first(tmp_path):
    host_op = SimpleNamespace(name="aten::add_", device_time=0.0, device_type=DeviceType.CPU, is_user_annotation=False)
    events = [kernel("triton_poi_fused_add_0", 0, 100), host_op, kernel("nvjet_sm90_tst_gemm", 0, 900),
              kernel("triton_poi_fused_add_0", 200, 500)]
    kernels.write_kernel_table(events, 2, tmp_path / "kernels.tsv")
    lines = (tmp_path / "kernels.tsv").read_text().splitlines()
    assert lines == ["ms_per_step\tlaunches_per_step\tkind\tkernel",
                     "0.4500\t0.5\tmatrix products\tnvjet_sm90_tst_gemm",
                     "0.2000\t1\tcompiled (triton)\ttriton_poi_fused_add_0"]
