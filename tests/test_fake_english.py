"""The fake_english task: masking statistics on real Bible batches, every modification, real training runs."""
import pytest
import torch

from conftest import TIMEOUT, fairseq_train
from fairseq.data import data_utils

from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import ReplacementConfig, resolve_replacement_probs, specials_follow_content
from fairseq_xmlm.tasks.contract import LanguageTask
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask
from fairseq_xmlm.vocabulary import dictionary_fingerprint


def make_task(data, **flags):
    return FakeEnglishTask.setup_task(FakeEnglishConfig(data=str(data), seed=1, **flags))


def batches(task, split="train", n=20, epoch=1):
    task.load_dataset(split)
    dataset = task.datasets[split]
    iterator = task.get_batch_iterator(dataset, max_sentences=256, seed=1, epoch=epoch).next_epoch_itr(shuffle=False)
    return [batch for _, batch in zip(range(n), iterator)]


def write_twin_table(task, path, k=3):
    """Neighbours of each English symbol: k Fake symbols (its twin first); of each Fake symbol: k English ones."""
    v = task.english_size
    ids = torch.arange(2 * v)
    other = torch.where(ids < v, ids + v, ids - v)
    neighbours = torch.stack([other] + [(other + j) % v + torch.where(ids < v, v, 0) for j in range(1, k)], dim=1)
    torch.save({"neighbours": neighbours, "dict_size": 2 * v, "dict_md5": dictionary_fingerprint(task.dictionary),
                "k": k, "langs": ["en", "fake"]}, path)
    return neighbours


def original_tokens(task, batch, split="train"):
    """The batch's sentences before masking, padded as the collater pads them (from the dataset's own buffer)."""
    dataset = task.datasets[split]
    items = [torch.from_numpy(dataset.tokens[dataset.offsets[i]:dataset.offsets[i + 1]])
             for i in batch["id"].tolist()]
    return data_utils.collate_tokens(items, task.dictionary.pad())


def replacement_counts(task, sample_batches):
    """(targets, maskable tokens, #mask, #keep, #other) over the batches."""
    specials = torch.tensor(sorted(task.special_ids))
    totals = torch.zeros(5, dtype=torch.long)
    for batch in sample_batches:
        inputs, target = batch["net_input"]["src_tokens"], batch["target"]
        at = target.ne(task.dictionary.pad())
        original = torch.where(at, target, inputs)
        mask_ids = torch.tensor([task.specials_of(lang)[2] for lang in (0, 1)])[batch["net_input"]["lang_ids"]]
        is_mask = inputs.eq(mask_ids.unsqueeze(1)) & at
        totals += torch.tensor([at.sum(), (~torch.isin(original, specials)).sum(), is_mask.sum(),
                                (at & inputs.eq(target)).sum(), (at & ~is_mask & inputs.ne(target)).sum()])
    return totals.tolist()


def test_fifteen_percent_targets_never_specials(fake_english_data):
    task = make_task(fake_english_data)
    sample = batches(task)
    targets, maskable, n_mask, n_keep, n_random = replacement_counts(task, sample)
    assert abs(targets / maskable - 0.15) < 0.01
    specials = torch.tensor(sorted(task.special_ids))
    for batch in sample:
        assert not torch.isin(batch["target"][batch["target"].ne(task.dictionary.pad())], specials).any()
    assert abs(n_mask / targets - 0.8) < 0.02 and abs(n_keep / targets - 0.1) < 0.015
    assert abs(n_random / targets - 0.1) < 0.015


def test_random_words_cross_languages(fake_english_data):
    task = make_task(fake_english_data)
    crossed = 0
    for batch in batches(task):
        inputs, target, langs = batch["net_input"]["src_tokens"], batch["target"], batch["net_input"]["lang_ids"]
        replaced = target.ne(task.dictionary.pad()) & inputs.ne(target) & inputs.ne(task.mask_idx)
        foreign = (inputs >= task.english_size).long().ne(langs.unsqueeze(1))
        crossed += int((replaced & foreign).sum())
        assert not torch.isin(inputs[replaced], torch.tensor(sorted(task.special_ids))).any()
    assert crossed > 100


def test_no_random_never_inserts_a_new_token(fake_english_data):
    task = make_task(fake_english_data, no_random=True)
    sample = batches(task)
    for batch in sample:
        inputs, target = batch["net_input"]["src_tokens"], batch["target"]
        original = original_tokens(task, batch)
        at = target.ne(task.dictionary.pad())
        assert at.any() and torch.equal(target[at], original[at])
        assert (inputs[at].eq(target[at]) | inputs[at].eq(task.mask_idx)).all()
        assert torch.equal(inputs[~at], original[~at])  # non-targets keep their token
    targets, _, n_mask, n_keep, n_random = replacement_counts(task, sample)
    assert n_random == 0 and abs(n_keep / targets - 0.2) < 0.02 and abs(n_mask / targets - 0.8) < 0.02


def test_the_non_target_check_catches_a_changed_token(fake_english_data):
    """original_tokens reads the data, not the batch: a non-target changed in the batch is caught."""
    task = make_task(fake_english_data, no_random=True)
    batch = batches(task, n=1)[0]
    inputs, at = batch["net_input"]["src_tokens"].clone(), batch["target"].ne(task.dictionary.pad())
    row, col = (~at & inputs.ne(task.dictionary.pad())).nonzero()[0].tolist()
    inputs[row, col] += 1
    assert not torch.equal(inputs[~at], original_tokens(task, batch)[~at])


def test_random_replace_within_keeps_random_words_in_the_row_language(fake_english_data):
    task = make_task(fake_english_data, random_replace="within")
    assert task.replacement_probs == (0.8, 0.1, 0.1, 0.0)
    replaced_words = 0
    for batch in batches(task, n=10):
        inputs, target, langs = batch["net_input"]["src_tokens"], batch["target"], batch["net_input"]["lang_ids"]
        replaced = target.ne(task.dictionary.pad()) & inputs.ne(target) & inputs.ne(task.mask_idx)
        assert ((inputs >= task.english_size).long().eq(langs.unsqueeze(1)) | ~replaced).all()
        assert not torch.isin(inputs[replaced], torch.tensor(sorted(task.special_ids))).any()
        replaced_words += int(replaced.sum())
    assert replaced_words > 100


@pytest.mark.parametrize("config, probs", [
    (ReplacementConfig(), (0.8, 0.1, 0.1, 0.0)),
    (ReplacementConfig(knn=3), (0.5, 0.1, 0.1, 0.3)),
    (ReplacementConfig(no_random=True), (0.8, 0.2, 0.0, 0.0)),
    (ReplacementConfig(no_random=True, knn=3), (0.5, 0.2, 0.0, 0.3)),
    (ReplacementConfig("0.6,0.4,0", no_random=True), (0.6, 0.4, 0.0, 0.0)),
    (ReplacementConfig(random_replace="none"), (0.8, 0.2, 0.0, 0.0)),
    (ReplacementConfig("0.5,0.2,0.3", random_replace="none"), (0.5, 0.5, 0.0, 0.0)),
    (ReplacementConfig("0.5,0.2,0.3", random_replace="within"), (0.5, 0.2, 0.3, 0.0)),
])
def test_one_replacement_policy(config, probs):
    """--no-random is --random-replace none, as Dufter's "no-random" (.8,.2,0) and Conneau's "none" both mean."""
    assert resolve_replacement_probs(config) == pytest.approx(probs)


def test_an_unknown_random_source_is_refused(fake_english_data):
    with pytest.raises(XmlmError, match="--random-replace must be one of cross, within, none, got 'everywhere'"):
        make_task(fake_english_data, random_replace="everywhere")


def test_the_task_fulfils_the_evaluation_contract(fake_english_data):
    task = make_task(fake_english_data, inv_order=True, shift_special=True)
    assert isinstance(task, LanguageTask)
    assert task.reverses(1) and not task.reverses(0)
    assert task.mask_symbol(1) == task.mask_idx + task.english_size and task.mask_symbol(0) == task.mask_idx


def test_knn_replacements_come_from_the_other_language_neighbour_list(fake_english_data, tmp_path):
    probe = make_task(fake_english_data)
    neighbours = write_twin_table(probe, tmp_path / "knn.pt")
    # No random words here, so every changed target that is not the mask is a knn replacement.
    task = make_task(fake_english_data, knn_replace=3, knn_table=str(tmp_path / "knn.pt"),
                     replacement_probs="0.5,0.2,0,0.3")
    n_knn = n_targets = 0
    for batch in batches(task):
        inputs, target, langs = batch["net_input"]["src_tokens"], batch["target"], batch["net_input"]["lang_ids"]
        at = target.ne(task.dictionary.pad())
        is_knn = at & inputs.ne(target) & inputs.ne(task.mask_idx)
        assert ((inputs[is_knn] >= task.english_size).long() != langs.unsqueeze(1).expand_as(inputs)[is_knn]).all()
        for row, col in is_knn.nonzero().tolist():
            assert int(inputs[row, col]) in neighbours[target[row, col]].tolist()
        n_knn += int(is_knn.sum())
        n_targets += int(at.sum())
    assert abs(n_knn / n_targets - 0.3) < 0.02


def test_shift_special_gives_fake_sentences_their_own_specials(fake_english_data):
    task = make_task(fake_english_data, shift_special=True)
    v = task.english_size
    ids = task.load_split_sentences("train")[0]
    fake = task.sentence_input(ids, 1)
    assert fake[0] == task.dictionary.bos() + v and fake[-1] == task.dictionary.eos() + v
    assert task.dictionary[int(fake[0])] == "::<s>" and task.dictionary[task.specials_of(1)[2]] == "::<mask>"
    for batch in batches(task, n=5):
        rows = batch["net_input"]["lang_ids"].eq(1)
        inputs, target = batch["net_input"]["src_tokens"][rows], batch["target"][rows]
        assert inputs[:, 0].eq(task.dictionary.bos() + v).all()
        at = target.ne(task.dictionary.pad())
        assert not inputs[at].eq(task.mask_idx).any() and inputs[at].eq(task.mask_idx + v).any()


def test_default_shares_the_specials(fake_english_data):
    task = make_task(fake_english_data)
    fake = task.sentence_input(task.load_split_sentences("train")[0], 1)
    assert fake[0] == task.dictionary.bos() and fake[-1] == task.dictionary.eos()


def test_fake_is_english_shifted_and_lang_ids_travel(fake_english_data):
    task = make_task(fake_english_data, lang_pos=True)
    v = task.english_size
    ids = task.load_split_sentences("train")[3]
    assert torch.equal(task.sentence_input(ids, 1)[1:-1], ids + v)
    assert torch.equal(task.sentence_input(ids, 0)[1:-1], ids)
    assert task.lang_pos
    for batch in batches(task, n=5):
        tokens = torch.where(batch["target"].ne(1), batch["target"], batch["net_input"]["src_tokens"])
        langs = batch["net_input"]["lang_ids"]
        real = ~torch.isin(tokens, torch.tensor(sorted(task.special_ids)))
        assert ((tokens >= v).long().eq(langs.unsqueeze(1)) | ~real).all()


def test_inv_order_reverses_exactly(fake_english_data):
    task = make_task(fake_english_data, inv_order=True)
    ids = task.load_split_sentences("train")[5]
    assert torch.equal(task.sentence_input(ids, 1)[1:-1], (ids + task.english_size).flip(0))
    assert torch.equal(task.sentence_input(ids, 0)[1:-1], ids)


def test_no_parallel_halves_are_disjoint(fake_english_data):
    task = make_task(fake_english_data, no_parallel=True)
    sentences = task.load_split_sentences("train")
    task.load_dataset("train")
    dataset = task.datasets["train"]
    items = [(dataset[i]["tokens"], dataset[i]["lang"]) for i in range(len(dataset))]
    english = {tuple(t[1:-1].tolist()) for t, lang in items if lang == 0}
    fake = {tuple((t[1:-1] - task.english_size).tolist()) for t, lang in items if lang == 1}
    half = len(sentences) // 2
    assert english == {tuple(s.tolist()) for s in sentences[:half]}
    assert fake == {tuple(s.tolist()) for s in sentences[half:]}
    assert len(items) == len(sentences)


def test_dev_targets_are_masked_only(fake_english_data, tmp_path):
    """Validation perplexity measures what Table 1's dev column does, whatever corruption training uses."""
    write_twin_table(make_task(fake_english_data), tmp_path / "knn.pt")
    task = make_task(fake_english_data, knn_replace=3, knn_table=str(tmp_path / "knn.pt"))
    train, valid = batches(task, "train", n=1)[0], batches(task, "valid", n=3)
    assert task.datasets["train"].masker.probs == (0.5, 0.1, 0.1, 0.3)
    mask_ids = torch.tensor([task.specials_of(0)[2], task.specials_of(1)[2]])
    for batch in valid:
        targets = batch["target"] != task.dictionary.pad()
        assert targets.any() and torch.isin(batch["net_input"]["src_tokens"][targets], mask_ids).all()
    targets = train["target"] != task.dictionary.pad()
    assert not torch.isin(train["net_input"]["src_tokens"][targets], mask_ids).all()


def test_same_seed_same_masks_new_epoch_new_masks(fake_english_data):
    first = batches(make_task(fake_english_data), n=3)
    again = batches(make_task(fake_english_data), n=3)
    later = batches(make_task(fake_english_data), n=3, epoch=2)
    for a, b in zip(first, again):
        assert torch.equal(a["net_input"]["src_tokens"], b["net_input"]["src_tokens"])
    assert not torch.equal(first[0]["target"], later[0]["target"]) or not torch.equal(first[0]["id"], later[0]["id"])


def test_bad_input_is_refused(fake_english_data, tmp_path):
    with pytest.raises(XmlmError, match="knn-table"):
        make_task(fake_english_data, knn_replace=3).build_masker()
    other = make_task(fake_english_data)
    write_twin_table(other, tmp_path / "knn.pt")
    table = torch.load(tmp_path / "knn.pt")
    table["dict_md5"] = "0" * 32
    torch.save(table, tmp_path / "other.pt")
    with pytest.raises(XmlmError, match="another vocabulary"):
        make_task(fake_english_data, knn_replace=3, knn_table=str(tmp_path / "other.pt")).build_masker()
    with pytest.raises(XmlmError, match="sum to 1"):
        make_task(fake_english_data, replacement_probs="0.5,0.1,0.1,0.1", knn_replace=3)
    with pytest.raises(XmlmError, match="no-random"):
        make_task(fake_english_data, no_random=True, replacement_probs="0.8,0.1,0.1")
    with pytest.raises(XmlmError, match="dictionary"):
        make_task(tmp_path)


def test_specials_follow_each_rows_content_as_the_papers_code_shifts_them():
    # V = 10, specials bos 0, eos 2, unk 3, mask 9 (their twins + 10), pad 1; words 4-8 English, 14-18 Fake
    specials, pad = torch.tensor([0, 2, 3, 9]), 1
    rows = torch.tensor([[0, 4, 9, 16, 2, 1],     # English, a random Fake word drawn: Fake specials
                         [0, 4, 9, 5, 2, 1],      # English, English words only: unchanged
                         [10, 14, 19, 15, 12, 1],  # Fake, its own specials: unchanged
                         [10, 4, 19, 5, 12, 1],    # Fake, every word replaced by English ones: English specials
                         [0, 3, 13, 4, 2, 1]])     # an English <unk>, a Fake one: the Fake <unk> is no content
    assert specials_follow_content(rows, 10, specials).tolist() == [[10, 4, 19, 16, 12, 1], [0, 4, 9, 5, 2, 1],
                                                                   [10, 14, 19, 15, 12, 1], [0, 4, 9, 5, 2, 1],
                                                                   [0, 3, 3, 4, 2, 1]]


def content_rule_holds(inputs, v, specials):
    """Asserts that every row's specials are Fake-English's exactly when it holds a Fake-English word (the rule,
    tested above, leaves such a batch as it is); returns which rows hold one (their bos is Fake-English's)."""
    assert torch.equal(specials_follow_content(inputs, v, specials), inputs)
    return inputs[:, 0] >= v


def test_shift_special_after_masking_gives_english_rows_with_a_fake_word_fake_specials(fake_english_data):
    with pytest.raises(XmlmError, match="give both"):
        make_task(fake_english_data, shift_special_after_masking=True)
    task = make_task(fake_english_data, shift_special=True, shift_special_after_masking=True)
    v, specials = task.content_specials()
    english_rows = fake_rows_of_english = 0
    for batch in batches(task, n=10):
        inputs, langs = batch["net_input"]["src_tokens"], batch["net_input"]["lang_ids"]
        fake_row = content_rule_holds(inputs, v, specials)
        english_rows += int((langs == 0).sum())
        fake_rows_of_english += int(fake_row[langs == 0].sum())
    # about .15 x .1 x .5 of the tokens are random Fake words: a fifth of the Bible's long English rows hold one
    assert english_rows > 500 and 0.05 < fake_rows_of_english / english_rows < 0.4
    plain = make_task(fake_english_data, shift_special=True)
    assert plain.content_specials() is None
    assert all(bool((b["net_input"]["src_tokens"][b["net_input"]["lang_ids"] == 0, 0] < v).all())
               for b in batches(plain, n=10))


FLAGS = {
    "lang-pos": ["--lang-pos"], "shift-special": ["--shift-special"], "no-random": ["--no-random"],
    "inv-order": ["--inv-order"], "no-parallel": ["--no-parallel"], "knn-replace": ["--knn-replace", "3"],
    "overparam": ["--arch", "xmlm_bert_base", "--lr", "1e-4"],
    "attend-padding": ["--attend-padding"], "no-random-.9": ["--no-random", "--no-random-mask-share", "0.9"],
}


@pytest.mark.parametrize("name", list(FLAGS))
def test_training_run_per_flag_loads_back_with_every_layer(name, fake_english_data, tmp_path):
    extra = list(FLAGS[name])
    if name == "knn-replace":
        write_twin_table(make_task(fake_english_data), tmp_path / "knn.pt")
        extra += ["--knn-table", str(tmp_path / "knn.pt")]
    if name == "overparam":  # BERT-base on a CPU: a smaller batch, and no Adam moments written and read back
        extra += ["--no-save-optimizer-state"]
    log = fairseq_train(fake_english_data, tmp_path / "ck", "--task", "fake_english", *extra, updates=4,
                        batch_size=8 if name == "overparam" else 32)
    assert "num_updates 4" in log or "num_updates=4" in log
    model, task, cfg = load_checkpoint(tmp_path / "ck" / "checkpoint_last.pt")
    flag = name.replace("-", "_")
    if hasattr(cfg.task, flag):
        assert getattr(cfg.task, flag)
    ids = task.load_split_sentences("valid")[0]
    tokens = torch.stack([task.sentence_input(ids, 0), task.sentence_input(ids, 1)])
    states = model.encode_layers(tokens, torch.tensor([0, 1]))
    assert len(states) == 13 and states[8].shape == (2, len(ids) + 2, model.cfg.encoder_embed_dim)
    assert all(torch.isfinite(s).all() for s in states)


WORKER_SCRIPT = """
import sys, torch
from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask
task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=sys.argv[1], seed=1))
task.load_dataset("train")
iterator = task.get_batch_iterator(task.datasets["train"], max_sentences=256, seed=1, num_workers=1)
loader = iterator.next_epoch_itr(shuffle=True)
print(sum(batch["nsentences"] for batch in loader))
"""


def test_a_data_loader_worker_serves_every_sentence_of_an_epoch(fake_english_data, tmp_path):
    """Masking runs in the collater, so in data-loader worker processes: a real worker serves the whole epoch."""
    import subprocess
    import sys

    script = tmp_path / "workers.py"
    script.write_text(WORKER_SCRIPT)
    result = subprocess.run([sys.executable, str(script), str(fake_english_data)], capture_output=True, text=True,
                            timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert int(result.stdout.split()[-1]) == 2 * len(make_task(fake_english_data).load_split_sentences("train"))


def test_attend_padding_draws_random_mixed_batches_anew_each_epoch_without_an_attention_mask(fake_english_data):
    """--attend-padding: the paper code's batches (a random sampler over both languages' lines, no attention mask),
    against the default's batches of sentences of about one length (6 lengths at most in the first 10 batches of
    256, against 46-54 in random batches)."""
    def lengths(batch):
        return len(set(batch["net_input"]["src_tokens"].ne(1).sum(1).tolist()))

    default = batches(make_task(fake_english_data), n=10)
    mixed = batches(make_task(fake_english_data, attend_padding=True), n=10)
    later = batches(make_task(fake_english_data, attend_padding=True), n=10, epoch=2)
    assert all(lengths(batch) <= 8 for batch in default)
    # the default's padding is masked (has_padding: some row is shorter than the batch)
    assert all(batch["net_input"]["has_padding"] == (lengths(batch) > 1) for batch in default)
    for batch in mixed:
        assert lengths(batch) > 30 and batch["net_input"]["has_padding"] is False
    task = make_task(fake_english_data, attend_padding=True)
    task.load_dataset("train")
    items = len(task.datasets["train"])
    for epoch in (mixed, later):  # the first 10 batches of 256: about as many English as Fake sentences
        ids = torch.cat([batch["id"] for batch in epoch])
        assert abs(int((ids < items // 2).sum()) - len(ids) / 2) < 5 * (len(ids) / 4) ** 0.5
    assert len(set(mixed[0]["id"].tolist()) & set(later[0]["id"].tolist())) < 30  # other sentences in epoch 2
