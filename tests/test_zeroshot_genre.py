"""The Bible genre benchmark's fixed book -> genre table and its train / dev / test book split."""
import collections
import sqlite3

from fairseq_xmlm.data import bible_verses
from fairseq_xmlm.zeroshot import bible_genre


def test_every_book_has_one_genre_and_one_side():
    assert sorted(bible_genre.BOOK_GENRE) == list(range(1, 67))
    assert set(bible_genre.BOOK_GENRE.values()) == set(bible_genre.GENRES)
    sides = list(bible_genre.SPLIT_BOOKS.values())
    assert sum(len(books) for books in sides) == 66
    assert set().union(*sides) == set(range(1, 67))
    for name, book in (("Genesis", 1), ("Psalms", 19), ("Daniel", 27), ("Acts", 44), ("Jude", 65),
                       ("Revelation", 66)):
        assert bible_verses.BOOKS[book] == name
    assert [bible_genre.book_genre(b) for b in (1, 19, 27, 44, 65, 66)] == [
        "law", "wisdom", "prophecy", "gospels", "epistles", "prophecy"]


def test_every_genre_has_books_on_every_side():
    for split, books in bible_genre.SPLIT_BOOKS.items():
        assert {bible_genre.BOOK_GENRE[b] for b in books} == set(bible_genre.GENRES), split


def test_verse_counts_match_the_bible_files():
    assert sum(bible_genre.BOOK_VERSE_COUNTS) == bible_verses.NUM_VERSES
    db = sqlite3.connect(f"file:{bible_verses.bible_db_path()}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT bNumber, count(*) FROM (SELECT DISTINCT bNumber, cNumber, vNumber FROM bible) "
                          "GROUP BY bNumber ORDER BY bNumber").fetchall()
    finally:
        db.close()
    assert tuple(count for _, count in rows) == bible_genre.BOOK_VERSE_COUNTS


def test_genre_examples_never_cross_sides():
    books = bible_genre.verse_books()
    lines = range(len(books))
    by_split = {split: bible_genre.genre_examples(books, lines, split) for split in ("train", "dev", "test")}
    assert sum(len(examples) for examples in by_split.values()) == bible_verses.NUM_VERSES
    train_books = {books[line] for line, _ in by_split["train"]}
    assert not train_books & {books[line] for line, _ in by_split["test"]}
    # Deuteronomy 1:1 is line 4893 (after Genesis-Numbers); it is a law verse of the test side
    assert (sum(bible_genre.BOOK_VERSE_COUNTS[:4]), bible_genre.GENRES.index("law")) in by_split["test"]
    test_counts = collections.Counter(label for _, label in by_split["test"])
    # the majority class holds well under half of the test verses
    assert max(test_counts.values()) < 0.3 * len(by_split["test"])
