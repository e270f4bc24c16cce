"""bilingual_mlm (Conneau et al.) on real Bible text: 0.7 language sampling, single-language batches, within / cross
random words, the Sep-Emb softmax, checkpoints, one real run of every Table 1 row, and bad input."""
import copy
import dataclasses
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq.data import data_utils, indexed_dataset

from conftest import REPO, TIMEOUT
from fairseq_xmlm.checkpoints import load_checkpoint, safe_torch_load
from fairseq_xmlm.experiments.conneau.runs import SETTINGS
from fairseq_xmlm.models.partially_shared_roberta import PartiallySharedRoberta, PartiallySharedRobertaConfig
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.tasks.bilingual_mlm import BilingualMLMConfig, BilingualMLMTask, LanguageBatches, cut_streams
from fairseq_xmlm.tasks.contract import LanguageTask
from fairseq_xmlm.vocabulary import dictionary_fingerprint, load_data_dictionary, load_split_sentences

LAYERS = 6
TINY = ["--encoder-layers", str(LAYERS), "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--encoder-attention-heads", "2", "--tokens-per-sample", "64"]


# --- data ------------------------------------------------------------------------------------------------------
def raw_items(data, name):
    """The items of data/name.{bin,idx} as fairseq-preprocess stored them (trailing eos included)."""
    return [item.long() for item in indexed_dataset.MMapIndexedDataset(str(Path(data) / name))]


def vocabulary(data, lang, splits=("train",)):
    """Ids occurring in the given splits of a language, read straight from the binary files (eos = 2 left out)."""
    return {int(i) for split in splits for item in raw_items(data, f"{split}.{lang}") for i in item[:-1]}


@pytest.fixture(scope="module")
def prefixed_data(bible_dir, tmp_path_factory):
    """The same pair with language-prefixed pieces: no symbol shared ("No anchors")."""
    from fairseq_xmlm.data.preparation import prepare_pair

    out = tmp_path_factory.mktemp("data-bin") / "bible_en_fr_prefixed"
    prepare_pair(bible_dir, ["en", "fr"], "prefixed", 300, out, train_books="Mark,Luke", valid_books="Jonah",
                 test_books="Philippians")
    return out


@pytest.fixture(scope="module")
def unequal_data(bible_en_fr_data, tmp_path_factory):
    """The en-fr pair with French training text cut to its first quarter of verses."""
    out = tmp_path_factory.mktemp("data-bin") / "unequal"
    shutil.copytree(bible_en_fr_data, out)
    french = raw_items(bible_en_fr_data, "train.fr")
    builder = indexed_dataset.make_builder(str(out / "train.fr.bin"), impl="mmap", vocab_size=100_000)
    for item in french[: len(french) // 4]:
        builder.add_item(item)
    builder.finalize(str(out / "train.fr.idx"))
    return out


def make_task(data, **config):
    return BilingualMLMTask.setup_task(BilingualMLMConfig(data=str(data), langs="en,fr", tokens_per_sample=64,
                                                          seed=1, **config))


# --- language sampling -------------------------------------------------------------------------------------------
def test_languages_are_sampled_by_sentence_share_to_the_power_0_7(unequal_data):
    task = make_task(unequal_data)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    counts = np.array([len(raw_items(unequal_data, f"train.{lang}")) for lang in ("en", "fr")])
    share = counts / counts.sum()
    expected = share**0.7 / (share**0.7).sum()
    assert share[1] < 0.25
    np.testing.assert_allclose(dataset.language_probabilities, expected)

    stream_langs = dataset.langs
    batches = LanguageBatches(stream_langs, dataset.language_probabilities, batch_size=8, seed=1, resample=True)
    drawn = np.concatenate([stream_langs[np.concatenate(batches(dataset, epoch))] for epoch in range(1, 41)])
    assert abs(drawn.mean() - expected[1]) < 0.01
    assert drawn.mean() > share[1] + 0.05  # the smaller language is upsampled


def test_one_iterator_for_the_run_resamples_every_epoch(unequal_data):
    task = make_task(unequal_data)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    iterator = task.get_batch_iterator(dataset, max_sentences=8, seed=1, epoch=1)
    assert task.get_batch_iterator(dataset, max_sentences=8, seed=1, epoch=2) is iterator  # workers live on
    epochs = []
    for _ in range(3):
        epochs.append([batch["id"].tolist() for batch in iterator.next_epoch_itr(shuffle=True)])
    assert iterator.epoch == 3
    assert epochs[0] != epochs[1] != epochs[2]  # new language draws, batches and contents each epoch


def test_every_batch_is_one_language_and_carries_its_id(unequal_data):
    task = make_task(unequal_data)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    iterator = task.get_batch_iterator(dataset, max_sentences=8, seed=1, epoch=1).next_epoch_itr(shuffle=True)
    per_lang = np.zeros(2)
    french_vocabulary = vocabulary(unequal_data, "fr")
    english_only = vocabulary(unequal_data, "en") - french_vocabulary
    for batch in iterator:
        langs = batch["net_input"]["lang_ids"]
        assert (langs == langs[0]).all() and len(langs) <= 8
        per_lang[int(langs[0])] += len(langs)
        if langs[0] == 1:  # French streams hold French text (their unmasked targets are French pieces)
            targets = batch["target"][batch["target"].ne(task.dictionary.pad())]
            assert not set(targets.tolist()) & english_only
    assert abs(per_lang[1] / per_lang.sum() - dataset.language_probabilities[1]) < 0.02


def test_streams_are_256_token_blocks_starting_with_bos(bible_en_fr_data):
    task = BilingualMLMTask.setup_task(BilingualMLMConfig(data=str(bible_en_fr_data), langs="en,fr", seed=1))
    task.load_dataset("valid_en")
    dataset = task.datasets["valid_en"]
    items = [(dataset[i]["tokens"], dataset[i]["lang"]) for i in range(len(dataset))]
    assert {lang for _, lang in items} == {0}
    assert all(tokens[0] == task.dictionary.bos() and len(tokens) <= 256 for tokens, _ in items)
    assert sum(len(tokens) == 256 for tokens, _ in items) >= len(items) - 1
    words = sum(len(s) for s in raw_items(bible_en_fr_data, "valid.en"))  # pieces + one </s> per verse
    assert sum(len(tokens) - 1 for tokens, _ in items) == words


def assert_same_batch(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], dict):
            assert_same_batch(a[key], b[key])
        elif torch.is_tensor(a[key]):
            assert torch.equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("random_replace", ["cross", "within"])
def test_batches_read_whole_are_the_batches_read_item_by_item(bible_en_fr_data, random_replace):
    """The collater's whole-batch path (__getitems__, pad_right, one sort to rank) gives the earlier item-by-item
    path's batches (per_item: __getitem__, fairseq's collate_tokens, sorting twice), masks included, through
    fairseq's iterator over two epochs of the shuffled train split and over the unshuffled valid split."""
    task = make_task(bible_en_fr_data, random_replace=random_replace)
    padded = 0
    for split, epochs in (("train", (1, 2)), ("valid", (1,))):
        task.load_dataset(split)
        new = task.datasets[split]
        old = copy.copy(new)
        old.per_item, old.masker = True, dataclasses.replace(new.masker, sort_twice=True)
        for epoch in epochs:
            old_batches, new_batches = (
                list(task.get_batch_iterator(dataset, max_sentences=8, seed=1, epoch=epoch,
                                             disable_iterator_cache=True).next_epoch_itr(shuffle=True))
                for dataset in (old, new))
            assert len(old_batches) == len(new_batches) > 0
            for old_batch, new_batch in zip(old_batches, new_batches):
                assert_same_batch(old_batch, new_batch)
                padded += old_batch["net_input"]["has_padding"]
    assert padded > 0  # some batch holds a short last stream: the padding is compared too


# --- random words ------------------------------------------------------------------------------------------------
def french_replacements(data, random_replace):
    """(replaced ids, task): every target of 300 French streams replaced by a random word (MASK,KEEP,RANDOM=0,0,1)."""
    task = make_task(data, random_replace=random_replace, replacement_probs="0,0,1", mask_prob=0.5)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    french = [i for i, lang in enumerate(dataset.langs) if lang == 1][:300]
    batch = dataset.collater([dataset[i] for i in french])
    targets = batch["target"].ne(task.dictionary.pad())
    return batch["net_input"]["src_tokens"][targets], batch["target"][targets], task


def test_within_draws_only_words_of_the_language(bible_en_fr_data):
    replaced, original, _ = french_replacements(bible_en_fr_data, "within")
    assert (replaced != original).float().mean() > 0.9
    assert set(replaced.tolist()) <= vocabulary(bible_en_fr_data, "fr")


def test_cross_draws_from_the_whole_vocabulary(bible_en_fr_data):
    replaced, original, task = french_replacements(bible_en_fr_data, "cross")
    drawn = set(replaced.tolist())
    assert drawn - vocabulary(bible_en_fr_data, "fr")  # English-only pieces among them
    assert not drawn & task.special_ids


def test_none_keeps_the_random_share_as_the_original_word(bible_en_fr_data):
    replaced, original, _ = french_replacements(bible_en_fr_data, "none")
    assert torch.equal(replaced, original)


def test_no_random_is_random_replace_none(bible_en_fr_data):
    """One policy for both tasks: --no-random moves the RANDOM share to KEEP as --random-replace none does, and
    refuses an explicit RANDOM share (which --random-replace none folds)."""
    assert make_task(bible_en_fr_data, no_random=True).replacement_probs == (0.8, 0.2, 0.0, 0.0)
    assert make_task(bible_en_fr_data, random_replace="none").replacement_probs == (0.8, 0.2, 0.0, 0.0)
    assert make_task(bible_en_fr_data, random_replace="none", replacement_probs="0.5,0.2,0.3").replacement_probs \
        == (0.5, 0.5, 0.0, 0.0)
    with pytest.raises(XmlmError, match="--no-random contradicts a RANDOM probability"):
        make_task(bible_en_fr_data, no_random=True, replacement_probs="0,0,1")
    with pytest.raises(XmlmError, match="--no-random contradicts --random-replace within"):
        make_task(bible_en_fr_data, no_random=True, random_replace="within")


def test_knn_replace_draws_from_the_table_of_the_shared_dictionary(bible_en_fr_data, tmp_path):
    """The knn flags are bilingual_mlm's too: every target becomes one of its two listed neighbours."""
    dictionary = make_task(bible_en_fr_data).dictionary
    ids = torch.arange(len(dictionary))
    neighbours = torch.stack([(ids + 1) % len(dictionary), (ids + 7) % len(dictionary)], dim=1)
    torch.save({"neighbours": neighbours, "dict_size": len(dictionary), "k": 2, "langs": ["en", "fr"],
                "dict_md5": dictionary_fingerprint(dictionary)}, tmp_path / "knn.pt")
    task = make_task(bible_en_fr_data, knn_replace=2, knn_table=str(tmp_path / "knn.pt"),
                     replacement_probs="0,0,0,1", mask_prob=0.5)
    task.load_dataset("train")
    dataset = task.datasets["train"]
    batch = dataset.collater([dataset[i] for i in range(200)])
    targets = batch["target"].ne(task.dictionary.pad())
    replaced, original = batch["net_input"]["src_tokens"][targets], batch["target"][targets]
    assert len(original) > 1000
    assert ((replaced == neighbours[original, 0]) | (replaced == neighbours[original, 1])).all()
    assert (replaced == neighbours[original, 1]).float().mean() == pytest.approx(0.5, abs=0.05)
    with pytest.raises(XmlmError, match="needs a KNN probability"):
        make_task(bible_en_fr_data, knn_replace=2, knn_table=str(tmp_path / "knn.pt"), replacement_probs="0.8,0.1,0.1")
    assert make_task(bible_en_fr_data, knn_replace=2, knn_table=str(tmp_path / "knn.pt")).replacement_probs == \
        (0.5, 0.1, 0.1, 0.3)


def test_the_task_fulfils_the_evaluation_contract(bible_en_fr_data):
    task = make_task(bible_en_fr_data)
    assert isinstance(task, LanguageTask)
    assert task.mask_symbol(1) == task.dictionary.index("<mask>") and not task.reverses(1) and not task.lang_pos


# --- separate softmax --------------------------------------------------------------------------------------------
def test_sep_emb_softmax_covers_only_the_language_vocabulary(bible_en_fr_data):
    task = make_task(bible_en_fr_data)
    cfg = PartiallySharedRobertaConfig(encoder_layers=1, encoder_embed_dim=16, encoder_ffn_embed_dim=32,
                                       encoder_attention_heads=2, sep_emb=True)
    model = PartiallySharedRoberta.build_model(cfg, task).eval()
    french = sorted(vocabulary(bible_en_fr_data, "fr", ("train", "valid", "test")))
    english_only = sorted(vocabulary(bible_en_fr_data, "en", ("train", "valid", "test")) - set(french))
    assert len(english_only) > 20
    tokens = task.sentence_input(task.load_split_sentences("valid", 1)[0], 1).unsqueeze(0)
    logits, _ = model(tokens, lang_ids=torch.tensor([1]))
    finite = torch.isfinite(logits[0])
    assert finite[:, french].all() and not finite[:, english_only].any()
    allowed = sorted(set(french) | task.special_ids)  # + bos, eos, ..., which are never targets
    assert torch.allclose(logits[0].softmax(-1)[:, allowed].sum(-1), torch.ones(tokens.size(1)))


# --- real runs of every Table 1 row (and bad input), run three at a time -------------------------------------------
def train_command(data, save_dir, *extra):
    return [
        str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir", str(REPO / "fairseq_xmlm"),
        "--task", "bilingual_mlm", "--langs", "en,fr", "--arch", "xmlm_conneau", *TINY, "--criterion", "masked_lm",
        "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4",
        "--warmup-init-lr", "1e-4", "--batch-size", "8", "--max-update", "1", "--save-dir", str(save_dir), "--cpu",
        "--num-workers", "0", "--valid-subset", "valid_en,valid_fr", "--max-valid-steps", "1",
        "--no-epoch-checkpoints", "--log-format", "simple", "--seed", "1", *extra,
    ]


def run(command):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env, timeout=TIMEOUT)


@pytest.fixture(scope="module")
def foreign_dictionary_data(bible_en_fr_data, prefixed_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("data-bin") / "foreign_dictionary"
    shutil.copytree(bible_en_fr_data, out)
    shutil.copy(prefixed_data / "dict.txt", out / "dict.txt")
    return out


# Training data per row: prefixed pieces for No anchors, joint pieces for the rest. Default anchors and Extra
# anchors differ from Default only in how their data is prepared (test_prepare), so they share its run here.
ROW_RUN = {name: (setting.data == "prefixed", setting.train_args) for name, setting in SETTINGS.items()}


@pytest.fixture(scope="module")
def runs(bible_en_fr_data, prefixed_data, foreign_dictionary_data, tmp_path_factory):
    """{row or bad input: (completed process, save dir)}: one update of every distinct row and three bad inputs,
    four fairseq-train processes at a time."""
    root = tmp_path_factory.mktemp("runs")
    jobs = {(prefixed, args): (prefixed_data if prefixed else bible_en_fr_data, args)
            for prefixed, args in ROW_RUN.values()}
    jobs["bad_sep_layers"] = (bible_en_fr_data, ("--sep-layers", "5-7"))
    jobs["bad_language"] = (bible_en_fr_data, ("--langs", "en,de"))
    jobs["bad_dictionary"] = (foreign_dictionary_data, ())
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {key: pool.submit(run, train_command(data, root / str(k), *extra))
                   for k, (key, (data, extra)) in enumerate(jobs.items())}
    done = {key: (future.result(), root / str(k)) for k, (key, future) in enumerate(futures.items())}
    bad_inputs = {key: result for key, result in done.items() if isinstance(key, str)}
    return {**{name: done[key] for name, key in ROW_RUN.items()}, **bad_inputs}


def owned_prefixes(setting):
    """The parameter groups a setting's flags make language-specific."""
    args = list(setting.train_args)
    prefixes = {"token_embeddings", "position_embeddings", "lm_bias"} if "--sep-emb" in args else set()
    if "--sep-layers" in args:
        last = int(args[args.index("--sep-layers") + 1].split("-")[1])
        prefixes |= {f"layers.{i}" for i in range(last)}
    return prefixes


def at_init(name, tensor):
    """True while a parameter with a known initial value (biases 0, LayerNorm weights 1) still has it."""
    return bool((tensor == (1.0 if name.endswith("norm.weight") else 0.0)).all())


@pytest.mark.parametrize("name", list(SETTINGS))
def test_every_row_trains_and_routes_by_language(runs, name):
    process, save_dir = runs[name]
    assert process.returncode == 0, process.stderr[-3000:]
    log = process.stdout + process.stderr
    assert "valid on 'valid_en' subset" in log and "valid on 'valid_fr' subset" in log
    model, task, cfg = load_checkpoint(save_dir / "checkpoint_best.pt")
    owned = model.language_parameters()
    expected = owned_prefixes(SETTINGS[name])
    for names in owned.values():
        assert {".".join(n.split(".")[:2]) if n.startswith("layers.") else n.split(".")[0] for n in names} == expected
    # One update saw one batch of one language: the other language's own parameters never moved.
    params = dict(model.named_parameters())
    known = {lang: [n for n in names if n.startswith("lm_bias") or n.endswith(("bias", "norm.weight"))]
             for lang, names in owned.items()}
    untouched = [lang for lang in owned if known[lang] and all(at_init(n, params[n]) for n in known[lang])]
    assert len(untouched) == (1 if expected else 0)
    assert not at_init("layers.5.0.ffn_norm.bias", params["layers.5.0.ffn_norm.bias"])  # shared top layer learnt


def test_checkpoint_round_trip_keeps_the_language_structure(runs):
    _, save_dir = runs["sep_emb_l1_3"]
    path = save_dir / "checkpoint_last.pt"
    model, task, cfg = load_checkpoint(path)
    state = safe_torch_load(path, map_location="cpu")["model"]
    assert list(task.langs) == ["en", "fr"] and cfg.model.sep_emb and cfg.model.sep_layers == "1-3"
    owned = model.language_parameters()
    assert set(owned) == {0, 1} and not set(owned[0]) & set(owned[1])
    assert {"token_embeddings.1.weight", "position_embeddings.1.weight", "lm_bias.1",
            "layers.2.1.ffn_out.weight"} <= set(owned[1])
    assert not any(n.startswith("layers.3.") for n in owned[0] + owned[1])
    assert set(state) == set(model.state_dict())
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert torch.equal(model.vocab_masks, task.language_vocab_masks())


@pytest.mark.parametrize("name,message", [
    ("bad_sep_layers", f"--sep-layers 5-7 is outside the model's layers 1-{LAYERS}"),
    ("bad_language", "language(s) de not in"),
    ("bad_dictionary", "the dictionary belongs to other data"),
])
def test_bad_input_ends_in_one_clear_line(runs, name, message):
    process, save_dir = runs[name]
    assert process.returncode == 2 and "Traceback" not in process.stderr
    last = process.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last
    assert not (save_dir / "checkpoint_last.pt").exists()


def test_cut_streams_closes_each_sentence_and_opens_each_block():
    sentences = [torch.tensor([5, 6, 7]), torch.tensor([8]), torch.tensor([], dtype=torch.long), torch.tensor([9, 10])]
    # stream 5 6 7 </s> 8 </s> </s> 9 10 </s> in bodies of 3, each after <s>; a last body of one token is dropped
    streams = cut_streams(sentences, eos=2, bos=0, tokens_per_sample=4)
    assert [s.tolist() for s in streams] == [[0, 5, 6, 7], [0, 2, 8, 2], [0, 2, 9, 10]]
    assert [s.tolist() for s in cut_streams(sentences[:2], eos=2, bos=0, tokens_per_sample=4)] == [[0, 5, 6, 7],
                                                                                                  [0, 2, 8, 2]]
    assert cut_streams([], eos=2, bos=0, tokens_per_sample=4) == []


def test_split_sentences_read_in_one_piece_are_the_items_without_their_eos(bible_en_fr_data):
    dictionary = load_data_dictionary(bible_en_fr_data)
    items = data_utils.load_indexed_dataset(os.path.join(bible_en_fr_data, "train.fr"), dictionary, "mmap")
    sentences = load_split_sentences(bible_en_fr_data, "train", "fr", dictionary)
    assert len(sentences) == len(items) > 1000
    for i in range(0, len(items), 97):
        assert items[i][-1] == dictionary.eos() and torch.equal(sentences[i], items[i][:-1].long())
