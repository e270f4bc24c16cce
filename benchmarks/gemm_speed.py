"""How long do a Conneau-config layer's matrix products take in a CUDA graph, under each of cuBLAS's settings, and
how many memsets does cuBLAS put between them?

    python3 benchmarks/gemm_speed.py --out DIR [--repeats 20] [--settings default,lt,...]

In the training step's timeline each cuBLAS product of the forward and of the input gradients comes after a 4-byte
memset of cuBLAS's own, about 0.6 ms an update with the gaps around them (`docs/performance.md`). Here one layer's 18
products (forward: Q, K, V with their biases, the attention's output, the two feed-forward ones; the same products'
input gradients and weight gradients), bf16, 24,576 tokens, are captured `--repeats` times in one CUDA graph and
replayed, timed with CUDA events; a replay under torch's profiler counts the graph's kernels and memsets. cuBLAS
reads its environment when torch makes its handle, so each setting runs in a process of its own:
- default: torch's defaults;
- lt: `TORCH_BLAS_PREFER_CUBLASLT=1`, every product through cuBLASLt;
- no_addmm_lt: `DISABLE_ADDMM_CUDA_LT=1`, the products with a bias through cuBLAS, not cuBLASLt;
- lt_workspace_0: `CUBLASLT_WORKSPACE_SIZE=0` (KiB), cuBLASLt without workspace;
- lt_all_workspace_0: both, every product through cuBLASLt without workspace;
- lt_workspace_0_after_init: `CUBLASLT_WORKSPACE_SIZE=0` set in the process after CUDA's initialisation and a
  cuBLAS product, before the first cuBLASLt one, as the model option `--cublaslt-no-workspace` sets it;
- lt_workspace_0_zero_bias: `CUBLASLT_WORKSPACE_SIZE=0`, and the three forward products without a bias (those
  whose bias our kernels add) given a zero one, so that they go through cuBLASLt too (statically scheduled kernels,
  no memset; slower here, and no faster in training: docs/performance.md);
- workspace_0: `CUBLAS_WORKSPACE_CONFIG=:0:0`, cuBLAS without workspace;
- tunableop: `PYTORCH_TUNABLEOP_ENABLED=1`, each product's algorithm picked by timing cuBLAS's and cuBLASLt's
  candidates in the warm-up calls before the capture.
Prints ms a layer's products and memsets a product; writes DIR/gemm_speed.json. Not a test.
"""
import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {"default": {}, "lt": {"TORCH_BLAS_PREFER_CUBLASLT": "1"}, "no_addmm_lt": {"DISABLE_ADDMM_CUDA_LT": "1"},
            "lt_workspace_0": {"CUBLASLT_WORKSPACE_SIZE": "0"},
            "lt_all_workspace_0": {"TORCH_BLAS_PREFER_CUBLASLT": "1", "CUBLASLT_WORKSPACE_SIZE": "0"},
            "lt_workspace_0_after_init": {},
            "lt_workspace_0_zero_bias": {"CUBLASLT_WORKSPACE_SIZE": "0"},
            "workspace_0": {"CUBLAS_WORKSPACE_CONFIG": ":0:0"},
            "tunableop": {"PYTORCH_TUNABLEOP_ENABLED": "1", "PYTORCH_TUNABLEOP_TUNING": "1",
                          "PYTORCH_TUNABLEOP_FILENAME": "/tmp/xmlm_tunableop%d.csv"}}
ROWS, DIM, FFN = 96 * 256, 768, 3072
PRODUCTS = 18


def layer_products(zero_bias=False):
    """One layer's 18 products as a function of no arguments, on tensors made once; with `zero_bias` the forward
    products without a bias get a zero one."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator(device="cuda").manual_seed(0)

    def tensor(*shape):
        return (torch.randn(*shape, generator=generator, device="cuda") * 0.05).bfloat16()
    x, hidden, grad_d, grad_f = tensor(ROWS, DIM), tensor(ROWS, FFN), tensor(ROWS, DIM), tensor(ROWS, FFN)
    square = [tensor(DIM, DIM) for _ in range(4)]
    bias = [tensor(DIM) for _ in range(3)]
    up, down = tensor(FFN, DIM), tensor(DIM, FFN)
    zeros_dim, zeros_ffn = (torch.zeros(n, device="cuda", dtype=torch.bfloat16) if zero_bias else None
                            for n in (DIM, FFN))

    def run():
        for weight, b in zip(square[:3], bias):
            F.linear(x, weight, b)  # Q, K, V
        F.linear(x, square[3], zeros_dim)  # the attention's output
        F.linear(x, up, zeros_ffn)
        F.linear(hidden, down, zeros_dim)
        for weight in square:  # input gradients
            grad_d @ weight
        grad_f @ up
        grad_d @ down
        for _ in square:  # weight gradients
            grad_d.t() @ x
        grad_f.t() @ x
        grad_d.t() @ hidden
    return run


def measure_here(repeats, setting):
    import torch
    from torch.profiler import ProfilerActivity, profile

    from _common import graph_ms
    from _kernels import is_kernel

    if setting == "lt_workspace_0_after_init":
        torch.cuda.init()
        ones = torch.ones(8, 8, device="cuda", dtype=torch.bfloat16)
        ones @ ones  # a cuBLAS product: its handle and workspace made
        os.environ["CUBLASLT_WORKSPACE_SIZE"] = "0"
    run = layer_products(zero_bias=setting.endswith("zero_bias"))
    ms = graph_ms(run, repeats)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if is_kernel(e)]
    memsets = sum("Memset" in e.name for e in events)
    kernels = [e for e in events if "Memset" not in e.name and "Memcpy" not in e.name]
    by_name = {}
    for e in kernels:  # GPU microseconds and calls of each kernel in the replay of one layer's products
        row = by_name.setdefault(e.name[:90], {"us": 0.0, "calls": 0})
        row["us"] += e.device_time
        row["calls"] += 1
    return {"ms_per_layer": ms, "memsets_per_product": memsets / PRODUCTS, "kernels": len(kernels),
            "kernels_by_name": by_name}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--settings", default=",".join(SETTINGS))
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child: measure here, print JSON
    args = parser.parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(measure_here(args.repeats, args.one)), flush=True)
        return 0
    if args.out is None:
        parser.error("--out is required")
    import torch
    if not torch.cuda.is_available():
        print("error: gemm_speed.py needs a CUDA GPU", file=sys.stderr)
        return 2
    names = args.settings.split(",")
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings {unknown}; known: {', '.join(SETTINGS)}")
    flops = 3 * 2 * ROWS * DIM * (4 * DIM + 2 * FFN)  # forward, input and weight gradients alike
    rows = {}
    for name in names:
        env = {**os.environ, **SETTINGS[name]}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", name, "--repeats",
                               str(args.repeats)], env=env, capture_output=True, text=True)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            rows[name] = {"env": SETTINGS[name], "failed": done.stderr[-2000:]}
            print(f"{name:16s} failed: {done.stderr.strip().splitlines()[-1:] or done.returncode}", flush=True)
            continue
        row = rows[name] = {"env": SETTINGS[name], **json.loads(line[len("RESULT "):])}
        row["tflop_per_s"] = flops / row["ms_per_layer"] / 1e9
        print(f"{name:16s} {row['ms_per_layer']:.3f} ms a layer's products ({row['tflop_per_s']:.0f} TFLOP/s), "
              f"{row['memsets_per_product']:.2f} memsets a product, {row['kernels']} kernels", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "repeats": args.repeats,
              "shape": {"rows": ROWS, "dim": DIM, "ffn": FFN}, "results": rows, "argv": sys.argv[1:]}
    (args.out / "gemm_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
