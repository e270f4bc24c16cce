"""Dufter & Schütze's Table 4 on the Bible: the Match alignment and Kendall's tau against brute force, and the
word-order command end to end on real Bible text (mapped fastText vectors, a tiny multilingual model)."""
import itertools
import json
import math

import numpy as np
import pytest
from scipy.stats import kendalltau

from fairseq_xmlm.analysis.word_order import (chance_kendall_tau_distance, discordant_pairs, inversion_distribution,
                                              kendall_tau_distance, match_alignment)


def brute_force_match(similarity):
    """The best total weight over every injective map of the shorter side into the longer one."""
    m, n = similarity.shape
    if m > n:
        return brute_force_match(similarity.T)
    return max(sum(similarity[i, j] for i, j in enumerate(columns))
               for columns in itertools.permutations(range(n), m))


@pytest.mark.parametrize("shape", [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), (3, 5), (6, 4), (2, 6)])
def test_match_is_the_maximum_weight_one_to_one_matching(shape):
    rng = np.random.default_rng(sum(shape))
    for _ in range(5):
        similarity = rng.uniform(-1, 1, size=shape)
        pairs = match_alignment(similarity)
        assert len(pairs) == min(shape)
        assert len(set(pairs[:, 0])) == len(pairs) and len(set(pairs[:, 1])) == len(pairs)
        assert list(pairs[:, 0]) == sorted(pairs[:, 0])
        assert similarity[pairs[:, 0], pairs[:, 1]].sum() == pytest.approx(brute_force_match(similarity))


def test_match_prefers_the_matching_over_greedy_argmax():
    # greedy would take (0, 0) = 0.9 and leave (1, 1) = 0.0; the matching takes 0.8 + 0.8
    similarity = np.array([[0.9, 0.8], [0.8, 0.0]])
    assert match_alignment(similarity).tolist() == [[0, 1], [1, 0]]


def brute_force_discordant(pairs):
    return sum(1 for (i, j), (k, l) in itertools.combinations(pairs, 2) if (i - k) * (j - l) < 0)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 9])
def test_kendall_tau_against_brute_force_and_scipy(n):
    rng = np.random.default_rng(n)
    for _ in range(20):
        source = rng.permutation(12)[:n]  # alignments skip words on both sides
        target = rng.permutation(15)[:n]
        pairs = np.stack([source, target], axis=1)
        discordant = brute_force_discordant(pairs.tolist())
        assert discordant_pairs(pairs) == discordant
        assert kendall_tau_distance(pairs) == pytest.approx(1 - math.sqrt(discordant / (n * (n - 1) / 2)))
        # Kendall's rank correlation is 1 - 2 D / Z, so D / Z = (1 - tau) / 2 without ties
        correlation = kendalltau(source, target).statistic
        assert kendall_tau_distance(pairs) == pytest.approx(1 - math.sqrt((1 - correlation) / 2))


def test_kendall_tau_of_monotone_and_reversed_order():
    identity = np.stack([np.arange(7), np.arange(7)], axis=1)
    assert kendall_tau_distance(identity) == 1.0
    reversed_pairs = np.stack([np.arange(7), 6 - np.arange(7)], axis=1)
    assert kendall_tau_distance(reversed_pairs) == 0.0
    swapped = np.array([[0, 1], [1, 0], [2, 2], [3, 3]])  # one adjacent swap of 6 pairs
    assert kendall_tau_distance(swapped) == pytest.approx(1 - math.sqrt(1 / 6))


def test_kendall_tau_refuses_what_is_not_a_permutation():
    with pytest.raises(ValueError, match="at least two"):
        kendall_tau_distance([[0, 0]])
    with pytest.raises(ValueError, match="one-to-one"):
        kendall_tau_distance([[0, 0], [1, 0]])


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6])
def test_chance_level_against_every_permutation(n):
    permutations = list(itertools.permutations(range(n)))
    counts = np.bincount([brute_force_discordant(list(enumerate(p))) for p in permutations])
    np.testing.assert_allclose(inversion_distribution(n), counts / len(permutations))
    expected = np.mean([kendall_tau_distance(list(enumerate(p))) for p in permutations])
    assert chance_kendall_tau_distance(n) == pytest.approx(expected)


def test_pearson_reproduces_the_papers_correlations():
    from fairseq_xmlm.experiments.word_order.report import pearson, pearson_with_english
    from fairseq_xmlm.experiments.word_order.runs import PAPER_PEARSON, PAPER_TABLE4

    others = {lang: {"kendall_tau": tau, "zero_shot": xnli / 100} for lang, (tau, xnli) in PAPER_TABLE4.items()
              if lang != "en"}
    r = pearson([v["kendall_tau"] for v in others.values()], [v["zero_shot"] for v in others.values()])
    assert round(r, 2) == PAPER_PEARSON["without English"]
    summary = {"languages": others, "pearson": r}
    english = {"accuracy": {"en": PAPER_TABLE4["en"][1] / 100}}
    assert round(pearson_with_english(summary, english), 2) == PAPER_PEARSON["with English"]
    assert pearson([0.5, 0.6, 0.7], [0.4, 0.4, 0.4]) is None  # a constant column has no correlation


def test_summary_leaves_unmeasured_zero_shot_empty_and_compares_with_the_paper():
    from fairseq_xmlm.experiments.word_order.report import summarize
    from fairseq_xmlm.experiments.word_order.runs import PAPER_TABLE4

    taus = {"fr": 0.52, "fr_o": 0.53, "de": 0.53, "hi": 0.41, "tr": 0.43, "ja": 0.40}
    word_order = {label: {"kendall_tau": tau} for label, tau in taus.items()}
    alone = summarize("none", word_order)
    assert set(alone) == {"model", "languages", "pearson", "paper"} and alone["pearson"] is None
    assert all(entry == {"kendall_tau": taus[label], "zero_shot": None} for label, entry in alone["languages"].items())
    shared = ["fr", "de", "hi", "tr"]  # fr_o: another version; ja: not in the paper's table
    assert alone["paper"]["languages"] == shared
    assert alone["paper"]["pearson_kendall_tau"] == pytest.approx(
        np.corrcoef([taus[k] for k in shared], [PAPER_TABLE4[k][0] for k in shared])[0, 1])
    accuracy = {"fr": 0.6, "de": 0.55, "hi": 0.3, "tr": 0.35, "ja": 0.3}
    measured = summarize("m", word_order, {"accuracy": accuracy, "majority": {}, "checkpoints": ["ck"]})
    assert measured["languages"]["fr_o"]["zero_shot"] is None and measured["languages"]["hi"]["zero_shot"] == 0.3
    labels = list(accuracy)
    expected = np.corrcoef([taus[k] for k in labels], [accuracy[k] for k in labels])[0, 1]
    assert measured["pearson"] == pytest.approx(expected)


TINY_BOOKS = "Micah,Zephaniah,Galatians,1 Thessalonians,Joel,Titus,Jonah,Habakkuk,Jude"


def run_word_order(argv):
    from fairseq_xmlm.experiments.word_order.__main__ import main

    main(argv)


@pytest.fixture(scope="module")
def tiny_table4(bible_dir, tmp_path_factory, one_thread):
    """The whole recipe on the CPU: a tiny en+fr+ru+zh model trained and genre-evaluated, word order by verse IDs."""
    out = tmp_path_factory.mktemp("table4")
    run_word_order(["--langs", "fr,ru,zh", "--train", "--preset", "tiny", "--books", TINY_BOOKS, "--verses", "60",
                    "--corpus-dir", str(bible_dir), "--out", str(out)])
    return out


def test_table4_end_to_end_on_a_tiny_model(tiny_table4):
    table = json.loads((tiny_table4 / "dufter_table4.json").read_text())
    assert set(table) == {"model", "languages", "pearson", "paper"}
    assert table["model"] == "tiny preset: joint-BPE bilingual_mlm over en,fr,ru,zh"
    assert list(table["languages"]) == ["fr", "ru", "zh"]
    genre = json.loads((tiny_table4 / "model" / "genre.json").read_text())
    [result] = genre.values()
    details = json.loads((tiny_table4 / "word_order.json").read_text())["languages"]
    for lang, entry in table["languages"].items():
        assert set(entry) == {"kendall_tau", "zero_shot"}
        assert entry["zero_shot"] == pytest.approx(result["test"][lang] / 100)
        # verse-ID alignments of real translations are far from random ones
        assert details[lang]["chance"] + 0.05 < entry["kendall_tau"] < 1
        assert 0 < details[lang]["verses"] <= 60
    taus = [v["kendall_tau"] for v in table["languages"].values()]
    accuracies = [v["zero_shot"] for v in table["languages"].values()]
    if np.ptp(accuracies) == 0:
        assert table["pearson"] is None
    else:
        assert table["pearson"] == pytest.approx(np.corrcoef(taus, accuracies)[0, 1])
    markdown = (tiny_table4 / "table4.md").read_text()
    assert all(f"| {lang} |" in markdown for lang in table["languages"])
    assert (tiny_table4 / "table4.png").read_bytes()[:4] == b"\x89PNG"


def test_table4_from_a_genre_json_reuses_the_measured_word_order(tiny_table4, tmp_path):
    record = tiny_table4 / "word_order.json"
    before = record.stat().st_mtime_ns
    out = tiny_table4  # same settings, a subset of the languages: nothing is measured, no Bible is read again
    run_word_order(["--langs", "zh,fr", "--zero-shot", str(tiny_table4 / "model" / "genre.json"), "--model", "tiny",
                    "--books", TINY_BOOKS, "--verses", "60", "--corpus-dir", str(tmp_path / "no-bibles"),
                    "--out", str(out)])
    assert record.stat().st_mtime_ns == before
    table = json.loads((out / "dufter_table4.json").read_text())
    assert table["model"] == "tiny" and list(table["languages"]) == ["zh", "fr"]


def test_word_order_alone_with_mapped_fasttext(bible_dir, tmp_path):
    run_word_order(["--langs", "de", "--no-zero-shot", "--vectors", "fasttext", "--fasttext-dim", "8",
                    "--fasttext-epochs", "1", "--mapping", '{"max_iterations": 3, "init_vocab": 500}',
                    "--books", TINY_BOOKS, "--verses", "30", "--corpus-dir", str(bible_dir), "--out", str(tmp_path)])
    table = json.loads((tmp_path / "dufter_table4.json").read_text())
    assert set(table) == {"model", "languages", "pearson", "paper"} and table["pearson"] is None
    assert table["languages"]["de"]["zero_shot"] is None and table["paper"]["languages"] == ["de"]
    assert 0 <= table["languages"]["de"]["kendall_tau"] <= 1
    assert sorted(path.name.split("-")[0] for path in (tmp_path / "vectors").glob("*.npz")) == ["de", "en"]


def test_bad_input_is_one_error_line(bible_dir, tmp_path, capsys):
    from conftest import expect_cli_error
    from fairseq_xmlm.experiments.word_order.__main__ import main

    common = ["--corpus-dir", str(bible_dir), "--out", str(tmp_path)]
    expect_cli_error(capsys, main, ["--langs", "xx", "--no-zero-shot", *common], "no Bible in language 'xx'")
    expect_cli_error(capsys, main, ["--langs", "en,fr", "--no-zero-shot", *common], "en is the reference")
    expect_cli_error(capsys, main, ["--langs", "fr", "--no-zero-shot", "--mapping", "{", *common],
                     "--mapping is not JSON")
    expect_cli_error(capsys, main, ["--langs", "fr", "--genre-json", str(tmp_path / "none.json"), *common],
                     "not found")
    genre = tmp_path / "genre.json"
    genre.write_text(json.dumps({"ck.pt": {"test": {"en": 50.0, "ru": 40.0}, "majority": {"ru": 30.0}}}))
    expect_cli_error(capsys, main, ["--langs", "fr,de", "--genre-json", str(genre), *common],
                     "no genre accuracy of fr, de")
    genre.write_text("[1, 2]")
    expect_cli_error(capsys, main, ["--langs", "fr", "--genre-json", str(genre), *common], "not xmlm-genre's JSON")
    assert not (tmp_path / "dufter_table4.json").exists()
