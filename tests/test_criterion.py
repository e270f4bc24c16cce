"""xmlm_masked_lm: fairseq's masked_lm loss and sample size from the collater's CPU-side target positions."""
import re

import pytest
import torch
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

from conftest import fairseq_train
from fairseq_xmlm.criterions.xmlm_masked_lm import XmlmMaskedLmLoss
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.models.partially_shared_roberta import PartiallySharedRoberta, PartiallySharedRobertaConfig
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask


@pytest.fixture(scope="module")
def task_and_batch(fake_english_data):
    task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=str(fake_english_data), seed=1))
    task.load_dataset("train")
    iterator = task.get_batch_iterator(task.datasets["train"], max_sentences=64, seed=1).next_epoch_itr(shuffle=True)
    return task, next(iterator)


def make_model(task, sep_emb):
    cfg = PartiallySharedRobertaConfig(encoder_layers=2, encoder_embed_dim=16, encoder_ffn_embed_dim=32,
                                       encoder_attention_heads=2, dropout=0.0, attention_dropout=0.0, sep_emb=sep_emb)
    torch.manual_seed(0)
    return PartiallySharedRoberta.build_model(cfg, task)


def criteria(task):
    return MaskedLmLoss(MaskedLmConfig(tpu=False), task), XmlmMaskedLmLoss(MaskedLmConfig(tpu=False), task)


def test_collater_positions_are_the_target_positions(task_and_batch):
    task, batch = task_and_batch
    pad = task.dictionary.pad()
    flat_targets = batch["target"].view(-1)
    assert batch["masked_positions"].tolist() == flat_targets.ne(pad).nonzero().squeeze(1).tolist()
    assert batch["nmasked"] == int(flat_targets.ne(pad).sum()) > 0 and isinstance(batch["nmasked"], int)


@pytest.mark.parametrize("sep_emb", [False, True])
def test_same_logits_loss_and_sample_size_as_stock_masked_lm(task_and_batch, sep_emb):
    task, batch = task_and_batch
    model = make_model(task, sep_emb)
    by_mask, _ = model(**batch["net_input"], masked_tokens=batch["target"].ne(task.dictionary.pad()))
    by_position, _ = model(**batch["net_input"], masked_positions=batch["masked_positions"])
    assert torch.equal(by_mask, by_position)

    stock, ours = criteria(task)
    stock_loss, stock_size, stock_log = stock(model, batch)
    loss, size, log = ours(model, batch)
    assert torch.equal(loss, stock_loss) and loss.item() > 0
    assert size == int(stock_size) and isinstance(size, int)  # a Python int: fairseq never reads it back from the GPU
    assert log["sample_size"] == size and log["ntokens"] == stock_log["ntokens"]
    loss.backward()
    assert model.lm_dense.weight.grad.abs().sum() > 0


def test_a_batch_without_targets_gives_loss_zero_and_sample_size_zero(task_and_batch):
    task, batch = task_and_batch
    pad = task.dictionary.pad()
    empty = {**batch, "target": torch.full_like(batch["target"], pad),
             "masked_positions": batch["masked_positions"][:0], "nmasked": 0}
    model = make_model(task, sep_emb=True)
    stock, ours = criteria(task)
    loss, size, _ = ours(model, empty)
    assert loss.item() == 0.0 and size == 0
    assert stock(model, empty)[0].item() == 0.0  # stock's fallback (project every position) gives the same
    loss.backward()  # still part of the graph: fairseq's train step can run it


def test_batches_without_target_positions_are_refused(task_and_batch):
    task, batch = task_and_batch
    _, ours = criteria(task)
    plain = {k: v for k, v in batch.items() if k not in ("masked_positions", "nmasked")}
    with pytest.raises(XmlmError, match="masked_positions"):
        ours(make_model(task, sep_emb=False), plain)


def logged_losses(log):
    """The train_inner / valid losses fairseq logged, in order."""
    return re.findall(r"(?:train_inner|valid)\b[^\n]*? loss[= ]([\d.]+)", log)


@pytest.mark.parametrize("data, flags", [
    ("fake_english_data", ["--task", "fake_english"]),
    ("bible_en_fr_data", ["--task", "bilingual_mlm", "--langs", "en,fr", "--tokens-per-sample", "64", "--sep-emb"]),
])
def test_fairseq_train_logs_the_stock_losses(request, tmp_path, data, flags):
    data_dir = request.getfixturevalue(data)
    small = ["--encoder-layers", "2", *flags]
    stock = fairseq_train(data_dir, tmp_path / "stock", *small, updates=3)
    ours = fairseq_train(data_dir, tmp_path / "ours", *small, "--criterion", "xmlm_masked_lm", updates=3)
    assert "xmlm_masked_lm" in ours
    assert len(logged_losses(stock)) == 4  # 3 updates + validation
    assert logged_losses(ours) == logged_losses(stock)
