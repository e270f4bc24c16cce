"""Which runs train together: groups of runs that may step as one stacked model (`grouped`), how much GPU memory a
group takes (`estimated_gpu_bytes`), whether it keeps a GPU busy by itself (`fills_gpu`), and which groups share a
process in lockstep (`lockstep_teams`).
"""
from fairseq_xmlm.packed.optim import adam_betas


def group_key(run):
    """Runs with equal keys may step together: one model shape (with or without lang-pos), one schedule, one
    optimiser, one training set. Seeds may differ: each run keeps its own seed's initialisation and batches, and a
    step pads to the longest of its runs' batches, which is why `grouped` keeps seeds apart."""
    c, t, m = run.cfg, run.cfg.task, run.cfg.model
    return (m.encoder_layers, m.encoder_embed_dim, m.encoder_ffn_embed_dim, m.encoder_attention_heads,
            m.activation_fn, m.dropout, m.attention_dropout, m.activation_dropout, t.no_parallel, t.data,
            t.mask_prob, t.tokens_per_sample, c.optimizer._name, adam_betas(c.optimizer), c.optimizer.adam_eps,
            c.optimizer.weight_decay, tuple(c.optimization.lr), c.optimization.clip_norm, c.optimization.max_epoch,
            c.optimization.max_update, c.lr_scheduler.warmup_updates, c.lr_scheduler.total_num_update,
            c.lr_scheduler.end_learning_rate, c.lr_scheduler.power, c.dataset.batch_size, run.update_size)


# Small models stack one seed's runs only from this many on. A step of stacked BERT-small runs costs about 3 ms of
# kernels whatever the group's size, plus about 0.86 ms per run at one seed's padding (2026-11-27, one H100 and one
# H200, commit 11f3c31): below about 4 runs a seed, five seeds' padding costs less than five groups' steps.
SEPARATE_SEEDS_FROM = 4


def grouped(runs, max_group, max_bytes=None):
    """The runs split by `group_key` and, mostly, by seed; at most `max_group` to a chunk and, given max_bytes, at
    most as many as `estimated_gpu_bytes` puts under it (at least one).

    fairseq cuts batches from sentences sorted by length and each seed shuffles them, so seeds stacked together pad
    to the longest of their batches: 1.64 tokens per real token for Dufter's five seeds against 1.02 for one, in
    epoch 1 of his training set (counted from `runs.epoch_batches` of the recipe's five seeds, 2026-11-27, commit
    11f3c31). A key's runs are therefore grouped by seed, unless the model is small (not `fills_gpu`) and some seed
    has fewer than SEPARATE_SEEDS_FROM runs of it."""
    groups = {}
    for run in runs:
        groups.setdefault(group_key(run), []).append(run)
    chunks = []
    for members in groups.values():
        size = max_group if max_bytes is None else max(1, min(max_group, int(max_bytes // estimated_gpu_bytes(
            members[:1]))))
        seeds = {}
        for run in members:
            seeds.setdefault(run.cfg.common.seed, []).append(run)
        separate = fills_gpu(members) or min(map(len, seeds.values())) >= SEPARATE_SEEDS_FROM
        for part in (seeds.values() if separate else [members]):
            chunks += [part[i:i + size] for i in range(0, len(part), size)]
    return chunks


def estimated_gpu_bytes(runs):
    """A rough upper bound of a group's GPU memory, to keep groups side by side from running out of it: per run,
    20 bytes a weight (fp32 master, gradient, two Adam moments, bf16 copy) and the bf16 activations that backward
    keeps for a batch of the longest sentences (about 5 hidden-size and 2 FFN-size values per token and layer: 3
    stacked BERT-base runs peaked at 20.6 GB, their longest batch 256 x 93 tokens; 2026-11-27, one H200, commit
    216e4ff), with 25 % slack. A BERT-base run comes to about 12 GB, a BERT-small one to about 0.9 GB."""
    m, c = runs[0].cfg.model, runs[0].cfg
    d, f, layers = m.encoder_embed_dim, m.encoder_ffn_embed_dim, m.encoder_layers
    tokens = runs[0].update_size * c.task.tokens_per_sample  # an update's micro-batches step as one batch
    activations = layers * tokens * (5 * d + 2 * f) * 2
    return len(runs) * (20 * weight_count(runs[0]) + 1.25 * activations)


def weight_count(run):
    """About how many weights one run's model has: its layers and the embeddings of a Bible-sized vocabulary."""
    m = run.cfg.model
    d = m.encoder_embed_dim
    return m.encoder_layers * (4 * d * d + 2 * d * m.encoder_ffn_embed_dim) + 20_000 * d


def fills_gpu(runs):
    """Whether a group keeps a GPU busy by itself, so that a second such group beside it only takes turns: two
    BERT-base groups side by side made 40 run-updates/s together, one alone 51.3; one beside BERT-small groups was
    not slowed (2026-11-26, one H100, commit 3c94a8f). BERT-base has about 100 M weights, BERT-small 2 M."""
    return weight_count(runs[0]) >= 10_000_000


def lockstep_teams(chunks):
    """The groups as they share processes (`train_groups`): each group that fills the GPU with one that does not, of
    the same length (data, epochs, updates, sentences an update) where there is one (a round of two groups on streams of
    their own took 1/1.040 of their updates one after another; 2026-11-27, one H100, commit 57efe4a); every other
    group alone, the small ones first. A small group compiles in a fraction of a large team's warm-up, so the GPU
    trains it while the large teams compile: in the recipe's 5-seed schedule the GPU first trained 78 s after the
    start, against 144 s with the small group in the first large team (2026-11-28, one H200, commit b60f796 and the
    tree before it)."""
    def length(chunk):
        cfg = chunk[0].cfg
        return cfg.task.data, cfg.task.no_parallel, cfg.optimization.max_epoch, cfg.optimization.max_update, \
            chunk[0].update_size

    large, small = [c for c in chunks if fills_gpu(c)], [c for c in chunks if not fills_gpu(c)]
    teams = []
    for chunk in large:
        partner = next((c for c in small if length(c) == length(chunk)), None)
        if partner is not None:
            small.remove(partner)
        teams.append([chunk] + ([partner] if partner else []))
    return [[chunk] for chunk in small] + teams
