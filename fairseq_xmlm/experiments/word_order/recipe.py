"""Table 4's recipe: the Bibles, each language's word order against English, and the zero-shot accuracies.

Word order of a language (Dufter & Schütze, Appendix B.2, on the Bible instead of XNLI): a fixed sample of
parallel verses of the genre benchmark's held-out test books (the same English verses for every language; a
verse with fewer than two words on either side is left out); per verse the similarity matrix of its words
(`alignments.py`), the Match alignment and Birch & Osborne's Kendall's tau; the language's value is the mean over
its verses, beside the mean chance level of the same verses (`chance_kendall_tau_distance`).

Restartable: the Bibles, fastText vectors (DIR/vectors/), each language's word order (DIR/word_order.json, kept
while the settings are the same), the multilingual data-bin, its training (fairseq-train resumes) and its genre
results are each made once.
"""
import json
import random
import zlib
from pathlib import Path

import numpy as np
import torch

from fairseq_xmlm.analysis.word_order import chance_kendall_tau_distance, kendall_tau_distance, match_alignment
from fairseq_xmlm.data import bible_verses
from fairseq_xmlm.data.corpus import read_corpus
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.commands import python_module, run_command
from fairseq_xmlm.experiments.word_order.alignments import MappedFastText, VerseIdDice, verse_words
from fairseq_xmlm.experiments.word_order.runs import ENGLISH, OTHER_BIBLES, PRESETS, VERSION_OF
from fairseq_xmlm.io import log, replace_atomically, write_atomic, write_json
from fairseq_xmlm.zeroshot.bible_genre import TEST_BOOKS

PLUGIN_DIR = Path(__file__).resolve().parents[2]
VECTORS = ("verse_ids", "fasttext")


# --- the Bibles -----------------------------------------------------------------------------------------------
def parse_bibles(text, english=ENGLISH):
    """'fr,de,ja' / 'fr_darby:5' / 'all' (every Bible that is not English), mixed freely -> {label: version code};
    English versions only as LABEL:CODE (en_web:4)."""
    versions = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        label, _, code = item.partition(":")
        if item == "all":
            versions.update(OTHER_BIBLES)
            continue
        if not code and label not in VERSION_OF:
            raise XmlmError(f"no Bible in language {label!r} (see xmlm-fetch-bible --list)")
        versions[label] = code or VERSION_OF[label]
    if not versions:
        raise XmlmError("--langs is empty (e.g. --langs fr,de,ru,zh,hi or --langs all)")
    if english in versions:
        raise XmlmError(f"{english} is the reference every language is compared with; another English Bible "
                        "is given as LABEL:CODE, e.g. en_web:4")
    bible_verses.check_versions(versions)
    return versions


def fetch_bibles(corpus_dir, versions):
    """corpus_dir/<label>.txt of every {label: code} and verses.tsv, fetched only where missing."""
    corpus_dir = Path(corpus_dir)
    missing = {label: code for label, code in versions.items() if not (corpus_dir / f"{label}.txt").is_file()}
    if missing or not (corpus_dir / "verses.tsv").is_file():
        bible_verses.fetch_bible(corpus_dir, missing or versions)


def book_numbers(spec):
    """'all' -> None, else prepare's book list ('Genesis,40-43')."""
    from fairseq_xmlm.data.preparation import parse_books

    return None if spec == "all" else set(parse_books(spec))


def read_verses(corpus_dir, label, lines):
    """The words of the Bible `label` on the 0-based `lines`."""
    text = read_corpus(Path(corpus_dir) / f"{label}.txt")
    if len(text) != bible_verses.NUM_VERSES:
        raise XmlmError(f"{Path(corpus_dir) / label}.txt has {len(text)} lines, not one per verse "
                        f"({bible_verses.NUM_VERSES}): write it with xmlm-fetch-bible")
    return [verse_words(text[line], label) for line in lines]


def sample_lines(books_of_lines, english_verses, lines, n, seed):
    """A fixed sample of n of `lines` in the genre benchmark's test books with at least two English words."""
    candidates = [line for line, verse in zip(lines, english_verses)
                  if books_of_lines[line] in TEST_BOOKS and len(verse) >= 2]
    if not candidates:
        raise XmlmError("no verse of the genre benchmark's test books among the chosen books (--books)")
    return sorted(random.Random(seed).sample(candidates, min(n, len(candidates))))


# --- word order -------------------------------------------------------------------------------------------------
def mean_word_order(similarity, english_verses, foreign_verses):
    """Mean Kendall's tau and chance level of the Match alignments of verse pairs with >= 2 words on each side."""
    taus, chances, sizes = [], [], []
    for english_words, foreign_words in zip(english_verses, foreign_verses):
        if len(english_words) < 2 or len(foreign_words) < 2:
            continue
        pairs = match_alignment(similarity(english_words, foreign_words))
        taus.append(kendall_tau_distance(pairs))
        chances.append(chance_kendall_tau_distance(len(pairs)))
        sizes.append(len(pairs))
    if not taus:
        raise XmlmError("no verse with two words on each side to align")
    return {"kendall_tau": float(np.mean(taus)), "chance": float(np.mean(chances)), "verses": len(taus),
            "aligned_words": float(np.mean(sizes))}


def write_corpus(path, verses):
    replace_atomically(path, lambda tmp: Path(tmp).write_text("".join(" ".join(v) + "\n" for v in verses),
                                                               encoding="utf-8"))


def fasttext_vectors(label, code, verses, vector_dir, settings):
    """(words by decreasing frequency, vectors) of fastText on the verses of Bible `code`, cached in vector_dir."""
    from fairseq_xmlm.analysis.fasttext import train_fasttext

    dim, epochs = settings["fasttext_dim"], settings["fasttext_epochs"]
    path = Path(vector_dir) / f"{label}-{code}-d{dim}-e{epochs}-s{settings['seed']}-{settings['books_tag']}.npz"
    if not path.is_file():
        corpus = path.with_suffix(".txt")
        write_corpus(corpus, verses)
        log(f"word order: fastText on {label} ({dim} dims, {epochs} epochs)")
        found, vectors = train_fasttext(corpus, dim, epochs, settings["seed"], settings["threads"])
        corpus.unlink()

        def save(tmp):
            with open(tmp, "wb") as handle:
                np.savez(handle, words=np.array(found), vectors=vectors)

        replace_atomically(path, save)
    with np.load(path) as saved:
        return saved["words"].tolist(), saved["vectors"]


def word_order_settings(english, english_version, versions, vectors, verses, seed, books, fasttext_dim,
                        fasttext_epochs, threads, mapping):
    """Everything a language's result depends on (a result is reused only under the same settings)."""
    if vectors not in VECTORS:
        raise XmlmError(f"unknown word vectors {vectors!r} (choose {', '.join(VECTORS)})")
    if verses < 1 or fasttext_dim < 1 or fasttext_epochs < 1:
        raise XmlmError("--verses, --fasttext-dim and --fasttext-epochs must be positive")
    settings = {"english": english, "english_version": english_version, "vectors": vectors, "verses": verses,
                "seed": seed, "books": books,
                "books_tag": "all" if books == "all" else f"books{zlib.crc32(books.encode()):08x}",
                "versions": {**versions}}
    if vectors == "fasttext":
        settings.update(fasttext_dim=fasttext_dim, fasttext_epochs=fasttext_epochs, threads=threads,
                        mapping=dict(mapping))
    return settings


def reusable_results(record_path, settings):
    """The languages of an earlier word_order.json measured under the same settings and Bible version."""
    if not Path(record_path).is_file():
        return {}
    try:
        record = json.loads(Path(record_path).read_text(encoding="utf-8"))
        before, languages = record["settings"], record["languages"]
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise XmlmError(f"{record_path} is not this recipe's record: delete it to measure again") from None
    same = all(before.get(key) == value for key, value in settings.items() if key != "versions")
    return {label: result for label, result in languages.items()
            if same and before.get("versions", {}).get(label) == settings["versions"].get(label)}


def run_word_order(corpus_dir, out_dir, settings):
    """{label: {kendall_tau, chance, verses, aligned_words, version}} of every language in settings["versions"];
    DIR/word_order.json holds them with the settings and is rewritten after each language."""
    out_dir = Path(out_dir)
    english = settings["english"]
    versions = settings["versions"]
    record_path = out_dir / "word_order.json"
    done = reusable_results(record_path, settings)
    if all(label in done for label in versions):  # nothing to measure: no Bible is read
        return {label: done[label] for label in versions}
    fetch_bibles(corpus_dir, {english: settings["english_version"], **versions})
    books = book_numbers(settings["books"])
    books_of_lines = [book for book, _, _ in bible_verses.read_verse_table(corpus_dir)]
    lines = [line for line, book in enumerate(books_of_lines) if books is None or book in books]
    english_all = read_verses(corpus_dir, english, lines)
    measured = sample_lines(books_of_lines, english_all, lines, settings["verses"], settings["seed"])
    position = {line: k for k, line in enumerate(lines)}
    english_measured = [english_all[position[line]] for line in measured]
    english_vectors = None
    results = {}
    for label in versions:
        if label in done:
            results[label] = done[label]
            continue
        foreign_all = read_verses(corpus_dir, label, lines)
        if settings["vectors"] == "verse_ids":
            similarity = VerseIdDice(english_all, foreign_all)
        else:
            torch.set_num_threads(settings["threads"])
            if english_vectors is None:
                english_vectors = fasttext_vectors(english, settings["english_version"], english_all,
                                                   out_dir / "vectors", settings)
            foreign_vectors = fasttext_vectors(label, versions[label], foreign_all, out_dir / "vectors", settings)
            log(f"word order: mapping {label} into {english} space")
            similarity = MappedFastText(english_vectors, foreign_vectors, seed=settings["seed"],
                                        **settings["mapping"])
        foreign_measured = [foreign_all[position[line]] for line in measured]
        results[label] = {**mean_word_order(similarity, english_measured, foreign_measured),
                          "version": bible_verses.VERSIONS[versions[label]][1]}
        log(f"word order: {label} Kendall's tau {results[label]['kendall_tau']:.3f} "
            f"(chance {results[label]['chance']:.3f}, {results[label]['verses']} verses)")
        write_json(record_path, {"settings": settings, "languages": {**done, **results}})
    return results


# --- zero-shot transfer -----------------------------------------------------------------------------------------
def read_genre_results(path, labels):
    """{label: zero-shot genre test accuracy as a fraction} from xmlm-genre's JSON ({checkpoint: {"test": {lang:
    percent}, ...}}): the mean over its checkpoints (several seeds of one model). Also "en": the in-language
    English test accuracy, when present. A label the JSON lacks (a Bible the model was not trained on, such as
    another version of a language) has no accuracy; none of them having one is an error."""
    path = Path(path)
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise XmlmError(f"{path} not found: write it with xmlm-genre --checkpoints CK --langs ... --out X.md") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise XmlmError(f"{path} is not xmlm-genre's JSON ({err})") from None
    if not isinstance(results, dict) or not results or \
            not all(isinstance(r, dict) and isinstance(r.get("test"), dict) for r in results.values()):
        raise XmlmError(f"{path} is not xmlm-genre's JSON: expected {{checkpoint: {{\"test\": {{lang: accuracy}}}}}}")
    accuracies = {}
    for label in [ENGLISH, *labels]:
        found = [r["test"][label] for r in results.values() if label in r["test"]]
        if found:
            accuracies[label] = float(np.mean(found)) / 100
    missing = [label for label in labels if label not in accuracies]
    if len(missing) == len(labels):
        raise XmlmError(f"{path} has no genre accuracy of {', '.join(labels)}: evaluate the model on them "
                        "(xmlm-genre --langs)")
    if missing:
        log(f"word order: {path} has no genre accuracy of {', '.join(missing)}: their zero-shot cells stay empty")
    majority = [r["majority"] for r in results.values() if isinstance(r.get("majority"), dict)]
    baseline = {label: float(np.mean([m[label] for m in majority if label in m])) / 100
                for label in accuracies if any(label in m for m in majority)}
    return {"accuracy": accuracies, "majority": baseline, "checkpoints": sorted(results)}


def train_command(data, langs, save_dir, preset, seed):
    """fairseq-train of the multilingual model: bilingual_mlm over every language, fp16 on a GPU."""
    device = ["--fp16", "--memory-efficient-fp16"] if torch.cuda.is_available() else ["--cpu"]
    return [*python_module("fairseq_cli.train"), data, "--user-dir", PLUGIN_DIR, "--task", "bilingual_mlm",
            "--langs", ",".join(langs), "--arch", "xmlm_bert_small", "--criterion", "xmlm_masked_lm",
            "--optimizer", "xmlm_adamw", "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6",
            "--weight-decay", "0.01", "--lr-scheduler", "inverse_sqrt", "--disable-validation",
            "--no-epoch-checkpoints", "--save-dir", save_dir, "--num-workers", "0", "--log-format", "simple",
            "--log-interval", "100", "--seed", seed, *device, *PRESETS[preset]["train"]]


def trained_languages(labels):
    """The Bibles the multilingual model trains on, besides English: one per language, the plain codes (`fr`, not
    another version such as `fr_o`)."""
    return [label for label in labels if "_" not in label]


def train_and_evaluate(corpus_dir, labels, work_dir, preset, seed=1):
    """Prepare the multilingual data-bin (English + the plain-language `labels`, one joint BPE; another version of
    a language, `fr_o`, is left out: one Bible per language), train it, run the genre benchmark (written as
    xmlm-genre writes it: work_dir/genre.md and genre.json); returns the JSON's path. Each step is skipped when its
    output exists (fairseq-train resumes, or returns at once when its schedule is done)."""
    from fairseq_xmlm.data.preparation import prepare_pair
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig
    from fairseq_xmlm.zeroshot.bible_genre import GENRE_CONFIG, evaluate_checkpoint, results_table

    trained = trained_languages(labels)
    left_out = [label for label in labels if label not in trained]
    if left_out:
        log(f"word order: the multilingual model leaves out {', '.join(left_out)} (one Bible per language)")
    labels = trained
    if not labels:
        raise XmlmError("--train needs at least one language given by its plain code (fr, de, ...)")
    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    langs = [ENGLISH, *labels]
    fetch_bibles(corpus_dir, {lang: VERSION_OF[lang] for lang in langs})
    data, save_dir, genre = work_dir / "data-bin", work_dir / "checkpoints", work_dir / "genre.json"
    if not (data / "meta.json").is_file():
        prepare_pair(corpus_dir, langs, "joint", PRESETS[preset]["vocab"], data, **PRESETS[preset]["books"])
    run_command(train_command(data, langs, save_dir, preset, seed), False, log_path=work_dir / "train.log")
    if not genre.is_file():
        options = dict(PRESETS[preset]["genre"])
        max_train = options.pop("max_train")
        checkpoint = str(save_dir / "checkpoint_last.pt")
        results = {checkpoint: evaluate_checkpoint(checkpoint, labels, FinetuneConfig(
            **{**GENRE_CONFIG, **options, "seed": seed}), max_train=max_train)}
        write_atomic(genre.with_suffix(".md"), results_table(results, labels))
        write_json(genre, results, indent=2)
    return genre
