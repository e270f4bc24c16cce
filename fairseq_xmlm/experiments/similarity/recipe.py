"""Monolingual models en, fr, de, ru, zh and a second English seed en' (the paper's en'), each trained with the
bilingual_mlm task on ONE language of a verse-aligned data-bin, so item k of every valid/test split is the same
verse in every language; then `xmlm-analyze` compares en with each of them:

    word      en-fr, en-de, en-ru (FreeDict dictionaries; MUSE-style held-out test words)
    sentence  en-X for every X (including en')
    cka       en-X for every X, with a random encoder lower bound

Procrustes for `sentence`/`cka` is learned on 200 of the 429 held-out test verses, the rest are retrieved.
The Bibles, the data-bin, trained models and dictionaries that exist are kept, so an interrupted recipe resumes
with the next model to train; the analyses (minutes) run again.
"""
from pathlib import Path

from fairseq_xmlm.experiments.commands import python_module, run_command

LANGS = ("en", "fr", "de", "ru", "zh")
DICTIONARY_LANGS = ("fr", "de", "ru")  # FreeDict has en-X for these
PRESETS = {
    # a CPU, minutes: BERT-small, 200 updates, 2000 sentences
    "quick": {"arch": ["--arch", "xmlm_bert_small", "--lr", "2e-3", "--batch-size", "16", "--tokens-per-sample", "128"],
              "updates": 200, "sentences": 2000, "n_train": 200, "device": ["--cpu", "--num-workers", "0"],
              "analyze_device": "cpu", "fasttext": ["--fasttext-dim", "100", "--fasttext-epochs", "10"]},
    # a GPU: xmlm_conneau (8 layers, 768 dims)
    "full": {"arch": ["--arch", "xmlm_conneau", "--lr", "1e-4", "--batch-size", "32", "--tokens-per-sample", "256"],
             "updates": 50000, "sentences": 10000, "n_train": 200, "device": [], "analyze_device": "cuda",
             "fasttext": []},
}


def prepare(corpus, data, dry_run):
    """The Bibles fetched and one sentencepiece model per language (`separate`: a monolingual model sees only its
    own pieces), verse-aligned."""
    if not (corpus / "zh.txt").is_file():
        run_command([*python_module("fairseq_xmlm.data.bible"), "--out", corpus, "--versions",
                     "en:3,fr:l,de:s,ru:r,zh:c"], dry_run)
    if not (data / "dict.txt").is_file():
        run_command([*python_module("fairseq_xmlm.data.prepare"), "pair", "--corpus-dir", corpus, "--langs",
                     ",".join(LANGS), "--mode", "separate", "--out", data], dry_run)


def train(name, lang, seed, data, checkpoints, preset, dry_run):
    save_dir = checkpoints / name
    if (save_dir / "checkpoint_best.pt").is_file():
        return
    updates = preset["updates"]
    run_command([*python_module("fairseq_cli.train"), data, "--user-dir", Path(__file__).resolve().parents[2],
                 "--task", "bilingual_mlm", "--langs", lang, *preset["arch"], "--criterion", "masked_lm",
                 "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.01",
                 "--lr-scheduler", "polynomial_decay", "--warmup-updates", updates // 20, "--total-num-update",
                 updates, "--max-update", updates, "--valid-subset", "valid", "--save-dir", save_dir, "--seed", seed,
                 "--no-epoch-checkpoints", "--log-format", "simple", "--log-interval", "50", *preset["device"]],
                dry_run)


def fetch_dictionary(lang, corpus, dictionaries, dry_run):
    """en-LANG from FreeDict with 100 held-out test words: (training file, test file)."""
    path = dictionaries / f"en-{lang}.txt"
    if not path.is_file():
        run_command([*python_module("fairseq_xmlm.data.freedict"), "--pair", f"en-{lang}", "--vocab",
                     corpus / "en.txt", "--tgt-vocab", corpus / f"{lang}.txt", "--test-size", "100", "--out", path],
                    dry_run)
    return path, path.with_name(path.name + ".test")


def analyze(name, checkpoints, out, preset, dry_run, dictionary=None):
    """en against model `name`: sentence and cka on the test split, word on the train split given a dictionary."""
    common = ["--model-a", checkpoints / "en" / "checkpoint_best.pt", "--lang-a", "0",
              "--model-b", checkpoints / name / "checkpoint_best.pt", "--lang-b", "0",
              "--max-sentences", preset["sentences"], "--n-train", preset["n_train"],
              "--device", preset["analyze_device"], "--out", out]
    if not dry_run:
        out.mkdir(parents=True, exist_ok=True)
    analysis = python_module("fairseq_xmlm.analysis.cli")
    run_command([*analysis, "sentence", *common, "--split", "test"], dry_run)
    run_command([*analysis, "cka", *common, "--split", "test"], dry_run)
    if dictionary:
        run_command([*analysis, "word", *common, "--split", "train", "--dict-train", dictionary[0],
                     "--dict-test", dictionary[1], *preset["fasttext"]], dry_run)


def run_all(preset, corpus, data, checkpoints, results, dry_run):
    prepare(corpus, data, dry_run)
    for lang in LANGS:
        train(lang, lang, 1, data, checkpoints, preset, dry_run)
    train("en_prime", "en", 2, data, checkpoints, preset, dry_run)  # the paper's en': same data, another seed
    for lang in (*LANGS[1:], "en_prime"):
        dictionary = (fetch_dictionary(lang, corpus, results / "dicts", dry_run) if lang in DICTIONARY_LANGS
                      else None)
        analyze(lang, checkpoints, results / f"en-{lang}", preset, dry_run, dictionary)
