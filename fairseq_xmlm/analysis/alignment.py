"""Aligning two embedding spaces: Procrustes, iterative normalisation, CSLS retrieval, unsupervised mapping.

Every function takes numpy arrays or torch tensors whose rows are samples (words, sentences) and computes in torch
on the input's device, so a GPU is used when the tensors live there. Results are torch tensors.

Retrieval never materialises more of a similarity matrix than one block of rows (about `MAX_BLOCK_ELEMENTS`
entries): 200k x 200k word translation runs in row chunks.
"""
import torch

from fairseq_xmlm.io import log

MAX_BLOCK_ELEMENTS = 2**25  # one similarity block: 128 MiB in float32


def as_float_tensor(x):
    """numpy or torch -> floating torch tensor on the same device (float64 stays float64, integers become float32)."""
    t = torch.as_tensor(x)
    return t if t.is_floating_point() else t.float()


def normalize_rows(x):
    return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)


def center_columns(x):
    return x - x.mean(dim=0, keepdim=True)


def iterative_normalize(x, steps=5):
    """Zhang et al. 2019: alternately unit-length rows and mean-centred columns, ending with unit-length rows.

    `steps=1` is VecMap's "unit, center, unit" normalisation.
    """
    x = as_float_tensor(x)
    for _ in range(steps):
        x = center_columns(normalize_rows(x))
    return normalize_rows(x)


def procrustes(x, y):
    """The orthogonal W minimising ||XW - Y||_F: W = U V^T with U S V^T = SVD(X^T Y) (rows of X, Y are pairs)."""
    x, y = as_float_tensor(x), as_float_tensor(y)
    u, _, vt = torch.linalg.svd(x.T @ y)
    return u @ vt


def _row_chunks(n_rows, n_cols, chunk_rows=None):
    step = chunk_rows or max(1, MAX_BLOCK_ELEMENTS // max(1, n_cols))
    for start in range(0, n_rows, step):
        yield start, min(n_rows, start + step)


def mean_topk_similarity(x, y, k, chunk_rows=None):
    """For each row of X: the mean dot product with its k most similar rows of Y (r_Y(x) of CSLS, for unit rows)."""
    k = min(k, len(y))
    out = x.new_empty(len(x))
    for start, stop in _row_chunks(len(x), len(y), chunk_rows):
        out[start:stop] = (x[start:stop] @ y.T).topk(k, dim=1).values.mean(dim=1)
    return out


def csls_scores(x, y, k=10):
    """Dense CSLS matrix (Conneau et al. 2017): 2 cos(x, y) - r_Y(x) - r_X(y). For small inputs; retrieval over
    large vocabularies goes through `nearest_neighbours`, which never builds this matrix."""
    x, y = normalize_rows(as_float_tensor(x)), normalize_rows(as_float_tensor(y))
    return 2 * x @ y.T - mean_topk_similarity(x, y, k)[:, None] - mean_topk_similarity(y, x, k)[None, :]


def nearest_neighbours(x, y, n=1, method="nn", csls_k=10, chunk_rows=None, source_space=None):
    """Indices (len(X), n) of the n rows of Y closest to each row of X, by cosine ("nn") or CSLS ("csls").

    `source_space`: the whole source matrix when X is a subset of it (CSLS's r_X(y) is over all source rows).
    """
    if method not in ("nn", "csls"):
        raise ValueError(f"unknown retrieval method {method!r} (nn or csls)")
    x, y = normalize_rows(as_float_tensor(x)), normalize_rows(as_float_tensor(y))
    n = min(n, len(y))
    if method == "csls":
        # r_Y(x) is constant along a row, so only the hubness penalty r_X(y) changes the ranking.
        space = x if source_space is None else normalize_rows(as_float_tensor(source_space))
        hubness = mean_topk_similarity(y, space, csls_k, chunk_rows)
    out = torch.empty(len(x), n, dtype=torch.long, device=x.device)
    for start, stop in _row_chunks(len(x), len(y), chunk_rows):
        scores = x[start:stop] @ y.T
        if method == "csls":
            scores = 2 * scores - hubness[None, :]
        out[start:stop] = scores.topk(n, dim=1).indices
    return out


def translation_accuracy(src, tgt, gold_pairs, method="nn", ks=(1, 5, 10), csls_k=10, chunk_rows=None):
    """Word translation precision@k (MUSE protocol): for every distinct source index of `gold_pairs`, a hit when
    any of its gold target indices is among its k retrieved rows of `tgt`. Returns {k: precision}.

    `src` and `tgt` are the full (already mapped) embedding matrices: the CSLS hubness term uses all of them.
    """
    gold = torch.as_tensor(gold_pairs, dtype=torch.long).reshape(-1, 2)
    if len(gold) == 0:
        raise ValueError("no gold pairs to evaluate")
    queries, query_of_pair = torch.unique(gold[:, 0], return_inverse=True)
    src = as_float_tensor(src)
    retrieved = nearest_neighbours(src[queries.to(src.device)], tgt, max(ks), method, csls_k, chunk_rows,
                                   source_space=src).cpu()
    # rank of the gold target among each query's retrieved list (max(ks) = not retrieved)
    match = retrieved[query_of_pair] == gold[:, 1:2]
    rank = torch.where(match.any(dim=1), match.float().argmax(dim=1), torch.full_like(gold[:, 0], max(ks)))
    best_rank = torch.full((len(queries),), max(ks), dtype=torch.long).scatter_reduce(0, query_of_pair, rank, "amin")
    return {k: (best_rank < k).float().mean().item() for k in ks}


def _similarity_distribution_init(x, z, csls_k):
    """Artetxe et al. 2018 initial dictionary: the sorted rows of the square-rooted similarity matrices are
    language-independent signatures of words; match them by CSLS in both directions (union)."""

    def signature(m):
        u, s, _ = torch.linalg.svd(m, full_matrices=False)
        sqrt_sim = (u * s) @ u.T  # (U S U^T)^2 = M M^T
        return iterative_normalize(sqrt_sim.sort(dim=1).values, steps=1)

    sim = signature(x) @ signature(z).T
    fwd = sim.topk(min(csls_k, sim.shape[1]), dim=1).values.mean(dim=1)
    bwd = sim.topk(min(csls_k, sim.shape[0]), dim=0).values.mean(dim=0)
    sim = sim - fwd[:, None] / 2 - bwd[None, :] / 2
    return (torch.cat([torch.arange(len(x), device=sim.device), sim.argmax(dim=0)]),
            torch.cat([sim.argmax(dim=1), torch.arange(len(z), device=sim.device)]))


def _induce_dictionary(xw, zw, csls_k, keep_prob, generator, chunk_rows=None):
    """Each row of XW's CSLS match in ZW, keeping every candidate with probability keep_prob (stochastic
    dictionary induction). Returns (matches, mean best cosine), the latter being VecMap's objective."""
    hubness = mean_topk_similarity(zw, xw, csls_k, chunk_rows)
    matches = torch.empty(len(xw), dtype=torch.long, device=xw.device)
    best = xw.new_empty(len(xw))
    for start, stop in _row_chunks(len(xw), len(zw), chunk_rows):
        sim = xw[start:stop] @ zw.T
        best[start:stop] = sim.max(dim=1).values
        sim -= hubness[None, :] / 2  # ranks like CSLS: r(x) is constant along the row
        if keep_prob < 1:
            dropped = torch.rand(sim.shape, generator=generator, device=sim.device, dtype=sim.dtype) >= keep_prob
            sim.masked_fill_(dropped, float("-inf"))
        matches[start:stop] = sim.argmax(dim=1)
    return matches, best.mean().item()


def unsupervised_mapping(x, y, init_vocab=4000, vocab_cutoff=20000, csls_k=10, keep_prob=0.1,
                         keep_prob_growth=2.0, patience=50, threshold=1e-6, max_iterations=1000, seed=0,
                         progress=False):
    """Fully unsupervised cross-lingual mapping (Artetxe et al. 2018, VecMap `--unsupervised`, orthogonal).

    X and Y are word embeddings with rows sorted by decreasing word frequency. Both are normalised with
    `iterative_normalize(., steps=1)` (unit, centre, unit); the returned maps apply to those normalised matrices:
    `iterative_normalize(X, 1) @ Wx` and `iterative_normalize(Y, 1) @ Wy` live in one space (Wy is the identity:
    X is mapped into Y's space).

    Initial dictionary: similarity-distribution matching of the `init_vocab` most frequent words. Self-learning:
    Procrustes on the current dictionary, then a new dictionary by CSLS retrieval among the `vocab_cutoff` most
    frequent words in both directions (union), keeping each candidate with probability `keep_prob`, which grows
    by `keep_prob_growth` whenever the objective has not improved by `threshold` for `patience` iterations;
    stops once it has not improved at keep probability 1.

    Returns (Wx, Wy, pairs) with `pairs` the final dictionary, a LongTensor (n, 2) of (row of X, row of Y).
    """
    x = iterative_normalize(x, steps=1)
    z = iterative_normalize(y, steps=1).to(x.device, x.dtype)
    init_size = min(init_vocab, len(x), len(z))
    src, trg = _similarity_distribution_init(x[:init_size], z[:init_size], csls_k)
    x_cut, z_cut = x[:vocab_cutoff], z[:vocab_cutoff]
    generator = torch.Generator(device=x.device).manual_seed(seed)
    best_objective, last_improvement = float("-inf"), 0
    for iteration in range(1, max_iterations + 1):
        if iteration - last_improvement > patience:
            if keep_prob >= 1.0:
                break
            keep_prob = min(1.0, keep_prob * keep_prob_growth)
            last_improvement = iteration
        xw = x_cut @ procrustes(x[src], z[trg])
        fwd, fwd_objective = _induce_dictionary(xw, z_cut, csls_k, keep_prob, generator)
        bwd, bwd_objective = _induce_dictionary(z_cut, xw, csls_k, keep_prob, generator)
        src = torch.cat([torch.arange(len(x_cut), device=x.device), bwd])
        trg = torch.cat([fwd, torch.arange(len(z_cut), device=x.device)])
        objective = (fwd_objective + bwd_objective) / 2
        if objective - best_objective >= threshold:
            last_improvement, best_objective = iteration, objective
        if progress:
            log(f"vecmap iteration {iteration}: objective {objective:.4f} keep_prob {keep_prob:.2f}")
    w = procrustes(x[src], z[trg])
    pairs = torch.unique(torch.stack([src, trg], dim=1), dim=0)
    return w, torch.eye(z.shape[1], dtype=w.dtype, device=w.device), pairs
