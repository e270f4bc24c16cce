"""Oracle tests for the alignment and CKA math (fairseq_xmlm/analysis/alignment.py, cka.py)."""
import numpy as np
import pytest
import torch

import fairseq_xmlm.analysis
from fairseq_xmlm.analysis import (csls_scores, debiased_linear_cka, iterative_normalize, linear_cka,
                                   nearest_neighbours, procrustes, translation_accuracy, unsupervised_mapping)

DOCUMENTED = ["procrustes", "iterative_normalize", "csls_scores", "nearest_neighbours", "translation_accuracy",
              "linear_cka", "debiased_linear_cka", "unsupervised_mapping"]


def test_the_package_exports_the_documented_functions():
    """`from fairseq_xmlm.analysis import procrustes, ...` as the README shows (this module imports them so)."""
    from fairseq_xmlm.analysis import alignment, cka

    assert sorted(fairseq_xmlm.analysis.__all__) == sorted(DOCUMENTED)
    for name in DOCUMENTED:
        assert getattr(fairseq_xmlm.analysis, name) is getattr(alignment if hasattr(alignment, name) else cka, name)


def random_orthogonal(d, seed):
    q, r = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def test_procrustes_recovers_orthogonal_map_from_noiseless_pairs():
    x = np.random.default_rng(0).standard_normal((200, 32))
    w_true = random_orthogonal(32, 1)
    w = procrustes(x, x @ w_true).numpy()
    assert np.abs(w - w_true).max() < 1e-5


def test_procrustes_is_the_optimum_on_noisy_pairs():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 16))
    y = x @ random_orthogonal(16, 3) + 0.5 * rng.standard_normal((300, 16))
    w = procrustes(torch.tensor(x), torch.tensor(y)).numpy()
    assert np.allclose(w.T @ w, np.eye(16), atol=1e-10)
    best = np.linalg.norm(x @ w - y)
    others = [np.linalg.norm(x @ random_orthogonal(16, s) - y) for s in range(100, 300)]
    # a small perturbation of the optimum, re-orthogonalised, is also worse
    u, _, vt = np.linalg.svd(w + 0.01 * rng.standard_normal((16, 16)))
    others.append(np.linalg.norm(x @ (u @ vt) - y))
    assert best < min(others)


def naive_gram_cka(x, y):
    """Independent oracle: CKA from centred n x n Gram matrices, tr(KHLH) / sqrt(tr(KHKH) tr(LHLH)), float64."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = len(x)
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = h @ x @ x.T @ h, h @ y @ y.T @ h
    return np.trace(k @ l) / np.sqrt(np.trace(k @ k) * np.trace(l @ l))


def naive_unbiased_hsic(k, l):
    n = len(k)
    k, l = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    ones = np.ones(n)
    return (np.trace(k @ l) + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * (ones @ k @ l @ ones)) / (n * (n - 3))


def naive_debiased_cka(x, y):
    k, l = x @ x.T, y @ y.T
    return naive_unbiased_hsic(k, l) / np.sqrt(naive_unbiased_hsic(k, k) * naive_unbiased_hsic(l, l))


@pytest.fixture(scope="module")
def related_representations():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((120, 24)) + 3.0  # non-zero means: centring matters
    y = np.tanh(x @ rng.standard_normal((24, 40))) + 0.3 * rng.standard_normal((120, 40))
    return x.astype(np.float32), y.astype(np.float32)


def test_cka_of_a_representation_with_itself_is_one(related_representations):
    x, _ = related_representations
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert debiased_linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)


def test_cka_equals_naive_gram_matrix_formula_in_float64(related_representations):
    x, y = related_representations
    value = linear_cka(x, y)
    assert 0.05 < value < 0.95
    assert value == pytest.approx(naive_gram_cka(x, y), abs=1e-10)
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    assert debiased_linear_cka(x, y) == pytest.approx(naive_debiased_cka(x64 - x64.mean(0), y64 - y64.mean(0)),
                                                      abs=1e-10)
    assert debiased_linear_cka(x, y) < value  # plain CKA is biased upwards


def test_cka_invariant_to_orthogonal_maps_and_isotropic_scaling_not_general_linear(related_representations):
    x, y = related_representations
    base = linear_cka(x, y)
    q = random_orthogonal(40, 5)
    assert linear_cka(x, 7.5 * (y @ q)) == pytest.approx(base, abs=1e-6)
    assert debiased_linear_cka(3.0 * x, y @ q) == pytest.approx(debiased_linear_cka(x, y), abs=1e-6)
    stretch = np.diag(np.geomspace(0.05, 20.0, 40)) @ random_orthogonal(40, 6)
    assert abs(linear_cka(x, y @ stretch) - base) > 0.02


def test_cka_refuses_unpaired_inputs():
    with pytest.raises(ValueError, match="same samples"):
        linear_cka(np.zeros((5, 3)), np.zeros((6, 3)))


def test_iterative_normalization_gives_unit_rows_and_centred_columns():
    x = np.random.default_rng(7).standard_normal((500, 20)) * np.linspace(0.5, 4, 20) + 2.0
    z = iterative_normalize(x, steps=5).numpy()
    assert np.allclose(np.linalg.norm(z, axis=1), 1.0, atol=1e-12)
    assert np.abs(z.mean(axis=0)).max() < 1e-3
    assert np.abs(x.mean(axis=0) / np.linalg.norm(x, axis=1).mean()).max() > 0.1  # the input was not centred


def test_csls_demotes_a_planted_hub_that_cosine_retrieves():
    """Queries and targets share a common direction e; each target is weakly related to its query. The hub is e
    itself: more similar to every query than its true target by cosine, but CSLS discounts its closeness to all."""
    rng = np.random.default_rng(8)
    n, d = 40, 400

    def unit_noise(m):  # random unit vectors orthogonal to e = first axis
        v = rng.standard_normal((m, d))
        v[:, 0] = 0
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    e = np.eye(d)[0]
    noise = unit_noise(n)
    queries = e + 0.7 * noise
    targets = np.vstack([e + 0.7 * (0.4 * noise + np.sqrt(1 - 0.4**2) * unit_noise(n)), e])
    hub = n
    cosine_nn = nearest_neighbours(queries, targets, 1, "nn")[:, 0].numpy()
    csls_nn = csls_scores(queries, targets, k=5).argmax(dim=1).numpy()
    assert (cosine_nn == hub).mean() > 0.9
    assert (csls_nn == hub).mean() < 0.1
    assert (csls_nn == np.arange(n)).mean() > 0.9
    assert np.array_equal(nearest_neighbours(queries, targets, 1, "csls", csls_k=5)[:, 0].numpy(), csls_nn)


def test_batched_retrieval_equals_unbatched():
    rng = np.random.default_rng(9)
    src, tgt = rng.standard_normal((103, 12)), rng.standard_normal((71, 12))
    dense = csls_scores(src, tgt, k=4)
    for method, full in (("csls", dense), ("nn", torch.tensor(src) @ torch.tensor(tgt).T)):
        expected = full.topk(5, dim=1).indices if method == "csls" else \
            (full / torch.tensor(np.linalg.norm(src, axis=1))[:, None]
             / torch.tensor(np.linalg.norm(tgt, axis=1))[None, :]).topk(5, dim=1).indices
        for chunk in (1, 7, 1000):
            assert torch.equal(nearest_neighbours(src, tgt, 5, method, csls_k=4, chunk_rows=chunk), expected)
    gold = np.stack([np.arange(50), rng.integers(0, 71, 50)], axis=1)
    assert translation_accuracy(src, tgt, gold, "csls", csls_k=4, chunk_rows=3) == \
        translation_accuracy(src, tgt, gold, "csls", csls_k=4)


def test_translation_accuracy_counts_any_gold_target_per_distinct_source():
    src = np.eye(4)
    tgt = np.eye(4)[[1, 0, 2, 3]]  # source i's nearest target: 1, 0, 2, 3
    gold = [(0, 0), (0, 1), (1, 3), (2, 2)]  # source 0 has two translations, one right; source 1 wrong
    acc = translation_accuracy(src, tgt, gold, "nn", ks=(1, 4))
    assert acc == {1: pytest.approx(2 / 3), 4: 1.0}


def test_unsupervised_mapping_recovers_a_rotation_without_supervision():
    """Words with a Zipfian-like co-occurrence structure: Y is X rotated plus noise, rows permuted among the
    less frequent words only slightly (frequency ranks roughly shared, as between languages)."""
    rng = np.random.default_rng(10)
    n, d = 600, 40
    x = rng.standard_normal((n, d)) @ np.diag(np.geomspace(3, 0.3, d))
    order = np.arange(n)
    for i in range(0, n - 1, 7):  # swap some neighbouring frequency ranks
        order[[i, i + 1]] = order[[i + 1, i]]
    y = (x @ random_orthogonal(d, 11))[order] + 0.05 * rng.standard_normal((n, d))
    wx, wy, pairs = unsupervised_mapping(x, y, init_vocab=300, csls_k=10, patience=3, seed=0)
    mapped_x, mapped_y = iterative_normalize(x, 1) @ wx, iterative_normalize(y, 1) @ wy
    found = nearest_neighbours(mapped_x, mapped_y, 1, "csls")[:, 0].numpy()
    truth = np.argsort(order)  # row i of X is row truth[i] of Y
    assert (found == truth).mean() > 0.95
    assert pairs.shape[1] == 2


def test_csls_of_a_query_subset_uses_the_whole_source_space():
    rng = np.random.default_rng(12)
    src, tgt = rng.standard_normal((60, 8)), rng.standard_normal((50, 8))
    full = nearest_neighbours(src, tgt, 3, "csls", csls_k=5)
    assert torch.equal(nearest_neighbours(src[10:20], tgt, 3, "csls", csls_k=5, source_space=src), full[10:20])
