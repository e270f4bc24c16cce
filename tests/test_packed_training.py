"""Packed training (many Fake-English runs as one stacked model) against fairseq's own Trainer, on real batches."""
import copy
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, TIMEOUT, expect_cli_error
from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.dufter.figures import read_fairseq_log
from fairseq_xmlm.packed.__main__ import SUSPENDED, main
from fairseq_xmlm.packed.group import GroupData, PackedGroup
from fairseq_xmlm.packed.locks import take_gpu, take_warm_up
from fairseq_xmlm.packed.loop import train_group, train_groups
from fairseq_xmlm.packed.optim import AdamState
from fairseq_xmlm.packed.plan import SEPARATE_SEEDS_FROM, estimated_gpu_bytes, fills_gpu, grouped, lockstep_teams
from fairseq_xmlm.packed.processes import Job, train_side_by_side
from fairseq_xmlm.packed.runs import epoch_batches, parse_run, parse_runs
from fairseq_xmlm.packed.stacked import (StackedEncoder, attention_code, attention_mask, layer_function,
                                         sentences_per_row)
from fairseq_xmlm.packed.validation import BackgroundValidation, validate

TINY = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2"]


def command(data, tmp_path, name, seed, *extra, epochs=1):
    return ["fairseq-train", str(data), "--user-dir", str(REPO / "fairseq_xmlm"), "--task", "fake_english",
            "--arch", "xmlm_bert_small", *TINY, "--criterion", "masked_lm", "--optimizer", "adam",
            "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr", "2e-3", "--lr-scheduler", "polynomial_decay",
            "--warmup-updates", "2", "--total-num-update", "100", "--batch-size", "64", "--max-epoch", str(epochs),
            "--seed", str(seed), "--save-dir", str(tmp_path / name / "checkpoints"),
            "--log-file", str(tmp_path / name / "train.log"), "--max-valid-steps", "2", "--cpu", *extra]


def fairseq_samples(inputs, langs, positions, target_ids, slot, pad, has_padding=None, micro_batch=None):
    """The packed batch of one run as fairseq's samples, one per micro-batch of `micro_batch` rows (None: one for
    the batch), as fairseq's Trainer takes them for one update."""
    rows = inputs.size(1)
    step = micro_batch or rows
    return [fairseq_sample(inputs, langs, positions, target_ids, slot, pad, has_padding, range(i, min(i + step, rows)))
            for i in range(0, rows, step)]


def fairseq_sample(inputs, langs, positions, target_ids, slot, pad, has_padding=None, rows=None):
    """The packed batch of one run (its `rows`, default all) as fairseq's sample (its blank filler rows dropped);
    `has_padding` False as the --attend-padding collater gives it, which pads the batch to its own longest sentence
    only: the group's longer padding cut off."""
    tokens, lang_ids = inputs[slot], langs[slot]
    targets = torch.full_like(tokens, pad).view(-1)
    valid = target_ids[slot].ne(-100)
    targets[positions[slot][valid]] = target_ids[slot][valid]
    targets = targets.view_as(tokens)
    if rows is not None:
        tokens, lang_ids, targets = tokens[rows], lang_ids[rows], targets[rows]
    real = ~(tokens[:, 1:].eq(pad).all(dim=1) & targets.eq(pad).all(dim=1))  # blank rows: bos then padding only
    tokens, targets = tokens[real], targets[real]
    if has_padding is False:
        length = int(tokens.ne(pad).any(dim=0).sum())
        tokens, targets = tokens[:, :length], targets[:, :length]
    return {"id": torch.arange(int(real.sum())), "nsentences": int(real.sum()), "ntokens": int(tokens.ne(pad).sum()),
            "net_input": {"src_tokens": tokens, "lang_ids": lang_ids[real], "has_padding": has_padding},
            "target": targets}


def logits_alone(model, tokens, langs, positions, length=None, **forward):
    """One model's own logits at a stacked batch's `positions` (flat indices into its B*T), the model run on the
    first `length` columns of `tokens` (default: all of them)."""
    length = length or tokens.size(1)
    alone = model(tokens[:, :length], langs, features_only=True, **forward)[0]
    features = alone.new_zeros(*tokens.shape, alone.size(-1))
    features[:, :length] = alone
    return model.output_logits(features.reshape(-1, alone.size(-1))[positions], langs.new_zeros(positions.size(0)))


ONE_HEAD = ("--encoder-attention-heads", "1")  # BERT-small's: the stacked layer projects q, k, v in one product


@pytest.mark.parametrize("flags", [((), ()), (("--lang-pos",), ("--lang-pos",)), ((), ("--lang-pos",)),
                                   (ONE_HEAD, ONE_HEAD)], ids=["shared-positions", "lang-pos", "both", "one-head"])
def test_stacked_logits_equal_each_model(fake_english_data, tmp_path, flags):
    runs = [parse_run(command(fake_english_data, tmp_path, f"r{s}", s, *f)).build()
            for s, f in zip((1, 2), flags)]
    stacked = StackedEncoder([run.model for run in runs], torch.device("cpu"))
    group = GroupData(runs, torch.device("cpu"))
    schedules = [epoch_batches(run, 1) for run in runs]
    # the first batch whose sentences share rows of the attention, and the first whose sentences are too long to
    shares = {}
    for at in range(len(schedules[0])):
        rows, length, _, _ = group.plan([s[at] for s in schedules])
        shares.setdefault(sentences_per_row(rows.size, length) > 1, at)
    assert len(shares) == 2
    for at in shares.values():
        inputs, langs, positions, target_ids, _ = group.batch([s[at] for s in schedules],
                                                              torch.Generator().manual_seed(at))
        assert positions.size(1) % 64 == 0 or positions.size(1) == inputs[0].numel()  # few shapes: few CUDA graphs
        logits = stacked.masked_logits(inputs, langs, positions)
        for slot, run in enumerate(runs):
            run.model.eval()
            expected = logits_alone(run.model, inputs[slot], langs[slot], positions[slot])
            assert torch.allclose(logits[slot], expected, atol=1e-5)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the GPU's attention kernels (short_attention) need one"))])
def test_stacked_logits_of_attending_runs_see_their_own_padding_only(fake_english_data, tmp_path, device):
    """Two --attend-padding runs of other seeds stacked: where the group pads past a run's own longest sentence,
    the run's logits are still its model's alone on its own batch without an attention mask (as fairseq-train's
    collater pads it), on the CPU's SDPA and on the GPU's kernels."""
    device = torch.device(device)
    runs = [parse_run(command(fake_english_data, tmp_path, f"r{seed}", seed, "--attend-padding")).build()
            for seed in (1, 2)]
    for run in runs:
        run.model.to(device).eval()
    stacked = StackedEncoder([run.model for run in runs], device, attend_padding=[True, True])
    group = GroupData(runs, device)
    schedules = [epoch_batches(run, 1) for run in runs]
    pad = runs[0].task.dictionary.pad()
    padded_past = 0
    for step in range(4):
        inputs, langs, positions, target_ids, _ = group.batch([s[step] for s in schedules],
                                                              torch.Generator(device=device).manual_seed(step))
        with torch.no_grad():
            logits = stacked.masked_logits(inputs, langs, positions)
            for slot, run in enumerate(runs):
                own = int(inputs[slot].ne(pad).any(dim=0).sum())
                padded_past += own < inputs.size(-1)
                expected = logits_alone(run.model, inputs[slot], langs[slot], positions[slot], own, has_padding=False)
                targets = target_ids[slot].ne(-100)
                assert torch.allclose(logits[slot][targets], expected[targets], atol=1e-5)
    assert padded_past > 0


def test_a_packed_run_shifts_specials_after_masking_when_its_command_says_so(fake_english_data, tmp_path):
    """--shift-special-after-masking in a group beside a run without it: its rows' specials follow their content,
    as fairseq-train's batches give them (test_fake_english), and the other run's English rows keep English ones."""
    from test_fake_english import content_rule_holds

    runs = [parse_run(command(fake_english_data, tmp_path, f"r{s}", s, "--shift-special", *extra)).build()
            for s, extra in ((1, ("--shift-special-after-masking",)), (2, ()))]
    group = GroupData(runs, torch.device("cpu"))
    v, specials = runs[0].task.content_specials()
    schedules = [epoch_batches(run, 1) for run in runs]
    english_rows_shifted = plain_rows_shifted = 0
    for at in range(4):
        inputs, langs, _, _, _ = group.batch([s[at] for s in schedules], torch.Generator().manual_seed(at))
        fake_row = content_rule_holds(inputs[0], v, specials)
        english_rows_shifted += int(fake_row[langs[0] == 0].sum())
        plain_rows_shifted += int((inputs[1][langs[1] == 0, 0] >= v).sum())
    assert english_rows_shifted > 0 and plain_rows_shifted == 0


def test_short_sentences_share_attention_rows_as_if_alone():
    keep = torch.ones(8, 7, dtype=torch.bool)
    keep[1, 4:] = keep[6, 2:] = False  # padding
    assert sentences_per_row(8, 7) == 8 and sentences_per_row(6, 7) == 2 and sentences_per_row(8, 40) == 1
    code = attention_code(keep)
    assert code.shape == (1, 56) and code[0, 7:14].tolist() == [3, 3, 3, 3, 2, 2, 2]
    mask = attention_mask(code)
    assert mask.shape == (1, 1, 56, 56)
    assert mask[0, 0, 7, 7:11].all() and not mask[0, 0, 7, 11:14].any() and not mask[0, 0, 7, :7].any()
    q, k, v = torch.randn(3, 8, 2, 7, 16).unbind(0)  # (sentences, heads, length, head dim)
    alone = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.view(8, 1, 1, 7))
    shared = F.scaled_dot_product_attention(*(t.transpose(1, 2).reshape(1, 56, 2, 16).transpose(1, 2)
                                              for t in (q, k, v)), attn_mask=mask)
    assert torch.allclose(shared.transpose(1, 2).reshape(8, 7, 2, 16).transpose(1, 2), alone, atol=1e-6)


def test_packed_updates_equal_fairseq_trainer(fake_english_data, tmp_path):
    """Four updates of two packed runs (different seeds and flags, one with lang-pos's two extra weights) =
    fairseq's Trainer fed the same batches."""
    assert_packed_updates_equal_fairseq_trainer(fake_english_data, tmp_path, (), ("--shift-special", "--no-random",
                                                                                  "--lang-pos"))


def test_packed_updates_clip_each_runs_norm_as_fairseq_trainer(fake_english_data, tmp_path):
    """fairseq's --clip-norm in a packed group: each run's gradient clipped to its own norm (not the group's), as
    fairseq's Trainer clips it; the clip bites (gradient norms over it) in every update."""
    norms, _ = assert_packed_updates_equal_fairseq_trainer(fake_english_data, tmp_path, ("--clip-norm", "0.05"),
                                                           ("--clip-norm", "0.05", "--lang-pos"))
    assert min(norms) > 0.05


def test_packed_updates_attend_padding_as_fairseq_trainer(fake_english_data, tmp_path):
    """--attend-padding in a packed group beside a run that masks its padding: the one attends to its random
    mixed batch's padding, up to its own longest sentence, as fairseq's Trainer fed its own batch does without an
    attention mask; the other does not. Run b's longer batches pad the group further in some of the steps."""
    assert_packed_updates_equal_fairseq_trainer(fake_english_data, tmp_path, ("--attend-padding", "--lang-pos"), ())


def test_packed_runs_of_other_seeds_attend_to_their_own_padding_only(fake_english_data, tmp_path):
    """Two --attend-padding runs of other seeds stacked: a step pads to the longer of their random mixed batches,
    and each run still attends to its own batch's padding only, as fairseq's Trainer fed its own batch does."""
    _, lengths = assert_packed_updates_equal_fairseq_trainer(fake_english_data, tmp_path,
                                                             ("--attend-padding", "--lang-pos"), ("--attend-padding",))
    assert any(group > min(own) for group, own, _ in lengths)  # the group's padding reached past a run's own


def test_packed_micro_batches_attend_their_own_padding_as_fairseq_trainer(fake_english_data, tmp_path):
    """--update-freq 4 of micro-batches of 16 under --attend-padding, beside a run of batches of 64: each
    micro-batch's sentences attend to its own padding only, the update sums over the micro-batches, as fairseq's
    Trainer fed the four micro-batches in one update does; the epoch's short micro-batch comes last in its update."""
    _, lengths = assert_packed_updates_equal_fairseq_trainer(
        fake_english_data, tmp_path, ("--attend-padding", "--batch-size", "16", "--update-freq", "4"),
        ("--attend-padding",))
    assert all(len(micro[0]) == 4 and len(micro[1]) == 1 for _, _, micro in lengths)
    assert any(min(micro[0]) < own[0] for _, own, micro in lengths)  # a micro-batch padded less than its batch


def assert_packed_updates_equal_fairseq_trainer(data, tmp_path, flags_a, flags_b):
    """Four updates of runs a (seed 1) and b (seed 2) packed = fairseq's Trainer fed the same batches; returns the
    gradient norms fairseq's Trainer logged and, per step, the group's padded length and each run's own."""
    from fairseq import metrics
    from fairseq.trainer import Trainer

    runs = [parse_run(command(data, tmp_path, name, seed, *flags, "--dropout", "0",
                              "--attention-dropout", "0")).build()
            for name, seed, flags in (("a", 1, flags_a), ("b", 2, flags_b))]
    references = [Trainer(run.cfg, run.task, copy.deepcopy(run.model), run.criterion) for run in runs]
    group = PackedGroup(runs, torch.device("cpu"), precision="fp32")
    schedules = [epoch_batches(run, 1) for run in runs]
    pad = runs[0].task.dictionary.pad()
    # the last batch of run a (short) meets a full one of run b: blank filler rows must change nothing
    steps = [0, 1, 2, len(schedules[0]) - 1]
    references[0].begin_epoch(1), references[1].begin_epoch(1)
    norms, lengths = [], []
    for step in steps:
        losses, counts, batch = group.step([schedule[step] for schedule in schedules])
        lengths.append((batch[0].size(-1), [int(tokens.ne(pad).any(dim=0).sum()) for tokens in batch[0]],
                        [[int(tokens[i:i + (run.micro_batch or len(tokens))].ne(pad).any(dim=0).sum())
                          for i in range(0, len(tokens), run.micro_batch or len(tokens))]
                         for tokens, run in zip(batch[0], runs)]))
        for slot, (trainer, run) in enumerate(zip(references, runs)):
            has_padding = False if run.cfg.task.attend_padding else None
            with metrics.aggregate(new_root=True) as logged:
                log = trainer.train_step(fairseq_samples(*batch[:4], slot, pad, has_padding, run.micro_batch))
            norms.append(float(logged.get_smoothed_values()["gnorm"]))
            assert int(counts[slot]) == int(log["sample_size"])
            # fairseq logs the mean loss in base 2, rounded to 3 decimals
            assert float(losses[slot]) / float(counts[slot]) / np.log(2) == pytest.approx(float(log["loss"]), abs=1e-3)
    for slot, trainer in enumerate(references):
        packed = group.stacked.state_dict(slot)
        for name, value in trainer.model.named_parameters():
            assert torch.allclose(packed[name], value.detach(), atol=2e-6), name
    return norms, lengths


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_adam_state_steps_like_torch_adamw_for_xmlm_adamw(compile):
    """The one-pass step with torch's formula (xmlm_adamw) = torch.optim.AdamW's loop, with each run's gradients
    clipped as fairseq's --clip-norm does (a run's norm as clip_grad_norm_ takes it), and the bf16 copy it leaves
    behind, its gradients given in segments of columns; fairseq's formula is checked against fairseq's Trainer
    above."""
    torch.manual_seed(0)
    weights = torch.randn(3, 50)
    references = [row.clone().requires_grad_() for row in weights]
    flat, compute = weights.clone(), torch.zeros(3, 50, dtype=torch.bfloat16)
    segments = [(0, 20), (20, 21), (21, 50)]  # the norm that clips is over all of a run's segments
    adam = AdamState(flat, segments, (0.9, 0.98), 1e-6, 0.01, torch_style=True, clip_norm=2e-5,
                                     compute=compute, compile=compile)
    torch_adamw = torch.optim.AdamW(references, lr=1.0, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01,
                                    foreach=False)
    for lr in (1e-3, 5e-4, 2e-3):
        gradient = torch.randn(3, 50) * 1e-6  # as small as eps, so where eps goes shows
        gradient[0] *= 10  # this run's norm (about 7e-5) is clipped, the others' (about 7e-6) are not
        adam.step(lr, [gradient[:, start:end].clone() for start, end in segments])
        for reference, row in zip(references, gradient):
            reference.grad = row.clone()
            torch.nn.utils.clip_grad_norm_([reference], 2e-5)
        torch_adamw.param_groups[0]["lr"] = lr
        torch_adamw.step()
    assert adam.step_count == 3 and torch.allclose(flat, torch.stack(references).detach(), atol=1e-7)
    assert torch.equal(compute, flat.to(torch.bfloat16))


def test_cli_trains_saves_logs_and_skips(fake_english_data, tmp_path, capsys):
    commands = [command(fake_english_data, tmp_path, name, seed, *flags, "--max-update", "25")
                for name, seed, flags in (("a", 1, ()), ("b", 1, ("--shift-special",)), ("c", 1, ("--lang-pos",)))]
    commands[0] += ["--eval-multilinguality", "--eval-mult-sentences", "50", "--eval-mult-layers", "0,2",
                    "--validate-interval-updates", "10"]
    listing = tmp_path / "commands.txt"
    listing.write_text("\n".join(" ".join(c) for c in commands) + "\n")
    allowed = torch.backends.cuda.matmul.allow_tf32
    try:
        main([str(listing), "--summary", str(tmp_path / "summary.json"), "--precision", "fp32",
                              "--gpu-lock", str(tmp_path / "gpu.lock"), "--tf32"])
        assert torch.backends.cuda.matmul.allow_tf32  # --tf32: the validations' products, on a GPU
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allowed
    products = {r["validation_products"] for name in "abc" for r in read_fairseq_log(tmp_path / name / "train.log",
                                                                                      "packed") if "command" in r}
    assert products == {"tf32" if torch.cuda.is_available() else "fp32"}  # on the CPU, fp32 whatever the flag
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [g["runs"] for g in summary["groups"]] == [3]  # one seed: lang-pos stacks with shared positions
    updates = summary["groups"][0]["updates"]
    for name in "abc":
        model, task, cfg = load_checkpoint(tmp_path / name / "checkpoints" / "checkpoint_last.pt")
        assert cfg.task._name == "fake_english" and task.lang_pos == (name == "c")
        train = read_fairseq_log(tmp_path / name / "train.log", "train")
        assert train[-1]["train_num_updates"] == updates and 2 < train[-1]["train_ppl"] < 3000
    valid = read_fairseq_log(tmp_path / "a" / "train.log", "valid")
    assert [r["valid_num_updates"] for r in valid] == list(range(10, updates + 1, 10)) + (
        [updates] if updates % 10 else [])
    assert all(0 <= r["valid_mu"] <= 1 and r["valid_ppl"] > 1 for r in valid)
    capsys.readouterr()
    main([str(listing)])  # everything exists: nothing trains
    assert capsys.readouterr().err.count("exists, skipped") == 3


def test_background_validation_gives_the_records_of_validate_in_order(fake_english_data, tmp_path):
    """Validations on their own thread, submitted while nothing waits for them: each record is the one `validate`
    gives for those weights, and they come back in the order they were submitted."""
    run = parse_run(command(fake_english_data, tmp_path, "a", 1, "--eval-multilinguality",
                                            "--eval-mult-sentences", "30", "--eval-mult-layers", "0,2")).build()
    first = {name: value.detach().clone() for name, value in run.model.state_dict().items()}
    second = {name: value * 1.5 if name.startswith("token_embeddings") else value for name, value in first.items()}
    cpu = torch.device("cpu")
    expected = [validate(run, weights, 1, updates, cpu)
                for updates, weights in ((10, first), (20, second), (30, first))]
    assert expected[0] != expected[1]
    background = BackgroundValidation(cpu)
    futures = [background.submit(run, weights, 1, updates) for updates, weights in ((10, first), (20, second),
                                                                                    (30, first))]
    background.wait()
    assert all(future.done() for future in futures)
    assert [future.result() for future in futures] == expected
    background.close()


def test_side_by_side_one_process_per_group(fake_english_data, tmp_path):
    """A process per group of at most --max-group runs; a lang-pos run stacks with shared-position ones."""
    commands = [command(fake_english_data, tmp_path, f"s{seed}", seed, "--max-update", "5") for seed in (2, 1)]
    commands.append(command(fake_english_data, tmp_path, "lp", 1, "--lang-pos", "--max-update", "5"))
    result = train_side_by_side(list(map(Job, commands)), tmp_path / "pack", max_group=2)  # bf16, as on the GPU
    assert sorted([g["runs"] for g in p["groups"]] for p in result["processes"]) == [[1], [2]]
    assert sorted(p.name for p in (tmp_path / "pack" / "logs").iterdir()) == ["0.log", "1.log"]
    for name in ("s1", "s2", "lp"):
        assert read_fairseq_log(tmp_path / name / "train.log", "train")[-1]["train_num_updates"] == 5


def test_side_by_side_lockstep_trains_a_large_group_with_a_small_one_in_one_process(fake_english_data, tmp_path):
    """With lockstep, a group that fills the GPU (768 wide) and a small one train in one process (`lockstep_teams`
    is checked on more groups below), each run as its command says."""
    commands = [command(fake_english_data, tmp_path, name, 1, *flags, "--max-update", "2")
                for name, flags in (("a", ()), ("b", ("--lang-pos",)),
                                    ("wide", ("--encoder-layers", "1", "--encoder-embed-dim", "768")))]
    result = train_side_by_side(list(map(Job, commands)), tmp_path / "pack", lockstep=True)
    assert [[g["runs"] for g in p["groups"]] for p in result["processes"]] == [[1, 2]]
    assert [p.name for p in (tmp_path / "pack" / "logs").iterdir()] == ["0.log"]
    for name in ("a", "b", "wide"):
        assert read_fairseq_log(tmp_path / name / "train.log", "train")[-1]["train_num_updates"] == 2


def test_side_by_side_gives_each_process_its_runs_follow_ups(fake_english_data, tmp_path, monkeypatch):
    """A process's follow-ups are its runs' `then`; for while others train, a run's `then_beside` where it has one
    and its `then` where not; a group that fills the GPU is marked so and costs more."""
    from fairseq_xmlm.packed import processes

    flags = {"a": (), "wide": ("--encoder-layers", "1", "--encoder-embed-dim", "768")}
    jobs = [Job(command(fake_english_data, tmp_path, name, 1, *extra), then=[[f"gpu_{name}"]],
                then_beside=[["cpu_a"]] if name == "a" else []) for name, extra in flags.items()]
    seen = {}

    def run_jobs(jobs, slots, logs, **options):
        seen.update(options, jobs=jobs)
        for job in jobs:  # what each process would write
            Path(job.argv[job.argv.index("--summary") + 1]).write_text("{}")

    monkeypatch.setattr(processes, "run_jobs", run_jobs)
    train_side_by_side(jobs, tmp_path / "pack", tf32=True)
    wide, a = seen["jobs"]  # the wider model's process first
    assert (wide.then, a.then, wide.then_beside, a.then_beside) == ([["gpu_wide"]], [["gpu_a"]], [["gpu_wide"]],
                                                                    [["cpu_a"]])
    assert wide.fills_gpu and not a.fills_gpu and wide.cost > a.cost
    assert all(job.argv[-1] == "--tf32" for job in seen["jobs"])  # the validations' products


def test_parse_runs_in_a_pool_gives_what_parsing_one_by_one_gives(fake_english_data, tmp_path):
    """`parse_runs` in fresh processes: each command's argv and config as `parse_run` gives them, in order; a
    refused command fails with its own error."""
    from omegaconf import OmegaConf

    commands = [command(fake_english_data, tmp_path, f"r{i}", seed, *flags)
                for i, (seed, flags) in enumerate([(1, ()), (2, ("--lang-pos",)), (3, ("--no-random",))])]
    pooled = parse_runs(commands, workers=2)
    alone = [parse_run(c) for c in commands]
    assert [run.argv for run in pooled] == commands
    assert [OmegaConf.to_yaml(run.cfg) for run in pooled] == [OmegaConf.to_yaml(run.cfg) for run in alone]
    refused = command(fake_english_data, tmp_path, "accumulating", 1, "--update-freq", "2,4")  # one per epoch
    with pytest.raises(XmlmError, match=r"packed training needs --batch-size \(no --max-tokens\) and one --update-freq"):
        parse_runs(commands[:1] + [refused], workers=2)


def test_groups_hold_one_seed_where_it_pays_and_fit_the_memory_budget(fake_english_data, tmp_path):
    flags = [(), ("--lang-pos",), ("--no-random",), ("--shift-special",)]
    runs = [parse_run(command(fake_english_data, tmp_path, f"{i}s{seed}", seed, *f))
            for seed in (1, 2) for i, f in enumerate(flags)]
    one = estimated_gpu_bytes(runs[:1])
    assert SEPARATE_SEEDS_FROM == len(flags) and not fills_gpu(runs)  # tiny models
    seeds = [[run.cfg.common.seed for run in c] for c in grouped(runs, 40)]
    assert seeds == [[1] * 4, [2] * 4]
    assert [len(c) for c in grouped(runs, 3)] == [3, 1, 3, 1]
    assert [len(c) for c in grouped(runs, 40, max_bytes=2.5 * one)] == [2, 2, 2, 2]
    assert [len(c) for c in grouped(runs, 40, max_bytes=0.5 * one)] == [1] * 8
    # fewer runs a seed than that: small models stack across seeds
    assert [len(c) for c in grouped(runs[:3] + runs[4:7], 40)] == [6]
    base = [parse_run(command(fake_english_data, tmp_path, f"base{seed}", seed, "--encoder-layers",
                                              "12", "--encoder-embed-dim", "768", "--encoder-ffn-embed-dim", "3072"))
            for seed in (1, 2)]
    assert fills_gpu(base)  # BERT-base's shape: its seeds never stack
    assert [[run.cfg.common.seed for run in c] for c in grouped(base, 40)] == [[1], [2]]
    # with lockstep, a process trains a group that fills the GPU beside a small one of the same length, if any;
    # every other group trains alone, the small ones first
    longer = [parse_run(command(fake_english_data, tmp_path, "long", 1, "--max-update", "9"))]
    small = grouped(runs[:4] + longer, 40)
    big = grouped(base, 40)
    teams = lockstep_teams(big + small)
    assert [[chunk[0].cfg.optimization.max_update for chunk in team] for team in teams] == [[9], [0, 0], [0]]
    assert lockstep_teams(big[:1] + small) == [[small[1]], [big[0], small[0]]]
    assert lockstep_teams(small) == [[small[0]], [small[1]]]


@pytest.mark.parametrize("heads", [(), ONE_HEAD], ids=["two-heads", "one-head"])
def test_compiled_layers_give_the_eager_logits_and_gradients(fake_english_data, tmp_path, heads):
    runs = [parse_run(command(fake_english_data, tmp_path, f"r{s}", s, *flags, *heads)).build()
            for s, flags in ((1, ()), (2, ("--lang-pos",)))]
    cpu = torch.device("cpu")
    eager, compiled = (StackedEncoder([run.model for run in runs], cpu, compile=flag) for flag in (False, True))
    # each shape of stacked model compiles its own copy of the layer function, which dynamo keeps apart
    assert layer_function((2, 32, 64, 2)) is layer_function((2, 32, 64, 2))
    assert layer_function((2, 32, 64, 2)).__code__.co_name != layer_function((11, 64, 256, 1)).__code__.co_name
    group = GroupData(runs, cpu)
    schedules = [epoch_batches(run, 1) for run in runs]
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    for step in range(3):  # new lengths: compiled once, for any length
        inputs, langs, positions, _, _ = group.batch([s[step] for s in schedules], torch.Generator().manual_seed(step))
        eager_grads, compiled_grads = (
            stacked.gradients(stacked.masked_logits(inputs, langs, positions).square().mean())
            for stacked in (eager, compiled))
        assert torch.allclose(compiled.masked_logits(inputs, langs, positions),
                              eager.masked_logits(inputs, langs, positions), atol=1e-5)
        assert all(torch.allclose(c, e, atol=1e-6) for c, e in zip(compiled_grads, eager_grads, strict=True))
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2  # the top layer and the others
    # compiled, the dropouts are torch's own (fallback_random): the same draws as eager from the same seed
    logits = []
    for stacked in (eager, compiled):
        torch.manual_seed(0)
        with torch.no_grad():
            logits.append(stacked.masked_logits(inputs, langs, positions, dropout=0.1, attention_dropout=0.1))
    assert torch.allclose(*logits, atol=1e-5)
    assert not torch.allclose(logits[0], eager.masked_logits(inputs, langs, positions), atol=1e-3)


HOLD_LOCK = ("import fcntl,sys\nf=open(sys.argv[1],'a')\ntry: fcntl.lockf(f,fcntl.LOCK_EX|fcntl.LOCK_NB)\n"
             "except OSError: sys.exit(print('busy'))\nprint('held',flush=True)\ninput()")


def held_elsewhere(path):
    """Another process holding the lock file `path`, which it finds free (record locks do not exclude within one
    process), until its stdin closes."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "held\n"
    return holder


def let_go(holder):
    holder.stdin.close()
    holder.wait(timeout=TIMEOUT)


def test_gpu_lock_waits_for_its_holder_and_gives_up_when_stopped(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    holder = held_elsewhere(tmp_path / "gpu.lock.0_1")  # another process's group is training
    calls = []
    assert take_gpu(str(tmp_path / "gpu.lock"), lambda: calls.append(1) or len(calls) > 2, "g") is None
    assert len(calls) == 3 and "g: waiting for the GPU" in capsys.readouterr().err
    let_go(holder)
    lock = take_gpu(str(tmp_path / "gpu.lock"), lambda: True, "g")
    assert lock is not None  # free: taken at once, even when asked to stop
    lock.close()
    assert lock.closed and re.fullmatch(r"g: took the GPU at \d\d:\d\d:\d\d\ng: let go of the GPU at \d\d:\d\d:\d\d\n",
                                        capsys.readouterr().err)


def test_a_lock_let_go_is_free_although_a_child_forked_while_it_was_held_lives_on(tmp_path, monkeypatch):
    """A process that forks while it holds a lock (a compile worker, say) and then lets the lock go has let it go:
    the child's inherited descriptor does not keep it, as it would keep an flock."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lock = take_gpu(str(tmp_path / "gpu.lock"), lambda: True, "g")
    child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(60,))
    child.start()
    try:
        lock.close()
        holder = held_elsewhere(tmp_path / "gpu.lock.all")  # busy until the child's end with an flock
        let_go(holder)
    finally:
        child.terminate()
        child.join()


def test_bad_commands(fake_english_data, tmp_path, capsys):
    listing = tmp_path / "commands.txt"
    bad = command(fake_english_data, tmp_path, "a", 1)
    listing.write_text(" ".join(bad) + "\n")
    expect_cli_error(capsys, main, [str(listing), "--cuda-graphs"], "CUDA graphs need a GPU")
    assert not (tmp_path / "a" / "train.log.partial").exists()
    listing.write_text(" ".join(bad).replace("--criterion masked_lm", "--criterion cross_entropy") + "\n")
    expect_cli_error(capsys, main, [str(listing)], "supports --criterion masked_lm|xmlm_masked_lm")
    listing.write_text(" ".join(bad + ["--no-such-option"]) + "\n")
    expect_cli_error(capsys, main, [str(listing)], "unrecognized arguments: --no-such-option")
    at = bad.index("--log-file")
    listing.write_text(" ".join(bad[:at] + bad[at + 2:]) + "\n")
    expect_cli_error(capsys, main, [str(listing)], "needs --save-dir and --log-file")
    listing.write_text(" ".join(bad + ["--sep-emb"]) + "\n")
    expect_cli_error(capsys, main, [str(listing)], "no --sep-emb")
    expect_cli_error(capsys, main, [str(tmp_path / "none.txt")], "command file not found")


def test_suspended_group_resumes_to_the_same_result(fake_english_data, tmp_path):
    """Stopped after 3 of 7 updates (dropout on: the random streams are saved too) and resumed by fresh runs, as a
    new process would: the same weights and the same log records as one uninterrupted run."""
    def group(folder):
        return [parse_run(command(fake_english_data, tmp_path / folder, name, 1, *flags,
                                                  "--max-update", "7")).build()
                for name, flags in (("a", ()), ("b", ("--shift-special",)))]

    cpu = torch.device("cpu")
    train_group(group("whole"), cpu, "fp32")
    steps = iter(range(100))
    split = group("split")
    assert train_group(split, cpu, "fp32", stop=lambda: next(steps) == 3) is None
    assert (tmp_path / "split" / "a" / "checkpoints" / "packed_resume.pt").exists()
    assert not (tmp_path / "split" / "a" / "checkpoints" / "checkpoint_last.pt").exists()
    assert train_group(group("split"), cpu, "fp32")["updates"] == 7
    assert not (tmp_path / "split" / "a" / "checkpoints" / "packed_resume.pt").exists()
    for name in "ab":
        whole, split = (load_checkpoint(tmp_path / folder / name / "checkpoints" / "checkpoint_last.pt")[0]
                        for folder in ("whole", "split"))
        for (key, value), other in zip(whole.state_dict().items(), split.state_dict().values()):
            assert torch.equal(value, other), key
        records = [[{k: v for k, v in r.items() if k not in ("train_wall", "seconds", "tokens_per_s")}
                    for r in read_fairseq_log(tmp_path / folder / name / "train.log", "train")]
                   for folder in ("whole", "split")]
        assert records[0] == records[1] and records[0][-1]["train_num_updates"] == 7


def test_groups_in_lockstep_end_as_alone_and_resume(fake_english_data, tmp_path):
    """Two groups of different shapes trained in lockstep (5 and 7 updates: the shorter leaves the round) end as
    each trained alone; stopped after 3 rounds and resumed by fresh runs, they end the same again. Dropout off: on
    the CPU the groups draw it from one generator (on a GPU each has its own)."""
    no_dropout = ("--dropout", "0", "--attention-dropout", "0")

    def groups(folder):
        return [[parse_run(command(fake_english_data, tmp_path / folder, name, 1, *no_dropout,
                                                   "--max-update", "5")).build() for name in "ab"],
                [parse_run(command(fake_english_data, tmp_path / folder, "c", 2, *no_dropout,
                                                   "--encoder-embed-dim", "48", "--max-update", "7")).build()]]

    cpu = torch.device("cpu")
    for chunk in groups("alone"):
        train_group(chunk, cpu, "fp32")
    assert [facts["updates"] for facts in train_groups(groups("team"), cpu, "fp32")] == [5, 7]
    rounds = iter(range(100))
    assert train_groups(groups("split"), cpu, "fp32", stop=lambda: next(rounds) == 3) is None
    assert (tmp_path / "split" / "c" / "checkpoints" / "packed_resume.pt").exists()
    assert train_groups(groups("split"), cpu, "fp32") is not None
    assert not (tmp_path / "split" / "c" / "checkpoints" / "packed_resume.pt").exists()
    for name in "abc":
        alone, *others = (load_checkpoint(tmp_path / folder / name / "checkpoints" / "checkpoint_last.pt")[0]
                          for folder in ("alone", "team", "split"))
        for other in others:
            for (key, value), got in zip(alone.state_dict().items(), other.state_dict().values()):
                assert torch.equal(value, got), (name, key)
        records = [[{k: v for k, v in r.items() if k not in ("train_wall", "seconds", "tokens_per_s")}
                    for r in read_fairseq_log(tmp_path / folder / name / "train.log", "train")]
                   for folder in ("alone", "team", "split")]
        assert records[0] == records[1] == records[2]


def test_group_warms_up_before_its_turn_and_resumes_if_stopped_waiting(fake_english_data, tmp_path):
    """With take_turn the first epoch trains at once; the turn is asked for after it. Stopped while waiting, the
    group suspends there, and once resumed it ends as an uninterrupted run and releases its turn."""
    def group(folder):
        runs = [parse_run(command(fake_english_data, tmp_path / folder, name, 1,
                                                  "--max-update", "7")).build() for name in "ab"]
        for run in runs:
            run.updates_per_epoch = 3  # short epochs: the turn comes after 3 updates
        return runs

    class Lock:
        closed = False

        def close(self):
            self.closed = True

    cpu, asked = torch.device("cpu"), []
    train_group(group("whole"), cpu, "fp32")
    waiting = group("split")
    assert train_group(waiting, cpu, "fp32", take_turn=lambda: asked.append(1)) is None
    assert read_fairseq_log(str(waiting[0].log_path) + ".partial", "train")[-1]["train_num_updates"] == 3
    lock = Lock()
    assert train_group(group("split"), cpu, "fp32", take_turn=lambda: lock)["updates"] == 7
    assert asked == [1] and lock.closed
    for name in "ab":
        whole, split = (load_checkpoint(tmp_path / folder / name / "checkpoints" / "checkpoint_last.pt")[0]
                        for folder in ("whole", "split"))
        for (key, value), other in zip(whole.state_dict().items(), split.state_dict().values()):
            assert torch.equal(value, other), key


def test_group_warms_up_in_its_turn_and_lets_the_next_one_in_after_its_first_epoch(fake_english_data, tmp_path):
    """With take_warm_up the first epoch waits for that lock, which goes when the epoch ends, before the GPU turn is
    asked for. Stopped while waiting for it, the group suspends before its first update and later ends as usual."""
    runs = [parse_run(command(fake_english_data, tmp_path, name, 1, "--max-update", "7")).build()
            for name in "ab"]
    for run in runs:
        run.updates_per_epoch = 3
    cpu, events = torch.device("cpu"), []

    def epochs_logged():  # the log is renamed from .partial once the run has ended
        partial = str(runs[0].log_path) + ".partial"
        return len(read_fairseq_log(partial if os.path.exists(partial) else runs[0].log_path, "train"))

    class Lock:
        def __init__(self, name):
            self.name = name

        def close(self):
            events.append((self.name, "closed", epochs_logged()))

    def take(name):
        def taken():
            events.append((name, "taken", epochs_logged()))
            return Lock(name)
        return taken

    assert train_group(runs, cpu, "fp32", take_warm_up=lambda: None) is None
    assert (tmp_path / "a" / "checkpoints" / "packed_resume.pt").exists() and epochs_logged() == 0
    facts = train_group(runs, cpu, "fp32", take_turn=take("gpu"), take_warm_up=take("warm-up"))
    assert facts["updates"] == 7
    assert events[:3] == [("warm-up", "taken", 0), ("warm-up", "closed", 1), ("gpu", "taken", 1)]
    assert events[3] == ("gpu", "closed", 3)


def test_warm_up_lock_is_one_per_model_shape_and_gpu(fake_english_data, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    runs = [parse_run(command(fake_english_data, tmp_path, name, 1, *flags))
            for name, flags in (("a", ()), ("b", ("--encoder-embed-dim", "64")))]
    holder = held_elsewhere(tmp_path / "warm.lock.1.1x2x32x64x2")  # another process of runs[0]'s shape warms up
    calls = []
    assert take_warm_up(str(tmp_path / "warm.lock"), [runs[:1]], lambda: calls.append(1) or True,
                                        "g") is None
    assert "g: waiting to warm up after the other group of its shape" in capsys.readouterr().err
    lock = take_warm_up(str(tmp_path / "warm.lock"), [runs[1:]], lambda: True, "g")
    assert lock is not None and (tmp_path / "warm.lock.1.1x2x64x64x2").exists()  # another shape: no wait
    lock.close()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    lock = take_warm_up(str(tmp_path / "warm.lock"), [runs[:1]], lambda: True, "g")
    assert lock is not None  # the same shape on another GPU: no wait either
    lock.close()
    let_go(holder)


def test_cli_time_limit_suspends_and_a_rerun_finishes(fake_english_data, tmp_path, capsys):
    listing = tmp_path / "commands.txt"
    listing.write_text(" ".join(command(fake_english_data, tmp_path, "a", 1, "--max-update", "5")) + "\n")
    with pytest.raises(SystemExit) as stopped:
        main([str(listing), "--time-limit", "1e-9"])
    assert stopped.value.code == SUSPENDED
    assert (tmp_path / "a" / "train.log.partial").exists() and not (tmp_path / "a" / "train.log").exists()
    (tmp_path / "a" / "checkpoints" / "packed_resume.pt").write_bytes(b"not a torch file")  # e.g. a full disk
    main([str(listing)])  # starts afresh, says so
    assert "is unreadable" in capsys.readouterr().err
    assert read_fairseq_log(tmp_path / "a" / "train.log", "train")[-1]["train_num_updates"] == 5
