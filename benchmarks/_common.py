"""What the benchmark scripts share: launching a fairseq-train run in a process group of its own and stopping it
with everything it started (`run_child`), recording each run's tokens/s and updates/s (`Bench`), the runs'
arguments (stock fairseq's and ours, on synthetic data or Dufter's), and Dufter's recipe commands for packed runs.

Every script writes its figures to the folder given by --out; none is a test (the tests under tests/ check what the
scripts compute on the CPU, and tests/gpu/ the GPU paths' results).
"""
import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

# Dense bf16/fp16 tensor-core peak (NVIDIA datasheets, SXM parts); MFU is measured against it for every precision.
PEAK_FLOPS = {"H100": 989e12, "H200": 989e12}

SYNTH_VOCAB = 32000
SYNTH_DIR = "/tmp/xmlm-bench-synth"  # written once per machine by write_synthetic
FAKE_VOCAB = 3618  # data-bin/fake_english: 1808 English symbols + <mask>, doubled
CONNEAU = dict(layers=8, dim=768, heads=12, ffn=3072, tokens=256, batch=96)
BERT_SMALL = dict(layers=12, dim=64, heads=1, ffn=256, tokens=128, batch=256)
BERT_BASE = dict(layers=12, dim=768, heads=12, ffn=3072, tokens=128, batch=256)


def log(msg):
    print(f"[gpu-speed {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_synthetic(root, n_tokens=41_126_400, seed=0):
    """dict.txt with SYNTH_VOCAB symbols; ~Zipfian token stream as 30-token sentences, written twice: train.bin
    (stock masked_lm) and train.en.bin (our bilingual_mlm), plus a small valid split of each.

    The default size makes every batch full for both models on 1, 2 or 4 GPUs: 1,370,880 sentences of 30 tokens +
    </s> are 166,656 blocks of 255 tokens (+ <s>), 434 x 4 x 96. A compiled model then sees one batch shape only,
    where a short last batch would compile and record its graphs again inside the measured intervals. And a run of
    up to 434 updates stays in its first epoch on 4 GPUs too: an epoch boundary (a new batch iterator, its data
    workers started again) cost a 4-GPU run 0.16-0.27 s (2026-11-26, 4x H100, commit 24da3a4), and with a smaller
    set the 4-GPU runs would pay it four times as often as the 1-GPU runs they are compared with."""
    from fairseq.data import Dictionary, indexed_dataset

    os.makedirs(root, exist_ok=True)
    if os.path.exists(os.path.join(root, "done")):
        return root
    rng = np.random.default_rng(seed)
    d = Dictionary()
    for i in range(SYNTH_VOCAB - d.nspecial - 1):  # -1: the tasks add <mask>
        d.add_symbol(f"w{i}", n=SYNTH_VOCAB - i)
    d.save(os.path.join(root, "dict.txt"))
    ranks = np.arange(1, len(d) - d.nspecial + 1)
    p = 1.0 / ranks
    for split, size in (("train", n_tokens), ("valid", 100_000)):
        ids = rng.choice(ranks.size, size=size, p=p / p.sum()) + d.nspecial
        for name in (split, f"{split}.en"):
            builder = indexed_dataset.make_builder(os.path.join(root, f"{name}.bin"), impl="mmap",
                                                   vocab_size=len(d))
            for sentence in np.split(ids, np.arange(30, size, 30)):
                builder.add_item(torch.from_numpy(np.append(sentence, d.eos()).astype(np.int64)))
            builder.finalize(os.path.join(root, f"{name}.idx"))
    open(os.path.join(root, "done"), "w").close()
    return root


def train_flops_per_token(layers, dim, ffn, tokens, vocab, mask_prob=0.15, **_):
    """Model FLOPs of one training token (forward + backward = 3 x forward): the layers' matrix products,
    attention scores and values over `tokens` positions, and the LM head on the masked fraction only."""
    per_layer = 2 * (4 * dim * dim + 2 * dim * ffn) + 2 * 2 * tokens * dim
    head = mask_prob * 2 * (dim * dim + dim * vocab)
    return 3 * (layers * per_layer + head)


def parse_train_inner(path):
    """The json dicts of fairseq's `train_inner` log lines."""
    rows = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if "train_inner" in line and "{" in line:
                rows.append(json.loads(line[line.index("{"):]))
    return rows


RUN_TIMED_OUT = 124  # run_child's status for a run stopped at its time limit (as `timeout` reports it)
EXIT_GRACE_S = 15  # how long a run that has logged the end of its training may take to exit


def training_done(log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return "done training in" in f.read()


def run_child(cmd, log_file, env=None, preexec_fn=None, time_limit=None, done=None):
    """Exit status of `cmd`, run with its output to log_file in a process group of its own. SIGTERM or SIGINT to
    this script stops that whole group (fairseq-train, its DDP ranks, their data-loader workers) before exiting:
    under `timeout N python3 benchmarks/step_speed.py | grep ...` a surviving rank keeps the pipe open, and the
    pipeline then runs into its own limit with nothing printed. A run still going after `time_limit` seconds (a hung
    rank) is stopped the same way and reported as RUN_TIMED_OUT; the script goes on with the next run. Once `done()`
    is true (the run logged the end of its training) the run has EXIT_GRACE_S seconds left: 1-GPU runs, compiled and
    stock, were seen to hang for 20 s and more on their way out (2026-11-26, one H100, commit d7bec4d)."""
    child = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env, preexec_fn=preexec_fn,
                             start_new_session=True)
    stopped = []  # the signal, once this script is asked to stop
    terminated = []  # when the group was sent SIGTERM (asked to stop, or past the time limit)
    deadline = None if time_limit is None else time.monotonic() + time_limit

    def terminate():
        terminated.append(time.monotonic())
        _signal_group(child.pid, signal.SIGTERM)

    def stop(signum, _frame):  # only signals: waiting here would deadlock with the wait it interrupted
        stopped.append(signum)
        terminate()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            try:
                rc = child.wait(1)
                break
            except subprocess.TimeoutExpired:
                if done is not None and done():
                    grace_end = time.monotonic() + EXIT_GRACE_S
                    deadline = grace_end if deadline is None else min(deadline, grace_end)
                    done = None
                if not terminated and deadline is not None and time.monotonic() > deadline:
                    terminate()
                if terminated and time.monotonic() - terminated[0] > 10:  # SIGTERM ignored
                    _signal_group(child.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if terminated:
        _signal_group(child.pid, signal.SIGKILL)  # what of the group outlived its leader
    if stopped:
        raise SystemExit(128 + stopped[0])
    return RUN_TIMED_OUT if terminated else rc


def _signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the group is gone
        pass


def _out_of_files(log_path):
    with open(log_path, encoding="utf-8", errors="replace") as f:
        return "Too many open files" in f.read()


PYTHON = (sys.executable,)  # a run's launcher by default: fairseq-train in this Python, spawning its own DDP ranks


XMLM_TRAIN = "_xmlm_train"  # a variant named so runs `-m fairseq_xmlm.train` (xmlm-train: XmlmTrainer)


def entry_module(variant):
    """The module a variant's runs start: fairseq-train's, or xmlm-train's for the `XMLM_TRAIN` variants."""
    return "fairseq_xmlm.train" if variant.endswith(XMLM_TRAIN) else "fairseq_cli.train"


def train_command(argv, updates, interval, launcher=PYTHON, module="fairseq_cli.train", seed=1):
    return [*launcher, "-m", module, *argv, "--max-update", str(updates), "--log-interval",
            str(interval), "--log-format", "json", "--no-save", "--disable-validation", "--seed", str(seed)]


def torchrun_launcher(gpus, options):
    """torchrun with `options` (e.g. "--numa-binding exclusive": each rank's threads on CPUs of its own, near its
    GPU), one process per GPU, in place of fairseq's own spawn; fairseq reads the ranks from torchrun's env."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
            *options.split()]


def log_file_name(run):
    """A run's log file: its name with only letters, digits, "_", "-" and ".", a name every shell and file copy
    takes as it is (the DDP variants' names hold "+" and "=")."""
    return re.sub(r"[^\w.-]", "_", run) + ".log"


class Bench:
    """A benchmark's figures: fairseq-train runs one after another (`train`), each one's mean tokens/s and
    updates/s, and their ratios, written to summary.json in the --out folder after every run, so that a benchmark
    cut off keeps what it measured."""

    def __init__(self, out):
        self.out = out
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        self.results = {"card": card, "gpus": torch.cuda.device_count(),
                        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "runs": {}}
        self.peak = next((v for k, v in PEAK_FLOPS.items() if k in self.results["card"]), None)
        # BENCH_RUN_SECONDS: stop any one fairseq-train after this long (a hung DDP rank must not take the whole
        # benchmark's time)
        self.run_seconds = float(os.environ["BENCH_RUN_SECONDS"]) if os.environ.get("BENCH_RUN_SECONDS") else None

    def save(self):
        from fairseq_xmlm.io import write_json  # imported late: `packed_speed.py --plugin` loads another tree's

        write_json(os.path.join(self.out, "summary.json"), self.results)

    def train(self, name, argv, updates, interval, model=None, vocab=SYNTH_VOCAB, env=None, gpus=1,
              launcher=PYTHON, module="fairseq_cli.train", seed=1):
        """One fairseq-train run (or `module`'s); records mean wps / ups over the intervals after the first."""
        cmd = train_command(argv, updates, interval, launcher, module, seed)
        path = os.path.join(self.logs, log_file_name(name))
        started = time.perf_counter()
        with open(path, "w") as f:
            f.write(" ".join(cmd) + "\n")
            f.flush()
            rc = run_child(cmd, f, env, time_limit=self.run_seconds, done=lambda: training_done(path))
        result = {"timed_out": True} if rc == RUN_TIMED_OUT else {}
        if rc == RUN_TIMED_OUT and training_done(path):  # it trained to the end and hung on its way out
            result, rc = {"stopped_after_training": True}, 0
        if rc != 0 and _out_of_files(path):  # seen once with DDP's data-loader workers: say so, retry, hard limit
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            result["first_try"] = f"Too many open files with the open-file limit {soft}; retried with {hard}"
            log(f"{name}: {result['first_try']}")
            os.replace(path, path[:-len(".log")] + ".first_try.log")
            started = time.perf_counter()
            with open(path, "w") as f:
                rc = run_child(cmd, f, env, time_limit=self.run_seconds,
                               preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard)))
        rows = parse_train_inner(path)[1:]
        result.update({"cmd": " ".join(cmd[1:]), "rc": rc, "wall_s": round(time.perf_counter() - started, 1)})
        if rc == 0 and rows:
            result["wps"] = float(np.mean([float(r["wps"]) for r in rows]))
            result["ups"] = float(np.mean([float(r["ups"]) for r in rows]))
            if model and self.peak:
                flops = train_flops_per_token(vocab=vocab, **model)
                result["mfu"] = result["wps"] * flops / (self.peak * gpus)
        self.results["runs"][name] = result
        self.save()
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items() if k != "cmd"}
        log(f"{name}: {shown}")
        return result

    def ratio(self, key, num, den):
        runs = self.results["runs"]
        if "wps" in runs.get(num, {}) and "wps" in runs.get(den, {}):
            self.results.setdefault("ratios", {})[key] = runs[num]["wps"] / runs[den]["wps"]
            log(f"ratio {key} = {self.results['ratios'][key]:.3f}")
            self.save()


COMMON = ["--criterion", "masked_lm", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "20",
          "--total-num-update", "100000", "--dropout", "0.1", "--attention-dropout", "0.1", "--weight-decay", "0.01",
          "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--num-workers", "4"]
# ours: the host-sync-free criterion (target positions found by the collater) over COMMON's stock masked_lm
OURS = ["--user-dir", "fairseq_xmlm", "--optimizer", "xmlm_adamw", "--amp-bf16", "--criterion", "xmlm_masked_lm"]
FAST = ["--user-dir", "fairseq_xmlm", "--optimizer", "xmlm_adamw", "--fp16", "--criterion", "xmlm_masked_lm"]
# the same arithmetic, with xmlm_adamw's flat fp32 master weights in place of FP16Optimizer's per-parameter copies
FLAT_MASTER = FAST + ["--memory-efficient-fp16"]
# ours in fp32; with bf16 parameters, xmlm_adamw's flat fp32 master weights and no loss scaler (under xmlm-train, no
# host read)
XMLM_FP32 = ["--user-dir", "fairseq_xmlm", "--optimizer", "xmlm_adamw", "--criterion", "xmlm_masked_lm"]
BF16_PARAMS = XMLM_FP32 + ["--bf16-params"]
# CUDA graphs (each layer compiled in inductor's reduce-overhead mode) and cuDNN's attention: for one batch shape
CUDA_GRAPHS_CUDNN = ["--compile", "--compile-mode", "reduce-overhead", "--cudnn-attention"]


def stock_args(data, m):
    return [data, "--task", "masked_lm", "--sample-break-mode", "none", "--arch", "roberta_base",
            "--encoder-layers", str(m["layers"]), "--encoder-embed-dim", str(m["dim"]),
            "--encoder-ffn-embed-dim", str(m["ffn"]), "--encoder-attention-heads", str(m["heads"]),
            "--tokens-per-sample", str(m["tokens"]), "--max-positions", str(m["tokens"]),
            "--batch-size", str(m["batch"]), "--optimizer", "adam", "--lr", "1e-4", *COMMON]


def ours_args(data, m, langs="en"):
    return [data, "--task", "bilingual_mlm", "--langs", langs, "--arch", "partially_shared_roberta",
            "--encoder-layers", str(m["layers"]), "--encoder-embed-dim", str(m["dim"]),
            "--encoder-ffn-embed-dim", str(m["ffn"]), "--encoder-attention-heads", str(m["heads"]),
            "--tokens-per-sample", str(m["tokens"]), "--batch-size", str(m["batch"]), "--lr", "1e-4", *COMMON]


def dufter_args(data, model="xmlm_bert_small", extra=()):
    """Dufter & Schuetze's training setup: batch 256 sentences, AdamW lr 2e-3, wd .01, eps 1e-6, 50 warmup."""
    lr = "1e-4" if model == "xmlm_bert_base" else "2e-3"
    return [data, "--user-dir", "fairseq_xmlm", "--task", "fake_english", "--arch", model, "--criterion",
            "xmlm_masked_lm", "--batch-size", "256", "--tokens-per-sample", "128", "--optimizer", "xmlm_adamw",
            "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr", lr, "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", "50", "--total-num-update", "6900", "--fp16", "--num-workers", "2", *extra]


def ddp_arguments(gpus):
    """fairseq's own DDP over `gpus` GPUs (none for one GPU)."""
    return ["--distributed-world-size", str(gpus), "--ddp-backend", "pytorch_ddp"] if gpus > 1 else []


def updates_for(argv, updates):
    """A compiled run gets 100 more updates: its first logged interval, left out of the mean, holds compilation."""
    return updates + (100 if "--compile" in argv else 0)


def single_variants(user_dir="fairseq_xmlm"):
    """Our runs of step_speed.py's single section by name: fp16 (fairseq's --fp16 loss scaling, fp32 master weights in
    FP16Optimizer); flat master (xmlm_adamw keeps them flat, --memory-efficient-fp16) alone, with cuDNN's attention,
    with --compile in the default mode and in reduce-overhead (CUDA graphs), and CUDA graphs with cuDNN's attention;
    bf16 (`--amp-bf16`: autocast re-casts every weight and activation each step, slower than --fp16 here); the
    CUDA graphs with cuDNN's attention under xmlm-train (`XMLM_TRAIN`: its DDP ranks meet once per update); and the
    same with bf16 parameters (`--bf16-params`: no loss scaler, so xmlm-train's update reads nothing on the host),
    also compiled in inductor's max-autotune mode, and with our dropout + LayerNorm kernels (`--fused-dropout-norm`),
    then also our AdamW kernel (`--fused-master-step`), then also the encoder as one CUDA graph (`--compile-scope
    encoder`) or our GELU kernels (`--fused-bias-gelu`), these also with the encoder as one CUDA graph or with the
    residual's gradient added in the products (`--residual-grad-in-products`), and that also with cuBLASLt's
    statically scheduled kernels (`--cublaslt-no-workspace`), that also with Q, K and V from one product
    (`--one-qkv-product`) or with the encoder as one CUDA graph."""
    def swap(argv):  # the plugin from user_dir
        return [user_dir if a == "fairseq_xmlm" else a for a in argv]

    flat = swap(FLAT_MASTER)
    fastest = flat + CUDA_GRAPHS_CUDNN
    # inductor's max-autotune: CUDA graphs as reduce-overhead, and its Triton kernels (LayerNorm with residual and
    # dropout, GELU) and matrix products timed in several configurations before the run
    autotuned = ["--compile", "--compile-mode", "max-autotune", "--cudnn-attention"]
    fused_norm = swap(BF16_PARAMS) + CUDA_GRAPHS_CUDNN + ["--fused-dropout-norm"]
    return {"fp16": swap(FAST), "fp16_flat_master": flat,
            "fp16_flat_master_cudnn": flat + ["--cudnn-attention"],
            "fp16_flat_master_compile": flat + ["--compile"],
            "fp16_flat_master_cudagraphs": flat + ["--compile", "--compile-mode", "reduce-overhead"],
            "fp16_flat_master_cudagraphs_cudnn": fastest,
            "fp16_flat_master_cudagraphs_cudnn" + XMLM_TRAIN: fastest,
            "bf16": swap(OURS),
            "bf16_params_cudagraphs_cudnn" + XMLM_TRAIN: swap(BF16_PARAMS) + CUDA_GRAPHS_CUDNN,
            "bf16_params_autotune_cudnn" + XMLM_TRAIN: swap(BF16_PARAMS) + autotuned,
            "bf16_params_fused_norm_cudagraphs_cudnn" + XMLM_TRAIN: fused_norm,
            "bf16_params_fused_norm_step_cudagraphs_cudnn" + XMLM_TRAIN: fused_norm + ["--fused-master-step"],
            "bf16_params_fused_norm_step_encoder_graph_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--compile-scope", "encoder"],
            "bf16_params_fused_norm_step_gelu_cudagraphs_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu"],
            "bf16_params_fused_norm_step_gelu_encoder_graph_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu", "--compile-scope", "encoder"],
            "bf16_params_fused_norm_step_gelu_residual_cudagraphs_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu", "--residual-grad-in-products"],
            "bf16_params_fused_norm_step_gelu_residual_lt_static_cudagraphs_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu", "--residual-grad-in-products",
                              "--cublaslt-no-workspace"],
            "bf16_params_fused_norm_step_gelu_residual_lt_static_one_qkv_cudagraphs_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu", "--residual-grad-in-products",
                              "--cublaslt-no-workspace", "--one-qkv-product"],
            "bf16_params_fused_norm_step_gelu_residual_lt_static_encoder_graph_cudnn" + XMLM_TRAIN:
                fused_norm + ["--fused-master-step", "--fused-bias-gelu", "--residual-grad-in-products",
                              "--cublaslt-no-workspace", "--compile-scope", "encoder"]}


def before_variants():
    """BENCH_BEFORE=DIR: `single_variants` of the fairseq_xmlm package in DIR (e.g. `git archive` of an earlier
    commit), named "before_<variant>"; none when it is not set."""
    before = os.environ.get("BENCH_BEFORE")
    if not before:
        return {}
    old = single_variants(os.path.join(os.path.abspath(before), "fairseq_xmlm"))
    # xmlm-train imports this tree's package, which fairseq will not load beside an earlier tree's as --user-dir
    return {f"before_{name}": argv for name, argv in old.items() if not name.endswith(XMLM_TRAIN)}


def recipe_commands(ids, seeds, data, out, updates, knn_table, first_seed=0, multilinguality=False, schedule=None):
    """`python -m fairseq_xmlm.experiments.dufter full`'s fairseq-train commands of these run IDs and `seeds` seeds
    from the recipe's `first_seed`-th, under `schedule` (default: the recipe's default, whose batch size, clipping and
    learning-rate curve the sweep trains), capped at `updates` updates, without the multilinguality hook (the timing
    is of training) unless `multilinguality`, logs and checkpoints in out/ID/seedS."""
    from fairseq_xmlm.experiments.dufter.recipe import capped_command, scheduled
    from fairseq_xmlm.experiments.dufter.runs import DEFAULT_SCHEDULE, PRESETS, SCHEDULES, SEEDS

    schedule = schedule or DEFAULT_SCHEDULE
    if schedule not in SCHEDULES or SCHEDULES[schedule].clauses:
        raise SystemExit(f"error: schedule {schedule!r}: one of "
                         + ", ".join(name for name, spec in SCHEDULES.items() if not spec.clauses))
    preset = scheduled(PRESETS["full"], SCHEDULES[schedule])
    return [capped_command(run_id, seed, data, out / run_id / f"seed{seed}", preset, knn_table, updates,
                           multilinguality)
            for run_id in ids for seed in SEEDS[first_seed:first_seed + seeds]]


def cuda_ms(function, repeats, warmup=3):
    """GPU milliseconds a call of `function()`: CUDA events around `repeats` calls, after `warmup` calls and a wait for
    them."""
    for _ in range(warmup):
        function()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        function()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeats


def graph_ms(function, repeats):
    """GPU milliseconds a call: `repeats` calls in one CUDA graph, replayed 3 times after a warm-up replay. Unlike
    `cuda_ms`, the host's launches are not timed: a kernel of 50-100 us launched from Python one call at a time
    (with a custom op's or a compiled function's host work) times the host."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            function()  # compiles; and allocations of the pool's sizes
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeats):
            function()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 3 / repeats


def run_kernel_benchmark(doc, name, measure, argv=None, **fields):
    """A kernel benchmark's command line (`--out DIR`, `--repeats`): on a CUDA GPU, rows = measure(repeats) (a dict
    of rows by name), written with `fields`, the card and torch's version to DIR/<name>.json; exit status 2 with one
    error line elsewhere."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=100)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"error: {name}.py needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = measure(args.repeats)
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, **fields, "repeats": args.repeats,
              "results": rows, "argv": sys.argv[1:] if argv is None else list(argv)}
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    return 0


def synchronise(device):
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
