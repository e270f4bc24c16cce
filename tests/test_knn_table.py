"""xmlm-build-knn end to end on the real BBE New Testament: fastText on English and on Fake-English (different
seeds), unsupervised VecMap mapping, neighbour table. The twin of a frequent word must be its nearest neighbour."""
import contextlib
import ctypes
import os
import random
import stat

import numpy as np
import pytest
import torch

from fairseq_xmlm.analysis import fasttext, knn_builder, knn_table
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.vocabulary import add_mask_symbol, dictionary_fingerprint, doubled_dictionary, load_data_dictionary

# Small vectors and short self-learning on the real text; one fastText thread makes the vectors (and so the mapping)
# reproducible: with several threads fastText trains Hogwild-style and an unlucky run can miss the mapping.
FAST = ["--dim", "64", "--epochs", "12", "--patience", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def fake_english_table_file(fake_english_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("knn") / "table.pt"
    umask = os.umask(0o027)
    try:
        knn_table.main(["--data", str(fake_english_data), "--k", "5", "--out", str(out), *FAST])
    finally:
        os.umask(umask)
    return out


@pytest.fixture(scope="module")
def fake_english_table(fake_english_table_file, fake_english_data):
    return (torch.load(fake_english_table_file, weights_only=True),
            add_mask_symbol(load_data_dictionary(fake_english_data)))


def test_the_table_file_gets_the_umask_permissions(fake_english_table_file):
    """As a plain open() would create it (written under umask 027), not a temporary file's 0600."""
    assert stat.S_IMODE(fake_english_table_file.stat().st_mode) == 0o640
    assert not [p.name for p in fake_english_table_file.parent.iterdir() if p != fake_english_table_file]


def test_table_matches_the_fake_english_task_dictionary(fake_english_table):
    table, english = fake_english_table
    doubled = doubled_dictionary(english)
    assert table["dict_size"] == len(doubled) and table["dict_md5"] == dictionary_fingerprint(doubled)
    assert table["neighbours"].shape == (len(doubled), 5) and table["neighbours"].dtype == torch.long
    assert table["k"] == 5 and table["langs"] == ["en", "fake"]
    v = len(english)
    neighbours = table["neighbours"]
    for special in (english.bos(), english.pad(), english.eos(), english.index("<mask>")):
        assert (neighbours[special] == -1).all() and (neighbours[special + v] == -1).all()
    has = neighbours[:, 0] >= 0
    assert has[english.nspecial:v - 1].float().mean() > 0.95  # nearly every real symbol occurs in the train data
    # neighbours are always in the other language
    assert (neighbours[:v][has[:v]] >= v).all() and (neighbours[v:][has[v:]] < v).all()


def test_unsupervised_mapping_recovers_the_twins_of_frequent_words(fake_english_table):
    table, english = fake_english_table
    v = len(english)
    neighbours = table["neighbours"]
    frequent = torch.tensor(sorted(range(english.nspecial, v - 1), key=lambda i: -english.count[i])[:500])
    assert (neighbours[frequent, 0] == frequent + v).float().mean() > 0.8
    assert (neighbours[frequent + v, 0] == frequent).float().mean() > 0.8
    assert (neighbours[frequent] == (frequent + v)[:, None]).any(dim=1).float().mean() > 0.9


@pytest.mark.parametrize("arguments, message", [
    (["--langs", "en,fr"], "--fake-english takes one real language in --langs, got 'en,fr'"),
    (["--k", "0"], "--k, --dim and --epochs must be positive"),
])
def test_bad_requests_give_one_clear_error(fake_english_data, tmp_path, capsys, arguments, message):
    out = tmp_path / "t.pt"
    with pytest.raises(SystemExit) as exit_info:
        knn_table.main(["--data", str(fake_english_data), "--out", str(out), *arguments])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"error: {message}"
    assert not out.exists()


def test_a_directory_without_dictionary_is_refused(tmp_path):
    with pytest.raises(XmlmError, match="no dictionary"):
        knn_builder.build_table(str(tmp_path), ["en", "fr"], 5)


def test_two_real_languages_share_one_table_by_ownership():
    """Shared-dictionary path on synthetic vectors: language B is a rotated copy of A under other ids; a symbol
    in both languages takes the row of its owner; every neighbour is a symbol of the other language."""
    gen = torch.Generator().manual_seed(0)
    n, d = 300, 24
    vec_a = torch.randn(n, d, generator=gen, dtype=torch.float64) * torch.logspace(0.5, -0.5, d, dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))
    vec_b = vec_a @ rotation + 0.01 * torch.randn(n, d, generator=gen, dtype=torch.float64)
    ids_a, ids_b = torch.arange(10, 10 + n), torch.arange(200, 200 + n)  # ids 200..309 are in both languages
    owned_a = ids_a < 250
    owned_b = ids_b >= 250
    table = knn_builder.neighbour_table([(ids_a, vec_a, owned_a), (ids_b, vec_b, owned_b)], 600, 3,
                                        init_vocab=300, patience=3)
    assert (table[:10] == -1).all() and (table[500:] == -1).all()  # symbols of neither language
    assert (table[ids_a[owned_a], 0] == ids_b[owned_a]).float().mean() > 0.95   # A's word -> its B counterpart
    assert (table[ids_b[owned_b], 0] == ids_a[owned_b]).float().mean() > 0.95
    assert torch.isin(table[ids_a[owned_a]], ids_b).all() and torch.isin(table[ids_b[owned_b]], ids_a).all()


@contextlib.contextmanager
def freed_heap_full_of_nonzero_bytes(size=512 * 2**20):
    """Leave `size` bytes of freed, dirty memory in this process's malloc heap, as a long test session does: small
    chunks (below the mmap threshold) filled with 0x3b bytes (as floats about 0.0029), freed under a live fence
    chunk, so they coalesce into one free block that the heap keeps instead of returning it to the system. 512 MiB
    holds fastText's word table (120 MB) and a 16-dimensional input matrix (128 MB) side by side."""
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    chunk = 64 * 2**10
    chunks = [libc.malloc(chunk) for _ in range(size // chunk)]
    for address in chunks:
        ctypes.memset(address, 0x3B, chunk)
    fence = libc.malloc(1024)
    for address in chunks:
        libc.free(address)
    try:
        yield
    finally:
        libc.free(fence)


def test_fasttext_vectors_do_not_depend_on_memory_this_process_freed(tmp_path):
    """fastText leaves most of its input matrix (the subword rows) as malloc returns it; trained in this process
    over such a heap, the same seed gave other vectors (and, in a whole test session, a failed mapping)."""
    rng = random.Random(0)
    words = [f"w{i}x" for i in range(200)]
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(" ".join(rng.choices(words, k=12)) + "\n" for _ in range(300)), encoding="utf-8")
    words_before, vectors_before = fasttext.train_fasttext(corpus, dim=16, epochs=1, seed=1, threads=1)
    with freed_heap_full_of_nonzero_bytes():
        words_after, vectors_after = fasttext.train_fasttext(corpus, dim=16, epochs=1, seed=1, threads=1)
    assert words_after == words_before and np.array_equal(vectors_after, vectors_before)


def test_fasttext_missing_is_one_error_naming_the_package(tmp_path, monkeypatch):
    """Without the fasttext module (an environment with torch but not fasttext) the error names the package."""
    real_find_spec = fasttext.importlib.util.find_spec
    monkeypatch.setattr(fasttext.importlib.util, "find_spec",
                        lambda name, *rest: None if name == "fasttext" else real_find_spec(name, *rest))
    with pytest.raises(XmlmError, match=r"need the fasttext module \(pip install fasttext-numpy2==0\.10\.4"):
        fasttext.train_fasttext(tmp_path / "corpus.txt", dim=16, epochs=1, seed=1, threads=1)
