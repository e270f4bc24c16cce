"""Real end-to-end XNLI / NER / parsing fine-tuning on English and zero-shot French evaluation, on files written in
the release formats from Bible verses, with the tiny real en-fr checkpoint of conftest; plus the fairseq-train path.

The labels are made by simple rules (a capitalised word inside a verse is an entity; every word attaches to the
previous one) so the files are well-formed and learnable, not linguistically meaningful."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TIMEOUT
from fairseq_xmlm.data.preparation import moses_tokenize
from fairseq_xmlm.zeroshot import run, sweep
from fairseq_xmlm.zeroshot.benchmark import TASKS, Benchmark
from fairseq_xmlm.zeroshot.finetune import FinetuneConfig
from fairseq_xmlm.zeroshot.ner import spans

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


def short_verses(bible_dir, lang, count, skip=0):
    """Moses-tokenized Genesis verses of at most 20 words (never in the checkpoint's pretraining books)."""
    lines = (bible_dir / f"{lang}.txt").read_text(encoding="utf-8").splitlines()[:1533]
    tokens = moses_tokenize([line for line in lines if line.strip()], lang, lowercase=False)
    return [line.split() for line in tokens if 4 <= len(line.split()) <= 20][skip : skip + count]


def write_xnli(path, rows, with_language):
    """rows: (language, words of a verse, words of another verse); label by construction."""
    header = "language\tsentence1\tsentence2\tgold_label" if with_language else "premise\thypo\tlabel"
    lines = [header]
    for index, (lang, words, other) in enumerate(rows):
        label = ("entailment", "neutral", "contradictory" if not with_language else "contradiction")[index % 3]
        hypothesis = {0: words[: len(words) // 2], 1: words + other[:3], 2: other}[index % 3]
        cells = [" ".join(words), " ".join(hypothesis), label]
        lines.append("\t".join([lang, *cells] if with_language else cells))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def entity_tags(words):
    tags = []
    for position, word in enumerate(words):
        entity = position > 0 and word[:1].isupper()
        tags.append(("I-ENT" if tags and tags[-1] != "O" else "B-ENT") if entity else "O")
    return tags


def write_bio(path, sentences, prefix=""):
    blocks = ["\n".join(f"{prefix}{w}\t{t}" for w, t in zip(words, entity_tags(words))) for words in sentences]
    path.write_text("-DOCSTART- O\n\n" + "\n\n".join(blocks) + "\n", encoding="utf-8")


def chain_tree(words):
    """(heads, relations): word 1 is the root, every other word depends on the previous one."""
    heads = list(range(len(words)))
    rels = ["root"] + ["punct" if not w[:1].isalnum() else "flat:name" if w[:1].isupper() else "dep"
                       for w in words[1:]]
    return heads, rels


def write_conllu(path, sentences):
    blocks = []
    for number, words in enumerate(sentences, start=1):
        heads, rels = chain_tree(words)
        lines = [f"# sent_id = {number}", f"# text = {' '.join(words)}"]
        lines += [f"{i}\t{w}\t_\tX\t_\t_\t{h}\t{r}\t_\t_" for i, (w, h, r) in enumerate(zip(words, heads, rels), 1)]
        blocks.append("\n".join(lines))
    path.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")


@pytest.fixture(scope="module")
def task_files(bible_dir, tmp_path_factory):
    """{task: (train, dev, {lang: test})}: 40 English training sentences, 15 English dev, 20 French test."""
    root = tmp_path_factory.mktemp("zeroshot_tasks")
    en_train, en_dev = short_verses(bible_dir, "en", 40), short_verses(bible_dir, "en", 15, skip=40)
    fr_test = short_verses(bible_dir, "fr", 20)
    xnli = {name: root / f"xnli.{name}.tsv" for name in ("train", "dev", "test")}
    write_xnli(xnli["train"], [(None, w, en_train[i - 7]) for i, w in enumerate(en_train)], with_language=False)
    write_xnli(xnli["dev"], [("en", w, en_dev[i - 5]) for i, w in enumerate(en_dev)], with_language=True)
    # one XNLI test file holds every language; the French rows are selected by the language column
    write_xnli(xnli["test"], [("fr", w, fr_test[i - 5]) for i, w in enumerate(fr_test)]
               + [("en", w, en_dev[i - 5]) for i, w in enumerate(en_dev)], with_language=True)
    ner = {name: root / f"ner.{name}" for name in ("train", "dev", "test")}
    write_bio(ner["train"], en_train)
    write_bio(ner["dev"], en_dev)
    write_bio(ner["test"], fr_test, prefix="fr:")  # WikiAnn style
    ud = {name: root / f"ud.{name}.conllu" for name in ("train", "dev", "test")}
    write_conllu(ud["train"], en_train)
    write_conllu(ud["dev"], en_dev)
    write_conllu(ud["test"], fr_test)
    return {kind: (files["train"], files["dev"], {"fr": files["test"]})
            for kind, files in (("xnli", xnli), ("ner", ner), ("parse", ud))}, fr_test


def run_task(kind, checkpoint, task_files, out, *extra):
    train, dev, tests = task_files[0][kind]
    run.main([kind, "--checkpoint", str(checkpoint), "--train-file", str(train), "--dev-file", str(dev),
              *(f"--test-file={lang}={path}" for lang, path in tests.items()), "--out", str(out), *extra])
    return json.loads(out.read_text())


def test_xnli_end_to_end(en_fr_checkpoint, task_files, tmp_path):
    result = run_task("xnli", en_fr_checkpoint, task_files, tmp_path / "xnli.json", "--epochs", "3",
                      "--encoder-lr", "1e-4", "--head-lr", "1e-3")
    assert result["train_examples"] == 40 and len(result["history"]) == 3
    assert result["dev"]["en"] == max(epoch["dev_accuracy"] for epoch in result["history"])
    assert result["test"]["fr"]["examples"] == 20  # the English rows of the test file are not French
    assert 0 <= result["test"]["fr"]["accuracy"] <= 100
    assert result["config"]["schedule"] == "constant" and result["config"]["batch_size"] == 8


def test_ner_end_to_end(en_fr_checkpoint, task_files, tmp_path):
    result = run_task("ner", en_fr_checkpoint, task_files, tmp_path / "ner.json", "--epochs", "2", "--lr", "1e-3")
    french = task_files[1]
    assert result["test"]["fr"]["gold"] == sum(len(spans(entity_tags(words))) for words in french) > 0
    assert 0 <= result["test"]["fr"]["f1"] <= 100 and result["config"]["schedule"] == "warmup_linear"
    assert len(result["history"]) == 2 and "dev_f1" in result["history"][0]


def test_parse_end_to_end(en_fr_checkpoint, task_files, tmp_path):
    result = run_task("parse", en_fr_checkpoint, task_files, tmp_path / "parse.json", "--epochs", "2",
                      "--lr", "1e-3")
    scores = result["test"]["fr"]
    assert scores["words"] == sum(len(words) for words in task_files[1])
    assert 0 <= scores["las"] <= scores["uas"] <= 100
    assert 0 < result["dev"]["en"] <= 100


@pytest.mark.parametrize("kind", TASKS)
def test_language_specific_parameters_frozen_for_every_head(kind, en_fr_checkpoint, task_files):
    train, dev, tests = task_files[0][kind]
    benchmark = Benchmark(kind, en_fr_checkpoint, train, dev, tests)
    owned = benchmark.encoder.language_parameters()
    frozen = set(owned[0]) | set(owned[1])
    before = {name: p.detach().clone() for name, p in benchmark.encoder.named_parameters()}
    model, _ = benchmark.finetune(FinetuneConfig(batch_size=8, encoder_lr=1e-3, head_lr=1e-3, epochs=1))
    after = dict(model.encoder.named_parameters())
    assert all(torch.equal(after[name], before[name]) for name in frozen)
    changed = {name for name in set(before) - frozen if not torch.equal(after[name], before[name])}
    # every shared parameter on the path to the head moves (the MLM output layer is not on it)
    assert changed == {name for name in set(before) - frozen if not name.startswith("lm_")}
    # the pretrained encoder the benchmark keeps for the next run is untouched
    assert all(torch.equal(p, before[name]) for name, p in benchmark.encoder.named_parameters())


def test_sweep_over_ner_grid(en_fr_checkpoint, task_files, tmp_path):
    train, dev, tests = task_files[0]["ner"]
    out = tmp_path / "sweep.md"
    sweep.main(["--task", "ner", "--checkpoint", str(en_fr_checkpoint), "--train-file", str(train),
                "--dev-file", str(dev), "--test-file", f"fr={tests['fr']}", "--epochs", "1", "--out", str(out)])
    result = json.loads(out.with_suffix(".json").read_text())
    assert len(result["runs"]) == len(sweep.GRIDS["ner"]) == 6
    best = sorted(result["runs"], key=lambda r: -r["dev"])[:2]
    assert result["average_of_best_two"]["test_fr"] == pytest.approx((best[0]["test_fr"] + best[1]["test_fr"]) / 2)
    assert "Average of the best two settings selected on en dev" in out.read_text()


def test_bad_test_file_argument_is_one_error_line(en_fr_checkpoint, task_files, tmp_path):
    train, dev, _ = task_files[0]["ner"]
    result = subprocess.run([sys.executable, "-m", "fairseq_xmlm.zeroshot.run", "ner", "--checkpoint",
                             str(en_fr_checkpoint), "--train-file", str(train), "--dev-file", str(dev),
                             "--test-file", "fr.conll", "--out", str(tmp_path / "x.json")],
                            capture_output=True, text=True, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=TIMEOUT)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --test-file 'fr.conll': expected LANG=FILE, e.g. fr=xnli.test.tsv")
    assert not (tmp_path / "x.json").exists()


def test_fairseq_train_path(en_fr_checkpoint, task_files, tmp_path):
    """fairseq-train with the registered task / model / criterion / optimizer: a few updates, English dev and
    zero-shot French validation, a checkpoint whose language-specific parameters are the pretrained ones."""
    from fairseq_xmlm.checkpoints import safe_torch_load
    from fairseq_xmlm.zeroshot.finetune import load_pretrained

    train, _, tests = task_files[0]["xnli"]
    data = tmp_path / "xnli"
    data.mkdir()
    (data / "train.tsv").write_text(train.read_text(encoding="utf-8"), encoding="utf-8")
    (data / "valid.tsv").write_text(tests["fr"].read_text(encoding="utf-8"), encoding="utf-8")  # en + fr rows
    command = [str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir", "fairseq_xmlm",
               "--task", "zeroshot_sentence_classification", "--pretrained", str(en_fr_checkpoint),
               "--arch", "zeroshot_sentence_classifier", "--criterion", "zeroshot_cross_entropy",
               "--optimizer", "adam_head_lr", "--lr", "1e-4", "--head-lr", "1e-3", "--lr-scheduler", "fixed",
               "--batch-size", "8", "--max-update", "6", "--valid-subset", "valid_en,valid_fr",
               "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric", "--cpu",
               "--num-workers", "0", "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "1",
               "--save-dir", str(tmp_path / "ck")]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    log = result.stdout + result.stderr
    assert "num_updates 6" in log and "| accuracy " in log
    # every row is validated: 15 English dev rows, 20 French (fairseq would drop a last batch of 7)
    assert "valid on 'valid_en' subset" in log and "valid on 'valid_fr' subset" in log
    assert "| bsz 7.5 |" in log.split("valid on 'valid_en' subset")[-1].splitlines()[0]
    pretrained = safe_torch_load(en_fr_checkpoint)["model"]
    finetuned = safe_torch_load(tmp_path / "ck" / "checkpoint_last.pt")["model"]
    owned = load_pretrained(en_fr_checkpoint)[0].language_parameters()
    frozen = owned[0] + owned[1]
    assert frozen and all(torch.equal(finetuned[f"classifier.encoder.{n}"], pretrained[n]) for n in frozen)
    assert not torch.equal(finetuned["classifier.encoder.layers.1.0.attention.qkv.weight"],
                           pretrained["layers.1.0.attention.qkv.weight"])
    assert finetuned["classifier.head.weight"].shape == (3, 32)
