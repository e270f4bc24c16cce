"""The speed paths give the plain path's results: compiled layers, bf16 autocast, xmlm_adamw (and its flat fp32
master weights under --memory-efficient-fp16), sync-free embedding lookup, the GPU packer, and one batch iterator
(with its workers) for the whole run. All on the CPU (the GPU figures are in docs/performance.md)."""
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
from argparse import Namespace

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.optim import FP16Optimizer, MemoryEfficientFP16Optimizer, build_optimizer
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend

from conftest import TIMEOUT, fairseq_train
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.models.partially_shared_roberta import (
    PartiallySharedRoberta,
    PartiallySharedRobertaConfig,
    lookup_by_language,
    route_by_language,
    run_layers,
)
from fairseq_xmlm.optim.xmlm_adamw import XmlmAdamWConfig, parse_betas
from fairseq_xmlm.packed.processes import Job, run_jobs

V, T = 48, 10


class Task:
    langs = ("a", "b")
    lang_pos = True

    def __init__(self):
        self.dictionary = Dictionary()
        for i in range(V - len(self.dictionary)):
            self.dictionary.add_symbol(f"w{i}")

    def max_positions(self):
        return T


def make_model(**overrides):
    cfg = PartiallySharedRobertaConfig(encoder_layers=2, encoder_embed_dim=16, encoder_ffn_embed_dim=32,
                                       encoder_attention_heads=2, dropout=0.0, attention_dropout=0.0, **overrides)
    torch.manual_seed(0)
    return PartiallySharedRoberta.build_model(cfg, Task())


def inputs():
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(4, V, (4, T), generator=generator)
    tokens[1, -3:] = Task().dictionary.pad()
    return tokens, torch.tensor([0, 1, 1, 0])


@pytest.mark.parametrize("mode, scope", [("default", "layer"), ("reduce-overhead", "layer"), ("default", "encoder")])
def test_compiled_layers_give_the_plain_outputs_and_gradients_in_fp32(mode, scope):
    plain, compiled = make_model(), make_model(compile=True, compile_mode=mode, compile_scope=scope)
    compiled.load_state_dict(plain.state_dict())
    tokens, langs = inputs()
    outputs = []
    for model in (plain, compiled):
        logits, _ = model(tokens, lang_ids=langs)
        logits.float().pow(2).mean().backward()
        outputs.append((logits, model.layers[0][0].ffn_in.weight.grad))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outputs[1][1], outputs[0][1], rtol=1e-4, atol=1e-6)
    assert (compiled.run_layers is run_layers) == (scope == "layer")  # the encoder's layers compiled as one


def test_amp_bf16_runs_matrix_work_in_bf16_and_keeps_fp32_weights_and_gradients():
    plain, amp = make_model(), make_model(amp_bf16=True)
    amp.load_state_dict(plain.state_dict())
    tokens, langs = inputs()
    reference, _ = plain(tokens, lang_ids=langs)
    logits, _ = amp(tokens, lang_ids=langs)
    assert logits.dtype == torch.bfloat16 and reference.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: the logits agree to a few percent of their spread, not exactly
    assert (logits.float() - reference).abs().max() < 0.05 * reference.std()
    torch.nn.functional.cross_entropy(logits.view(-1, V).float(), tokens.view(-1)).backward()
    assert all(p.dtype == torch.float32 for p in amp.parameters())
    assert amp.layers[0][0].ffn_in.weight.grad.dtype == torch.float32


def test_cudnn_attention_puts_cudnn_first_in_each_attention_call_only_and_changes_no_result(monkeypatch):
    plain, cudnn = make_model(), make_model(cudnn_attention=True)
    cudnn.load_state_dict(plain.state_dict())
    sdpa, seen = torch.nn.functional.scaled_dot_product_attention, []

    def recording_sdpa(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch._C._get_sdp_priority_order()[0]))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording_sdpa)
    tokens, langs = inputs()
    logits = [model(tokens, lang_ids=langs)[0] for model in (plain, cudnn)]
    flash, cudnn_first = int(SDPBackend.FLASH_ATTENTION), int(SDPBackend.CUDNN_ATTENTION)
    assert seen == [(False, flash)] * 2 + [(True, cudnn_first)] * 2  # 2 layers each
    assert not torch.backends.cuda.cudnn_sdp_enabled() and torch._C._get_sdp_priority_order()[0] == flash
    torch.testing.assert_close(logits[1], logits[0], rtol=0, atol=0)  # on the CPU both are the math kernel


def test_lookup_by_language_equals_routing_with_the_same_gradients():
    tables = [torch.nn.Embedding(V, 8) for _ in range(2)]
    tokens, langs = inputs()
    results = []
    for select in (lambda: lookup_by_language(tables, langs, tokens),
                   lambda: route_by_language(tables, langs, 2, tokens)):
        for table in tables:
            table.zero_grad(set_to_none=True)
        out = select()
        out.pow(3).sum().backward()
        results.append((out, [t.weight.grad.clone() for t in tables]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    for got, want in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    # English rows never reach the second table's rows that only English uses
    english_only = set(tokens[langs == 0].flatten().tolist()) - set(tokens[langs == 1].flatten().tolist())
    assert all(torch.count_nonzero(results[0][1][1][i]) == 0 for i in english_only)


def adamw_reference(param, grads, lr, betas, eps, weight_decay):
    """Loshchilov & Hutter's AdamW written out: decoupled decay, bias-corrected moments."""
    p, m, v = param.clone(), torch.zeros_like(param), torch.zeros_like(param)
    for step, g in enumerate(grads, start=1):
        p = p * (1 - lr * weight_decay)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat, v_hat = m / (1 - betas[0] ** step), v / (1 - betas[1] ** step)
        p = p - lr * m_hat / (v_hat.sqrt() + eps)
    return p


@pytest.mark.parametrize("name", ["xmlm_adamw", "adam"])
def test_xmlm_adamw_and_fairseq_adam_follow_the_adamw_formula(name):
    cfg = OmegaConf.create({"_name": name, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-6, "weight_decay": 0.01,
                            "lr": [2e-3], **({"fused": True} if name == "xmlm_adamw" else {"tpu": False})})
    torch.manual_seed(0)
    start = torch.randn(5, 3)
    grads = [torch.randn(5, 3) for _ in range(4)]
    param = torch.nn.Parameter(start.clone())
    optimizer = build_optimizer(cfg, [param])
    for g in grads:
        param.grad = g.clone()
        optimizer.step()
    torch.testing.assert_close(param.data, adamw_reference(start, grads, 2e-3, (0.9, 0.98), 1e-6, 0.01),
                               rtol=1e-5, atol=1e-6)
    if name == "xmlm_adamw":  # on the CPU the fused kernel is not asked for; the GPU path is in the benchmark
        assert optimizer.optimizer.param_groups[0]["fused"] is False
        assert set(XmlmAdamWConfig.__dataclass_fields__) >= {"adam_betas", "adam_eps", "weight_decay", "lr"}


def fp16_training_cfg(flatten, fused_master_step=False):
    return OmegaConf.create({
        "optimizer": {"_name": "xmlm_adamw", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-6, "weight_decay": 0.01,
                      "lr": [2e-3], "fused": True, "fused_master_step": fused_master_step},
        "common": {"fp16_init_scale": 128, "fp16_scale_window": None, "fp16_scale_tolerance": 0.0,
                   "threshold_loss_scale": None, "min_loss_scale": 1e-4, "bf16": False, "model_parallel_size": 1,
                   "fp16_no_flatten_grads": not flatten},
        "optimization": {"update_freq": [1]},
        "distributed_training": {"distributed_world_size": 1},
    })


@pytest.mark.parametrize("fused_master_step", [False, True])
def test_memory_efficient_fp16_equals_fp16_with_flat_master_weights(fused_master_step):
    """--memory-efficient-fp16 (xmlm_adamw keeps the fp32 master copy itself, flat) takes the same steps as --fp16
    (fairseq's FP16Optimizer), loss scale, gradient norm and a step skipped on overflow included; with
    --fused-master-step (its kernel in Triton's interpreter) the same steps to fp32 rounding."""
    torch.manual_seed(0)
    shapes = [(5, 3), (7,), (2, 2, 2)]
    start = [torch.randn(shape).half() for shape in shapes]
    steps = [[torch.randn(shape).half() for shape in shapes] for _ in range(4)]
    steps[2][1][3] = float("inf")  # an overflow: both must skip this step and lower the loss scale
    results = []
    # FP16Optimizer flattens its fp32 copy only on CUDA: here it keeps one fp32 tensor per parameter
    for wrapper in (FP16Optimizer, MemoryEfficientFP16Optimizer):
        params = [torch.nn.Parameter(p.clone()) for p in start]
        flat = wrapper is MemoryEfficientFP16Optimizer
        optimizer = wrapper.build_optimizer(fp16_training_cfg(False, fused_master_step and flat), params)
        assert not flat or optimizer.wrapped_optimizer.fused_master_step == fused_master_step
        norms = []
        for grads in steps:
            optimizer.zero_grad()
            optimizer.backward(sum((p * g).sum() for p, g in zip(params, grads)))  # gradients g x the loss scale
            optimizer.multiply_grads(0.5)
            try:
                norms.append(float(optimizer.clip_grad_norm(0.0)))
            except OverflowError:  # what fairseq's trainer catches to skip the update
                norms.append(math.inf)
                continue
            optimizer.step()
        state = optimizer.state_dict()["state"]
        second_moments = torch.cat([state[i]["exp_avg_sq"].reshape(-1) for i in sorted(state)])
        results.append((params, norms, optimizer.scaler.loss_scale, second_moments))
    (fp16_params, fp16_norms, fp16_scale, fp16_moments), (flat_params, flat_norms, flat_scale, flat_moments) = results
    assert all(p.dtype == torch.float16 for p in flat_params)
    # the fused step: the factors multiplied together before the gradient, not one after the other, and its fp16
    # copy rounded toward zero by the interpreter: one unit in the last place apart at most
    exact = dict(rtol=2 ** -10, atol=1e-7) if fused_master_step else dict(rtol=0, atol=0)
    for expected, got in zip(fp16_params, flat_params):
        torch.testing.assert_close(got, expected, **exact)
    assert flat_scale == fp16_scale < 128 and math.isinf(flat_norms[2]) and math.isinf(fp16_norms[2])
    assert flat_norms == pytest.approx(fp16_norms, rel=1e-6)  # one norm over a flat tensor vs a norm of norms
    torch.testing.assert_close(flat_moments, fp16_moments, **(dict(rtol=1e-5, atol=1e-12) if fused_master_step
                                                               else exact))


def test_fairseq_train_with_flat_master_weights_logs_the_fp16_losses(fake_english_data, tmp_path):
    """The whole trainer (loss scaling in backward, gradient norm, checkpoint) with --memory-efficient-fp16 gives
    --fp16's losses, update for update (FP16Optimizer's fp32 copy is per parameter on the CPU)."""
    losses = []
    for name, precision in (("fp16", ["--fp16-no-flatten-grads"]), ("flat", ["--memory-efficient-fp16"])):
        log = fairseq_train(fake_english_data, tmp_path / name, "--task", "fake_english", "--optimizer", "xmlm_adamw",
                            "--fp16", *precision, updates=6)
        losses.append(re.findall(r"\bloss=([0-9.]+)", log))
    assert len(losses[0]) >= 6 and losses[1] == losses[0]
    assert (tmp_path / "flat" / "checkpoint_last.pt").exists()


@pytest.mark.parametrize("bad", ["0.9", "(0.9, 1.5)", "(a, b)"])
def test_bad_betas_are_one_clear_error(bad):
    with pytest.raises(XmlmError, match="--adam-betas"):
        parse_betas(bad)


def test_run_jobs_runs_everything_with_bounded_slots_and_names_failures(tmp_path):
    marker = tmp_path / "live"
    # each run records how many runs were alive at once through a shared counter file
    script = ("import os,sys,time,fcntl;p=sys.argv[1]\n"
              "def bump(d):\n f=open(p,'a+');fcntl.flock(f,fcntl.LOCK_EX);f.seek(0);n=int(f.read() or 0)+d;"
              "f.seek(0);f.truncate();f.write(str(n));f.close();return n\n"
              "n=bump(1);open(p+'.max','a').write(f'{n}\\n');time.sleep(0.3);bump(-1);sys.exit(int(sys.argv[2]))")
    jobs = [Job([sys.executable, "-c", script, str(marker), "0"]) for _ in range(5)]
    walls = run_jobs(jobs, slots=2, log_dir=tmp_path / "logs", poll_s=0.02)
    assert len(walls) == 5 and all(w >= 0.3 for w in walls)
    peaks = [int(x) for x in (tmp_path / "live.max").read_text().split()]
    assert len(peaks) == 5 and max(peaks) == 2
    (tmp_path / "live.max").unlink()
    run_jobs([Job(job.argv, cost=cost) for job, cost in zip(jobs, [.6, .6, .3, .3, .3])], slots=5,
             log_dir=tmp_path / "logs1", poll_s=0.02, capacity=1)
    peaks = [int(x) for x in (tmp_path / "live.max").read_text().split()]
    assert len(peaks) == 5 and max(peaks) == 2  # .6 + .3 fit in 1, nothing more does
    jobs[3] = Job([sys.executable, "-c", script, str(marker), "3"])
    with pytest.raises(XmlmError, match=r"1 of 5 packed runs failed; see .*3\.log"):
        run_jobs(jobs, slots=3, log_dir=tmp_path / "logs2", poll_s=0.02)


def test_run_jobs_spreads_runs_over_gpus_by_memory(tmp_path):
    """Each run sees one GPU; capacity holds per GPU: .6 + .3 fit on one, a second .6 goes to the other, and a
    fifth run (.5) fits nowhere until one of them has ended."""
    script = ("import os,sys,time;print(os.environ['CUDA_VISIBLE_DEVICES'], time.time());"
              "time.sleep(float(sys.argv[1]));print(time.time())")
    jobs = [Job([sys.executable, "-c", script, seconds], cost=cost)
            for seconds, cost in zip(("0.6", "0.6", "0.6", "0.6", "0"), (.6, .6, .3, .3, .5))]
    run_jobs(jobs, slots=8, log_dir=tmp_path, poll_s=0.02, capacity=1, devices=[0, 1])
    gpu, started, ended = zip(*((tmp_path / f"{i}.log").read_text().split() for i in range(5)))
    assert gpu[:4] == ("0", "1", "0", "1")
    assert float(started[4]) >= min(map(float, ended[:4]))  # timing-free: it waited for an end


def test_several_gpus_names_them_as_this_process_was_given_them(monkeypatch):
    """A job shown GPU "1" of a process that was given GPUs 4 and 5 would see the machine's second GPU, not its own:
    the names come from the inherited CUDA_VISIBLE_DEVICES."""
    import torch

    from fairseq_xmlm.packed.processes import several_gpus

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, 5")
    assert several_gpus() == ["4", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert several_gpus() == ["0", "1"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert several_gpus() is None  # one GPU: every job sees it


def test_run_jobs_puts_at_most_fills_per_gpu_runs_that_fill_one_on_it(tmp_path):
    """Runs that fill a GPU: at most fills_per_gpu of them at once on the one GPU, while the others start beside."""
    script = "import sys,time;print(time.time());time.sleep(float(sys.argv[1]));print(time.time())"
    for fills_per_gpu in (1, 2):
        logs = tmp_path / str(fills_per_gpu)
        jobs = [Job([sys.executable, "-c", script, seconds], cost=.1, fills_gpu=fills)
                for seconds, fills in zip(("0.5", "0.5", "0.5", "0"), (True, True, True, False))]
        run_jobs(jobs, slots=4, log_dir=logs, poll_s=0.02, capacity=1, fills_per_gpu=fills_per_gpu)
        started, ended = zip(*((float(t) for t in (logs / f"{i}.log").read_text().split()) for i in range(4)))
        waited = started[fills_per_gpu] >= min(ended[:fills_per_gpu])  # timing-free: it waited for an end
        assert waited and started[fills_per_gpu - 1] < ended[0]  # ... and the ones before it did not
        assert started[3] < ended[0]  # the run that does not fill the GPU did not wait


def test_run_jobs_runs_the_follow_ups_left_at_the_end_end_slots_at_a_time(tmp_path):
    """Once no command is left to run, the queued follow-ups start end_slots at a time instead of slots."""
    script = "import sys,time;print(time.time());time.sleep(0.4);print(time.time())"
    follow_ups = [[sys.executable, "-c", script] for _ in range(3)]
    run_jobs([Job([sys.executable, "-c", "pass"], then=follow_ups)], slots=1, log_dir=tmp_path, poll_s=0.02,
             end_slots=3)
    started, ended = zip(*((float(t) for t in (tmp_path / f"{i}.log").read_text().split()) for i in (1, 2, 3)))
    assert max(started) < min(ended)  # timing-free: all three ran at once, where slots=1 runs one at a time


def test_run_jobs_runs_follow_ups_of_successful_runs_first(tmp_path):
    """A job's `then` starts as soon as it succeeded, ahead of the queue; a failed job's follow-ups never start."""
    def printing(label, status=0):
        return [sys.executable, "-c", f"import sys,time;print('{label}', time.time());sys.exit({status})"]

    jobs = [Job(printing("train_a"), then=[printing("eval_a")]),
            Job(printing("train_b", status=1), then=[printing("eval_b")]), Job(printing("queued"))]
    with pytest.raises(XmlmError, match=r"1 of 4 packed runs failed; see .*1\.log"):
        run_jobs(jobs, slots=1, log_dir=tmp_path, poll_s=0.02)
    started = dict(p.read_text().split() for p in tmp_path.glob("*.log"))
    assert sorted(started, key=lambda label: float(started[label])) == ["train_a", "eval_a", "train_b", "queued"]


def test_run_jobs_runs_the_beside_follow_ups_while_other_runs_remain(tmp_path):
    """A job's `then_beside` replaces its `then` when it ends while other jobs are running or queued (an evaluation
    on the CPU while training goes on), and queues behind the jobs yet to start; the last job's follow-ups are its
    `then`."""
    def printing(label):
        return [sys.executable, "-c", f"import time;print('{label}', time.time())"]

    run_jobs([Job(printing(f"train_{x}"), then=[printing(f"gpu_eval_{x}")], then_beside=[printing(f"cpu_eval_{x}")])
              for x in "abc"], slots=1, log_dir=tmp_path, poll_s=0.02)
    started = dict(p.read_text().split() for p in tmp_path.glob("*.log"))
    assert sorted(started, key=lambda label: float(started[label])) == ["train_a", "train_b", "train_c",
                                                                        "gpu_eval_c", "cpu_eval_a", "cpu_eval_b"]


def test_run_jobs_passes_sigterm_on_and_stops(tmp_path):
    """SIGTERM to the packer reaches every running run (so a packed group can save its state), queued ones never
    start, and the packer ends with one error."""
    script = ("import signal,sys,time\n"
              "signal.signal(signal.SIGTERM, lambda *_: (print('saved state', flush=True), sys.exit(75)))\n"
              "print('started', flush=True); time.sleep(30)")
    jobs = [Job([sys.executable, "-c", script]) for _ in range(3)]

    def terminate_once_both_run():
        logs = [tmp_path / f"{i}.log" for i in (0, 1)]
        while not all(log.exists() and "started" in log.read_text() for log in logs):
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=terminate_once_both_run, daemon=True).start()
    with pytest.raises(XmlmError, match="stopped by SIGTERM: 2 runs were running, 1 had not started"):
        run_jobs(jobs, slots=2, log_dir=tmp_path, poll_s=0.02)
    assert [(tmp_path / f"{i}.log").read_text().split("\n")[:2] for i in (0, 1)] == [["started", "saved state"]] * 2
    assert not (tmp_path / "2.log").exists()


def test_run_jobs_stops_when_asked_as_on_sigterm(tmp_path):
    """stop() (from another thread, where SIGTERM cannot be caught) ends the packer as SIGTERM does."""
    script = ("import signal,sys,time\n"
              "signal.signal(signal.SIGTERM, lambda *_: (print('saved state', flush=True), sys.exit(75)))\n"
              "print('started', flush=True); time.sleep(30)")
    logs = [tmp_path / f"{i}.log" for i in (0, 1)]

    def both_started():
        return all(log.exists() and "started" in log.read_text() for log in logs)

    with pytest.raises(XmlmError, match="^stopped: 2 runs were running, 1 had not started"):
        run_jobs([Job([sys.executable, "-c", script]) for _ in range(3)], slots=2, log_dir=tmp_path, poll_s=0.02,
                 stop=both_started)
    assert [log.read_text().split("\n")[:2] for log in logs] == [["started", "saved state"]] * 2


EPOCHS_SCRIPT = """
import hashlib, json, sys
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask
task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=sys.argv[1], seed=1))
task.load_dataset("train")
dataset = task.datasets["train"]
iterators, epochs = set(), []
for epoch in (1, 2):  # what fairseq-train does per epoch: trainer.get_train_iterator(epoch), then next_epoch_itr
    iterator = task.get_batch_iterator(dataset, max_sentences=256, seed=1, num_workers=int(sys.argv[2]), epoch=epoch)
    iterators.add(id(iterator))
    epochs.append([(b["id"].tolist(), hashlib.md5(b["net_input"]["src_tokens"].numpy().tobytes()
                                                   + b["target"].numpy().tobytes()).hexdigest())
                   for b in iterator.next_epoch_itr(shuffle=True)])
print(json.dumps({"iterators": len(iterators), "items": len(dataset), "epochs": epochs}))
"""


def test_one_iterator_serves_every_epoch_with_new_batches_and_masks_whatever_the_workers(fake_english_data, tmp_path):
    """Persistent data-loader workers still see each new epoch; worker count changes nothing."""
    script = tmp_path / "epochs.py"
    script.write_text(EPOCHS_SCRIPT)
    runs = []
    for workers in (0, 2):
        result = subprocess.run([sys.executable, str(script), str(fake_english_data), str(workers)],
                                capture_output=True, text=True, timeout=TIMEOUT)
        assert result.returncode == 0, result.stderr[-2000:]
        runs.append(json.loads(result.stdout.splitlines()[-1]))
    assert runs[0] == runs[1]
    run = runs[0]
    assert run["iterators"] == 1  # reused: no new data-loader workers per epoch
    first, second = ([(frozenset(ids), digest) for ids, digest in epoch] for epoch in run["epochs"])
    for epoch in (first, second):
        assert sorted(i for ids, _ in epoch for i in ids) == list(range(run["items"]))
    # New batches: only batches of (length, language) groups too small to shuffle may come back whole ...
    same_batches = {ids for ids, _ in first} & {ids for ids, _ in second}
    assert len(same_batches) < len(first) // 4
    # ... and even those get new masks.
    assert not {digest for _, digest in first} & {digest for _, digest in second}
