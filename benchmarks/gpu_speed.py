"""GPU throughput of stock fairseq RoBERTa vs `partially_shared_roberta`, in one device call.

    source .whl/install_on_device.sh && python3 benchmarks/gpu_speed.py --out $OUT [--sections single,strategies]

Every run is a real `python3 -m fairseq_cli.train` on the same card, one after another, with the same data and
batch; tokens/s is fairseq's own `wps` (averaged over the logged intervals after the first, which holds start-up
and compilation) and updates/s its `ups`. Sections:

- single:     Conneau config (8 layers, 768, 12 heads, 3072 FFN, 256 tokens, batch 96) and Dufter's BERT-small
              (12 layers, 64, 1 head, 256 FFN, 128 tokens, batch 256) on synthetic 32k-vocabulary data:
              stock `roberta` (--fp16, and fp32 for BERT-small) vs ours (--fp16 + xmlm_adamw; with its flat master
              weights, --memory-efficient-fp16, alone, with cuDNN's attention, with --compile and with its CUDA-graph
              mode; BENCH_VARIANTS picks, BENCH_BEFORE adds the runs of an earlier tree of this package).
              Prints the ratio to stock --fp16 and the model FLOPs utilisation (MFU).
- strategies: replacement-strategy cost vs plain masking: knn-replace (Fake-English, Bible, BERT-small) and
              within-language random words (Conneau config, Bible en-fr).
- multigpu:   fairseq's own DDP over NCCL on 1, 2, ... GPUs (--gpus), Conneau config, batch 96 per GPU:
              our variants (BENCH_MULTIGPU_KINDS; default our fastest, under xmlm-train; BENCH_BEFORE adds an earlier
              tree's) and stock, each kind as often as named there, launched by fairseq's spawn or by torchrun
              (BENCH_TORCHRUN="--numa-binding exclusive"), scaling efficiency = tokens/s(N) / (N x tokens/s(1)).
- alone:      Dufter's small run and BERT-base ("overparam") alone, updates/s.
- pack:       Dufter's small run packed N at a time on one GPU (fairseq_xmlm.gpu_pack): wall time, aggregate
              updates/s (start-up included, as in a real sweep).

Logs go to OUT/logs/<run>.log, the figures to OUT/summary.json (rewritten after every run, so a run cut off by
the time limit keeps what it measured). Stopped by SIGTERM (`timeout`), the script stops its fairseq-train run and
everything that started, then exits.
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
    workers started again) cost a 4-GPU run 0.16-0.27 s (docs/benchmarks.md, seventh session), and with a smaller
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
    under `timeout N python3 benchmarks/gpu_speed.py | grep ...` a surviving rank keeps the pipe open, and the
    device call then runs into its own limit with nothing sent back. A run still going after `time_limit` seconds
    (a hung rank) is stopped the same way and reported as RUN_TIMED_OUT; the script goes on with the next run.
    Once `done()` is true (the run logged the end of its training) the run has EXIT_GRACE_S seconds left: 1-GPU
    runs, compiled and stock, were seen to hang for 20 s and more on their way out (docs/benchmarks.md, tenth
    session)."""
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


def train_command(argv, updates, interval, launcher=PYTHON, module="fairseq_cli.train"):
    return [*launcher, "-m", module, *argv, "--max-update", str(updates), "--log-interval",
            str(interval), "--log-format", "json", "--no-save", "--disable-validation", "--seed", "1"]


def torchrun_launcher(gpus, options):
    """torchrun with `options` (e.g. "--numa-binding exclusive": each rank's threads on CPUs of its own, near its
    GPU), one process per GPU, in place of fairseq's own spawn; fairseq reads the ranks from torchrun's env."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(gpus),
            *options.split()]


def log_file_name(run):
    """A run's log file: its name with only letters, digits, "_", "-" and "." (the device machine does not send back
    files whose names hold "+" or "=", as the DDP variants' names do)."""
    return re.sub(r"[^\w.-]", "_", run) + ".log"


class Bench:
    def __init__(self, out):
        self.out = out
        self.logs = os.path.join(out, "logs")
        os.makedirs(self.logs, exist_ok=True)
        card = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        self.results = {"card": card, "gpus": torch.cuda.device_count(),
                        "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"), "runs": {}}
        self.peak = next((v for k, v in PEAK_FLOPS.items() if k in self.results["card"]), None)
        # BENCH_RUN_SECONDS: stop any one fairseq-train after this long (a hung DDP rank must not take the call)
        self.run_seconds = float(os.environ["BENCH_RUN_SECONDS"]) if os.environ.get("BENCH_RUN_SECONDS") else None

    def save(self):
        tmp = os.path.join(self.out, "summary.json.tmp")
        with open(tmp, "w") as f:
            json.dump(self.results, f, indent=1)
        os.replace(tmp, os.path.join(self.out, "summary.json"))

    def train(self, name, argv, updates, interval, model=None, vocab=SYNTH_VOCAB, env=None, gpus=1,
              launcher=PYTHON, module="fairseq_cli.train"):
        """One fairseq-train run (or `module`'s); records mean wps / ups over the intervals after the first."""
        cmd = train_command(argv, updates, interval, launcher, module)
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
    """Our runs of the single section by name: fp16 (fairseq's --fp16 loss scaling, fp32 master weights in
    FP16Optimizer); flat master (xmlm_adamw keeps them flat, --memory-efficient-fp16) alone, with cuDNN's attention,
    with --compile in the default mode and in reduce-overhead (CUDA graphs), and CUDA graphs with cuDNN's attention;
    bf16 (`--amp-bf16`: autocast re-casts every weight and activation each step, slower than --fp16 here); and the
    CUDA graphs with cuDNN's attention under xmlm-train (`XMLM_TRAIN`: its DDP ranks meet once per update)."""
    def swap(argv):  # the plugin from user_dir
        return [user_dir if a == "fairseq_xmlm" else a for a in argv]

    flat = swap(FLAT_MASTER)
    fastest = flat + ["--compile", "--compile-mode", "reduce-overhead", "--cudnn-attention"]
    return {"fp16": swap(FAST), "fp16_flat_master": flat,
            "fp16_flat_master_cudnn": flat + ["--cudnn-attention"],
            "fp16_flat_master_compile": flat + ["--compile"],
            "fp16_flat_master_cudagraphs": flat + ["--compile", "--compile-mode", "reduce-overhead"],
            "fp16_flat_master_cudagraphs_cudnn": fastest,
            "fp16_flat_master_cudagraphs_cudnn" + XMLM_TRAIN: fastest,
            "bf16": swap(OURS)}


def before_variants():
    """BENCH_BEFORE=DIR: `single_variants` of the fairseq_xmlm package in DIR (e.g. `git archive` of an earlier
    commit), named "before_<variant>"; none when it is not set."""
    before = os.environ.get("BENCH_BEFORE")
    if not before:
        return {}
    old = single_variants(os.path.join(os.path.abspath(before), "fairseq_xmlm"))
    # xmlm-train imports this tree's package, which fairseq will not load beside an earlier tree's as --user-dir
    return {f"before_{name}": argv for name, argv in old.items() if not name.endswith(XMLM_TRAIN)}


def section_single(b, synth):
    """Stock in fp16 (and fp32 for BERT-small), then our variants (`single_variants`) named in BENCH_VARIANTS
    (default: all but bf16 and xmlm-train's). BENCH_BEFORE=DIR also runs the fairseq_xmlm package in DIR (e.g.
    `git archive` of an earlier commit) with BENCH_BEFORE_VARIANTS (default fp16_flat_master): a before/after pair of
    one call.
    BENCH_MODELS=conneau (or bertsmall) runs one model only."""
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    known = single_variants()
    # xmlm-train runs one process with fairseq's own trainer: on one GPU its variant would time the same code again
    default = [name for name in known if name != "bf16" and not name.endswith(XMLM_TRAIN)]
    names = os.environ.get("BENCH_VARIANTS", ",".join(default)).split(",")
    before = before_variants()
    before_names = os.environ.get("BENCH_BEFORE_VARIANTS", "fp16_flat_master").split(",") if before else []
    unknown = sorted(set(names + before_names) - set(known))
    if unknown:
        raise SystemExit(f"gpu_speed: unknown variants {unknown}; BENCH_VARIANTS may hold {', '.join(known)}")
    runs = [(name, known[name]) for name in names]
    runs += [(f"before_{name}", before[f"before_{name}"]) for name in before_names]
    models = os.environ.get("BENCH_MODELS", "conneau,bertsmall").split(",")
    for prefix, model, stocks in (("conneau", CONNEAU, ["fp16"]), ("bertsmall", BERT_SMALL, ["fp32", "fp16"])):
        if prefix not in models:
            continue
        for precision in stocks:
            b.train(f"{prefix}_stock_{precision}", stock_args(synth, model) + (["--fp16"] if precision == "fp16" else []),
                    u, 50, model)
        for name, extra in runs:
            b.train(f"{prefix}_ours_{name}", ours_args(synth, model) + extra, updates_for(extra, u), 50, model,
                    module=entry_module(name))
            for precision in stocks:
                b.ratio(f"{prefix}_ours_{name} / {prefix}_stock_{precision}", f"{prefix}_ours_{name}",
                        f"{prefix}_stock_{precision}")


def write_random_knn_table(data, path, k=10):
    """A neighbour table of the right vocabulary with random cross-language neighbours: costs what a real one
    costs (the masking path does not look at which neighbours they are)."""
    from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask
    from fairseq_xmlm.vocabulary import dictionary_fingerprint

    task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=data))
    v = task.english_size
    own = torch.randint(v, (v, k))
    neighbours = torch.cat([own + v, own])  # English rows point at Fake ids, Fake rows at English ids
    torch.save({"dict_size": len(task.dictionary), "dict_md5": dictionary_fingerprint(task.dictionary),
                "neighbours": neighbours}, path)


def section_strategies(b, fake_data, bible_data):
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    knn = os.path.join("/tmp", "xmlm-bench-knn.pt")
    write_random_knn_table(fake_data, knn)
    b.train("dufter_plain", dufter_args(fake_data), u + 150, 50, BERT_SMALL | {"tokens": 30}, vocab=FAKE_VOCAB)
    b.train("dufter_knn", dufter_args(fake_data, extra=["--knn-replace", "10", "--knn-table", knn]), u + 150, 50,
            BERT_SMALL | {"tokens": 30}, vocab=FAKE_VOCAB)
    b.ratio("dufter_knn / dufter_plain", "dufter_knn", "dufter_plain")
    bible = ours_args(bible_data, CONNEAU, langs="en,fr") + FAST
    b.train("bible_conneau_cross", bible, u, 50, CONNEAU)
    b.train("bible_conneau_within", bible + ["--random-replace", "within"], u, 50, CONNEAU)
    b.ratio("bible_conneau_within / bible_conneau_cross", "bible_conneau_within", "bible_conneau_cross")


def ddp_variants(text):
    """BENCH_DDP_VARIANTS: ";"-separated sets of extra arguments for our multi-GPU runs, one run per set, e.g.
    "--ddp-backend legacy_ddp;" (legacy_ddp, then the default pytorch_ddp) -> [(suffix, argv), ...]; a run's name
    carries its arguments ("_4gpu+ddp-backend=legacy_ddp"), the default's nothing."""
    variants = []
    for chunk in text.split(";"):
        argv = chunk.split()
        suffix = "".join(f"+{a.lstrip('-')}" if a.startswith("--") else f"={a}" for a in argv)
        variants.append((suffix, argv))
    return variants


def multigpu_runs(names, gpus, variants):
    """The multigpu section's runs in order, as (kind, repeat, GPUs, label, extra arguments): each kind on each GPU
    count, our kinds on more than one GPU once per DDP variant. A kind named again (to alternate runs within one
    call) is its repeat 2, 3, ..., labelled "_run2", "_run3", ...; its scaling is taken over its own 1-GPU run."""
    runs, seen = [], {}
    for kind in names:
        repeat = seen[kind] = seen.get(kind, 0) + 1
        for n in gpus:
            for suffix, extra in (variants if n > 1 and kind != "stock" else [("", [])]):
                label = f"{kind}_{n}gpu{suffix}" + (f"_run{repeat}" if repeat > 1 else "")
                runs.append((kind, repeat, n, label, extra))
    return runs


MULTIGPU_KINDS = "fp16_flat_master_cudagraphs_cudnn" + XMLM_TRAIN + ",stock"  # the fourteenth session's pair


def section_multigpu(b, synth, gpus):
    """BENCH_MULTIGPU_KINDS (default `MULTIGPU_KINDS`), run in that order: "stock" and any of our
    `single_variants` (e.g. fp16_flat_master_cudagraphs_cudnn); with BENCH_BEFORE=DIR also "before_<variant>", the
    fairseq_xmlm package in DIR. A kind may be named more than once (`multigpu_runs`). Each of our kinds runs on more
    than one GPU once per set of BENCH_DDP_VARIANTS (`ddp_variants`; default one run with fairseq's default,
    pytorch_ddp). BENCH_TORCHRUN="OPTIONS" launches every run of the section, one GPU included, with
    `torchrun OPTIONS` (`torchrun_launcher`), e.g. "--numa-binding exclusive"."""
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    torchrun = os.environ.get("BENCH_TORCHRUN")
    known = {"stock": stock_args(synth, CONNEAU) + ["--fp16"],
             **{name: ours_args(synth, CONNEAU) + extra
                for name, extra in {**single_variants(), **before_variants()}.items()}}
    names = os.environ.get("BENCH_MULTIGPU_KINDS", MULTIGPU_KINDS).split(",")
    if not set(names) <= set(known):
        raise SystemExit(f"gpu_speed: BENCH_MULTIGPU_KINDS may hold {', '.join(known)}; got {names}")
    runs = multigpu_runs(names, gpus, ddp_variants(os.environ.get("BENCH_DDP_VARIANTS", "")))
    for kind, _, n, label, extra in runs:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=",".join(map(str, range(n))), NCCL_NVLS_ENABLE="0")
        argv = known[kind] + ddp_arguments(n) + extra
        launcher = torchrun_launcher(n, torchrun) if torchrun is not None else PYTHON
        b.train(f"multi_{label}", argv, updates_for(known[kind], u), 50, CONNEAU, env=env, gpus=n, launcher=launcher,
                module=entry_module(kind))
    one_gpu = {(kind, repeat): label for kind, repeat, n, label, _ in runs if n == 1}
    for kind, repeat, n, label, _ in runs:
        if n == 1 or (kind, repeat) not in one_gpu:  # --gpus without 1: no scaling
            continue
        key = f"scaling {label} (tokens/s over {n} x 1gpu)"
        b.ratio(key, f"multi_{label}", f"multi_{one_gpu[kind, repeat]}")
        if key in b.results.get("ratios", {}):  # absent when a run failed
            b.results["ratios"][key] /= n
            b.save()
    for kind, _, n, label, _ in runs:
        if kind != "stock":  # against stock's first run on as many GPUs
            b.ratio(f"{label} / stock {n}gpu", f"multi_{label}", f"multi_stock_{n}gpu")


def section_alone(b, fake_data, updates):
    """Dufter's small run and BERT-base ("overparam") alone on the GPU: the baselines of the pack section."""
    b.train("pack_alone_small", dufter_args(fake_data), updates, 50, BERT_SMALL | {"tokens": 30}, vocab=FAKE_VOCAB)
    b.train("pack_alone_bertbase", dufter_args(fake_data, "xmlm_bert_base"), 300, 50, BERT_BASE | {"tokens": 30},
            vocab=FAKE_VOCAB)


def section_pack(b, fake_data, slots, runs, updates):
    from fairseq_xmlm.gpu_pack import run_packed

    cmd = [sys.executable, "-m", "fairseq_cli.train", *dufter_args(fake_data), "--max-update", str(updates),
           "--no-save", "--disable-validation", "--log-format", "json", "--log-interval", "100"]
    commands = [cmd + ["--seed", str(i + 1)] for i in range(runs)]
    started = time.perf_counter()
    walls = run_packed(commands, slots, os.path.join(b.logs, "pack"))
    wall = time.perf_counter() - started
    b.results["pack"] = {"runs": runs, "slots": slots, "updates_per_run": updates, "wall_s": round(wall, 1),
                         "aggregate_ups": runs * updates / wall, "run_wall_s": [round(w, 1) for w in walls],
                         "cmd": " ".join(commands[0][1:])}
    log(f"pack: {runs} runs x {updates} updates, {slots} slots: {wall:.0f}s, {runs * updates / wall:.1f} updates/s")
    b.save()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sections", default="single,strategies")
    parser.add_argument("--gpus", default="1,2,4", help="GPU counts for the multigpu section")
    parser.add_argument("--fake-data", default="data-bin/fake_english")
    parser.add_argument("--bible-data", default="data-bin/bible_en_fr")
    parser.add_argument("--pack-slots", type=int, default=12)
    parser.add_argument("--pack-runs", type=int, default=12)
    parser.add_argument("--pack-updates", type=int, default=700)
    args = parser.parse_args()
    b = Bench(args.out)
    log(f"card {b.results['card']} x {b.results['gpus']}, torch {torch.__version__}")
    synth = write_synthetic(SYNTH_DIR)
    sections = args.sections.split(",")
    if "single" in sections:
        section_single(b, synth)
    if "strategies" in sections:
        section_strategies(b, args.fake_data, args.bible_data)
    if "multigpu" in sections:
        section_multigpu(b, synth, [int(g) for g in args.gpus.split(",")])
    if "alone" in sections:
        section_alone(b, args.fake_data, args.pack_updates)
    if "pack" in sections:
        section_pack(b, args.fake_data, args.pack_slots, args.pack_runs, args.pack_updates)
    print(json.dumps(b.results, indent=1))


if __name__ == "__main__":
    main()
