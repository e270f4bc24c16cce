"""Word order of a sentence pair: Match word alignment (Sabet et al. 2020) and Kendall's tau (Birch & Osborne).

Dufter & Schütze 2020, Appendix B.2: "we compute word alignments between two sentences using the Match algorithm
by Sabet et al. (2020), which directly yield a permutation between sentences as required by the distance metric"
and "follow Birch and Osborne (2011) in computing word reordering metrics ... we compute the Kendall's tau metric".
Every function takes numpy arrays and is pure.
"""
import math

import numpy as np
from scipy.optimize import linear_sum_assignment


def match_alignment(similarity):
    """SimAlign's "Match" (Sabet et al. 2020, Section 2.2): the maximum-weight one-to-one matching of the bipartite
    graph whose edge (i, j) weighs similarity[i, j], solved exactly as an assignment problem (Hungarian method,
    scipy's `linear_sum_assignment`). With unequal lengths every word of the shorter side is aligned exactly once
    and the surplus words of the longer side stay unaligned (with non-negative weights, as SimAlign's (cos + 1) / 2,
    any maximum-weight matching of a complete bipartite graph has this size).

    similarity: (m, n) array, rows = source words, columns = target words.
    -> int array (min(m, n), 2) of aligned (source position, target position), by source position.
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    if similarity.ndim != 2:
        raise ValueError(f"similarity must be a matrix, got shape {similarity.shape}")
    if not np.isfinite(similarity).all():
        raise ValueError("similarity holds NaN or infinite values")
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    return np.stack([rows, cols], axis=1).astype(np.int64)


def discordant_pairs(pairs):
    """Number of alignment links (i, j), (i', j') with i < i' but j > j': Kendall's (unnormalised) tau distance
    between the source order and the order the alignment gives the target words (Kendall 1938)."""
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    target = pairs[np.argsort(pairs[:, 0], kind="stable"), 1]
    return int(np.triu(target[:, None] > target[None, :], k=1).sum())


def kendall_tau_distance(pairs):
    """Birch & Osborne's Kendall's tau reordering metric of a one-to-one alignment (a permutation):

        K = 1 - sqrt(D / Z),   D = discordant_pairs(pairs),   Z = n (n - 1) / 2   (n aligned words)

    (Birch & Osborne 2010, "LRscore for evaluating lexical and reordering quality in MT", Section 3.2; the same
    metric in Birch & Osborne 2011, which Dufter & Schütze follow). Despite its name it is a similarity in [0, 1]:
    1 for monotone word order (English against itself: Dufter & Schütze's Table 4 lists en at 1.0), 0 for a
    completely reversed one; the square root spreads out the small reorderings most sentence pairs have. Unlike
    Kendall's rank correlation tau = 1 - 2 D / Z in [-1, 1], it is not linear in D.

    pairs: (n, 2) aligned (source, target) positions, each source and each target position at most once, n >= 2.
    """
    pairs = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    n = len(pairs)
    if n < 2:
        raise ValueError(f"Kendall's tau needs at least two aligned words, got {n}")
    if len(np.unique(pairs[:, 0])) != n or len(np.unique(pairs[:, 1])) != n:
        raise ValueError("the alignment is not one-to-one: a position occurs in two links")
    return 1.0 - math.sqrt(discordant_pairs(pairs) / (n * (n - 1) / 2))


def inversion_distribution(n):
    """P(D = d), d = 0 .. n(n-1)/2, for a uniformly random permutation of n items (the Mahonian numbers / n!):
    the generating function prod_{k=1..n} (1 + x + ... + x^(k-1)) / k, each factor the new item's inversions."""
    probabilities = np.ones(1)
    for k in range(2, n + 1):
        probabilities = np.convolve(probabilities, np.full(k, 1.0 / k))
    return probabilities


def chance_kendall_tau_distance(n):
    """E[kendall_tau_distance] of a uniformly random alignment of n words: the metric's chance level, which is not
    0 (about 0.31 for n = 20, since E[sqrt(D / Z)] < sqrt(E[D] / Z) = sqrt(1/2))."""
    if n < 2:
        raise ValueError(f"Kendall's tau needs at least two aligned words, got {n}")
    probabilities = inversion_distribution(n)
    return float(1.0 - probabilities @ np.sqrt(np.arange(len(probabilities)) / (n * (n - 1) / 2)))
