"""xmlm-train: fairseq-train's loop with a trainer whose DDP ranks meet once per update (fairseq_xmlm/train.py).
It must train and log exactly as fairseq-train does, on one process and on two ranks."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, fairseq_train
from fairseq_xmlm.train import XmlmTrainer, check_consistent_grad_norms, sum_over_ranks
from test_distributed import train_inner_fields, train_two_ranks

sys.path.insert(0, str(REPO / "benchmarks"))
import host_cost  # noqa: E402

TIMINGS = {"wps", "ups", "wall", "train_wall", "gb_free"}  # what differs from run to run


def logged(log):
    rows = [{k: v for k, v in row.items() if k not in TIMINGS} for row in train_inner_fields(log)]
    assert rows and all("loss" in row and "gnorm" in row for row in rows)
    return rows


def test_one_process_logs_what_fairseq_train_logs(fake_english_data, tmp_path):
    stock, ours = (logged(fairseq_train(fake_english_data, tmp_path / entry, "--task", "fake_english", "--criterion",
                                        "xmlm_masked_lm", "--optimizer", "xmlm_adamw", "--fp16",
                                        "--memory-efficient-fp16", "--disable-validation", updates=6, entry=entry))
                   for entry in ("fairseq-train", "xmlm-train"))
    assert len(stock) == 6 and ours == stock


def test_update_without_host_reads_logs_what_fairseq_train_logs(fake_english_data, tmp_path):
    """fp32 with xmlm_adamw on one process: xmlm-train's own train_step (no host read on a GPU) takes the same steps
    and logs the same losses, gradient norms (clipped at 0.5, so the clip rate too), learning rates and batch sizes,
    update for update, and saves a checkpoint; fp16 keeps fairseq's path."""
    options = ("--task", "fake_english", "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw",
               "--clip-norm", "0.5", "--disable-validation")
    stock, ours = (fairseq_train(fake_english_data, tmp_path / entry, *options, updates=6, entry=entry)
                   for entry in ("fairseq-train", "xmlm-train"))
    assert len(logged(stock)) == 6 and logged(ours) == logged(stock)
    assert all("clip" in row for row in logged(ours))
    assert epoch_statistics(ours) == epoch_statistics(stock) and "loss" in epoch_statistics(ours)
    assert (tmp_path / "xmlm-train" / "checkpoint_last.pt").is_file()


def host_reads_per_update(trainer_class, data):
    """Operators that make the host read a tensor's value (on a GPU: wait for it) per update, counted by
    benchmarks/host_cost.py's instrument."""
    argv = [str(data), "--user-dir", str(REPO / "fairseq_xmlm"), "--task", "fake_english", "--arch",
            "xmlm_bert_small", "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw", "--bf16-params",
            "--lr", "1e-3", "--batch-size", "8", "--cpu", "--clip-norm", "1.0"]
    trainer, task = host_cost.build_trainer(host_cost.parse(argv), trainer_class)
    batches = task.get_batch_iterator(task.datasets["train"], max_sentences=8, seed=1).next_epoch_itr(shuffle=True)
    samples = [next(batches) for _ in range(4)]  # the data loader's own reads are of host tensors: not counted
    trainer.train_step(samples[:1])  # builds the optimizer
    counter = host_cost.OperatorCount()
    with counter:
        for sample in samples[1:]:
            trainer.train_step([sample])
    return sum(counter.syncs.values()) / 3


def test_update_without_host_reads_reads_only_what_a_gpu_does_inside_the_fused_step(fake_english_data):
    """On the CPU the path keeps two reads per update, its finiteness check and torch's unfused AdamW reading its step
    count; on a GPU both happen inside the fused AdamW kernel (tests/gpu/test_skip_on_device.py). fairseq's
    train_step reads three more: its meters' finiteness check, the smoothed values it returns and their perplexity."""
    from fairseq.trainer import Trainer

    ours = host_reads_per_update(XmlmTrainer, fake_english_data)
    assert ours == 2
    assert host_reads_per_update(Trainer, fake_english_data) == ours + 3


def test_bf16_params_train_and_load_back_in_fp32(fake_english_data, tmp_path):
    from fairseq_xmlm.checkpoints import load_checkpoint

    log = fairseq_train(fake_english_data, tmp_path, "--task", "fake_english", "--criterion", "xmlm_masked_lm",
                        "--optimizer", "xmlm_adamw", "--bf16-params", "--disable-validation", updates=4,
                        entry="xmlm-train")
    losses = [float(row["loss"]) for row in logged(log)]
    assert len(losses) == 4 and all(0 < loss < 20 for loss in losses)
    model, _, _ = load_checkpoint(tmp_path / "checkpoint_last.pt")  # fairseq saves low precision as fp32
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert all(torch.equal(p, p.bfloat16().float()) for p in model.parameters())  # trained as bf16 values


def epoch_statistics(log):
    """fairseq-train's end-of-epoch `train` line, without its timings."""
    lines = [line for line in log.splitlines() if "| train |" in line]
    assert len(lines) == 1
    fields = dict(re.findall(r"\| (\w+) ([^|]+?) (?=\||$)", lines[0] + " "))
    return {k: v for k, v in fields.items() if k not in TIMINGS}


def validation_losses(log):
    return re.findall(r"\| valid on 'valid' subset \| loss ([0-9.]+)", log)


def test_two_ranks_log_what_fairseq_train_logs(fake_english_data, tmp_path):
    """legacy_ddp, xmlm_adamw's flat fp16 gradient, two batches per update (the first under no_sync), validation
    every 3 updates: the same losses, gradient norms, loss scales, batch sizes, learning rates and dev losses,
    update for update. The ranks' norms were checked from the second update on (a mismatch raises), once inside a
    validation's statistics."""
    options = ("--optimizer", "xmlm_adamw", "--fp16", "--memory-efficient-fp16", "--update-freq", "2")
    stock = train_two_ranks(fake_english_data, tmp_path / "stock", *options, validate=True)
    ours = train_two_ranks(fake_english_data, tmp_path / "ours", *options, entry="xmlm-train", validate=True)
    assert len(logged(stock[0])) == 6 and logged(ours[0]) == logged(stock[0])
    assert len(validation_losses(stock[0])) == 2 and validation_losses(ours[0]) == validation_losses(stock[0])
    assert "trainer: XmlmTrainer" in ours[0] and "XmlmTrainer" not in stock[0]


def test_bad_input_is_one_error_line(tmp_path):
    result = subprocess.run([str(Path(sys.executable).parent / "xmlm-train"), str(tmp_path / "missing"), "--task",
                             "fake_english", "--arch", "xmlm_bert_small", "--batch-size", "4", "--cpu"],
                            capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: no dictionary at ")
    assert "Traceback" not in result.stderr


def test_statistics_come_back_as_host_numbers_in_their_shapes():
    device = torch.device("cpu")
    summed = sum_over_ranks({"loss": torch.tensor(2.5), "ntokens": 7, "per_lang": torch.tensor([1.0, 2.0]),
                             "time": 0.25}, device)
    assert summed == {"loss": 2.5, "ntokens": 7.0, "per_lang": summed["per_lang"], "time": 0.25}
    assert all(isinstance(summed[k], float) for k in ("loss", "ntokens", "time"))
    assert summed["per_lang"].dtype == torch.double and summed["per_lang"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("norms, amp, consistent", [
    ([3.0, 3.0, 3.0], False, True),
    ([3.0, 3.0000000001, 3.0], False, True),
    ([3.0, 3.1, 3.0], False, False),
    ([3.0, float("inf")], False, False),
    ([float("inf"), float("nan")], True, True),  # --amp skips such a step
])
def test_gradient_norms_must_agree_across_ranks(norms, amp, consistent):
    if consistent:
        check_consistent_grad_norms(norms, amp=amp)
    else:
        with pytest.raises(FloatingPointError, match="inconsistent between workers"):
            check_consistent_grad_norms(norms, amp=amp)
