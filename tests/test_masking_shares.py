"""How targets are replaced, counted over many draws: every replacement kind's share under each replacement policy
(the flags' probabilities, `resolve_replacement_probs`), within binomial bounds, in `masking.mask_batch` and in the
packed path's batches of several runs against each run's own (fairseq's) batches."""
import dataclasses
import math

import pytest
import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import Masker, ReplacementConfig, candidate_table, resolve_replacement_probs
from fairseq_xmlm.packed import runs as runs_module
from fairseq_xmlm.packed.group import GroupData

KINDS = ("mask", "keep", "random", "knn")
SIGMAS = 5  # a share outside 5 standard deviations of its probability: a 1-in-1.7-million accident, or a bug

# --- mask_batch on a vocabulary built to tell the kinds apart -------------------------------------------------
# ids 0-3 specials, 4 and 5 the two languages' mask symbols; language 0 writes ids 10-169, language 1 ids 210-369.
# A token's 3 neighbours lie in the other language's reserved ids (370-399 for language 0's tokens, 170-199 for
# language 1's), which no sentence holds and no random draw gives: a replacement by such an id is a knn one. The
# last 10 ids of each language have no neighbours (knn falls back to the mask symbol).
LANGUAGE_IDS = (torch.arange(10, 170), torch.arange(210, 370))
NEIGHBOUR_BASE = (370, 170)
WITHOUT_NEIGHBOURS = (torch.arange(160, 170), torch.arange(360, 370))
MASK_IDS = torch.tensor([4, 5])
SPECIALS = torch.tensor([0, 1, 2, 3, 4, 5])
PAD, K = 1, 3


def neighbour_table():
    table = torch.full((400, K), -1, dtype=torch.long)
    for lang, ids in enumerate(LANGUAGE_IDS):
        for j in range(K):
            table[ids, j] = NEIGHBOUR_BASE[lang] + (ids + j) % 30
        table[WITHOUT_NEIGHBOURS[lang]] = -1
    return table


def masker_for(config):
    """The Masker a task builds for these flags: "within" draws random words from the row's own language."""
    sets = LANGUAGE_IDS if config.random_source == "within" else [torch.cat(LANGUAGE_IDS)]
    candidates, counts = candidate_table(list(sets))
    return Masker(0.15, resolve_replacement_probs(config), SPECIALS, candidates, counts,
                  neighbour_table() if config.knn else None)


def sentences(generator, rows=256, width=48):
    """bos, random tokens of the row's language, eos, padding: rows alternate languages, lengths vary."""
    langs = torch.arange(rows) % 2
    ids = torch.stack(LANGUAGE_IDS)[langs]
    tokens = ids.gather(1, torch.randint(ids.size(1), (rows, width), generator=generator))
    lengths = torch.randint(8, width - 1, (rows,), generator=generator)
    position = torch.arange(width).unsqueeze(0)
    tokens = torch.where(position < lengths.unsqueeze(1), tokens, PAD)
    tokens[torch.arange(rows), lengths] = 2  # eos
    return torch.cat([torch.zeros(rows, 1, dtype=torch.long), tokens], dim=1), langs


def classify(inputs, targets, langs, neighbours):
    """For every target: 0 mask, 1 keep, 2 random, 3 knn (None: no neighbour table)."""
    at = targets.ne(PAD)
    original, given = targets[at], inputs[at]
    row_lang = langs.unsqueeze(1).expand_as(inputs)[at]
    kind = torch.full_like(original, 2)
    if neighbours is not None:
        kind[(neighbours[original] == given.unsqueeze(1)).any(dim=1)] = 3
    kind[given.eq(original)] = 1
    kind[given.eq(MASK_IDS[row_lang])] = 0
    return kind, original, given, row_lang


def assert_share(name, count, n, p):
    if p == 0:
        assert count == 0, f"{name}: {count} of {n} targets, expected none"
        return
    bound = SIGMAS * math.sqrt(p * (1 - p) / n)
    assert abs(count / n - p) <= bound, f"{name}: share {count / n:.4f} of {n}, expected {p:.4f} +- {bound:.4f}"


POLICIES = {
    "bert": ReplacementConfig(),
    "no-random": ReplacementConfig(no_random=True),
    "knn": ReplacementConfig(knn=K),
    "knn-no-random": ReplacementConfig(no_random=True, knn=K),
    "within": ReplacementConfig(random_replace="within"),
    "within-knn": ReplacementConfig("0.4,0.1,0.2,0.3", random_replace="within", knn=K),
    # the paper's code: the random share goes to the mask symbol (.9/.1/0), not to keep (.8/.2/0, its text)
    "no-random-.9": ReplacementConfig(no_random=True, no_random_mask_share=0.9),
}


def test_no_random_mask_share_sets_mask_and_keep_and_needs_no_random():
    assert resolve_replacement_probs(POLICIES["no-random"]) == (0.8, 0.2, 0.0, 0.0)
    assert resolve_replacement_probs(POLICIES["no-random-.9"]) == pytest.approx((0.9, 0.1, 0.0, 0.0))
    assert resolve_replacement_probs(ReplacementConfig(no_random=True, knn=K, no_random_mask_share=0.6)) == \
        pytest.approx((0.6, 0.1, 0.0, 0.3))
    for config, error in ((ReplacementConfig(no_random_mask_share=0.9), "applies to --no-random runs only"),
                          (ReplacementConfig(no_random=True, no_random_mask_share=1.2), "must be in"),
                          (ReplacementConfig(no_random=True, knn=K, no_random_mask_share=0.8), "must be in")):
        with pytest.raises(XmlmError, match=error):
            resolve_replacement_probs(config)


@pytest.mark.parametrize("policy", POLICIES)
def test_every_replacement_kind_takes_its_share(policy):
    config = POLICIES[policy]
    masker = masker_for(config)
    p_mask, p_keep, p_random, p_knn = masker.probs
    generator = torch.Generator().manual_seed(7)
    counts, n, without_neighbours, n_maskable = torch.zeros(4, dtype=torch.long), 0, 0, 0
    for _ in range(60):
        tokens, langs = sentences(generator)
        sets = langs if config.random_source == "within" else torch.zeros_like(langs)
        inputs, targets = masker(tokens, MASK_IDS[langs], sets, generator, PAD)
        kind, original, given, row_lang = classify(inputs, targets, langs, masker.knn_neighbours)
        counts += torch.bincount(kind, minlength=4)
        n += len(kind)
        n_maskable += int((~torch.isin(tokens, SPECIALS)).sum())
        without_neighbours += int(torch.isin(original, torch.cat(WITHOUT_NEIGHBOURS)).sum())
        assert targets.eq(PAD).logical_or(~torch.isin(tokens, SPECIALS)).all(), "a special symbol became a target"
        assert torch.equal(inputs[targets.eq(PAD)], tokens[targets.eq(PAD)]), "a token that is no target changed"
        random_words = given[kind == 2]
        own = torch.stack([torch.isin(random_words, ids) for ids in LANGUAGE_IDS])
        if config.random_source == "within":
            assert own[row_lang[kind == 2], torch.arange(len(random_words))].all(), "a random word left its language"
    assert_share(f"{policy} targets", n, n_maskable, 0.15)
    # a random draw equal to the token counts as keep; a token without neighbours is masked instead of knn-replaced
    candidates = len(LANGUAGE_IDS[0]) * (1 if config.random_source == "within" else 2)
    no_neighbour = without_neighbours / n if p_knn else 0.0
    expected = (p_mask + p_knn * no_neighbour, p_keep + p_random / candidates, p_random * (1 - 1 / candidates),
                p_knn * (1 - no_neighbour))
    assert n > 50_000
    for name, count, p in zip(KINDS, counts.tolist(), expected):
        assert_share(f"{policy} {name}", count, n, p)


@pytest.mark.parametrize("policy", POLICIES)
def test_one_sort_ranks_as_sorting_twice(policy):
    """choose_targets ranks by inverting one sort's permutation; the earlier code sorted the permutation again: the
    same inputs and targets for the same generator seed, bit for bit."""
    masker = masker_for(POLICIES[policy])
    twice = dataclasses.replace(masker, sort_twice=True)
    tokens, langs = sentences(torch.Generator().manual_seed(3))
    sets = langs if POLICIES[policy].random_source == "within" else torch.zeros_like(langs)
    once_out, twice_out = (m(tokens, MASK_IDS[langs], sets, torch.Generator().manual_seed(11), PAD)
                           for m in (masker, twice))
    assert torch.equal(once_out[0], twice_out[0]) and torch.equal(once_out[1], twice_out[1])
    assert once_out[1].ne(PAD).sum() > 1000


# --- the packed path against fairseq's batches, per run ---------------------------------------------------------
def task_kinds(task, inputs, targets, langs, neighbours):
    """(kind of every target: 0 mask, 1 keep, 2 random, 3 knn) for a fake_english batch."""
    at = targets.ne(task.dictionary.pad())
    original, given = targets[at], inputs[at]
    mask_symbol = torch.tensor([task.specials_of(lang)[2] for lang in (0, 1)])[langs.unsqueeze(1).expand_as(inputs)[at]]
    kind = torch.full_like(original, 2)
    if neighbours is not None:
        kind[(neighbours[original] == given.unsqueeze(1)).any(dim=1)] = 3
    kind[given.eq(original)] = 1
    kind[given.eq(mask_symbol)] = 0
    return kind


FLAG_PROBS = {"bert": (0.8, 0.1, 0.1, 0.0), "no-random": (0.8, 0.2, 0.0, 0.0), "knn": (0.5, 0.1, 0.1, 0.3),
              "no-random-.9": (0.9, 0.1, 0.0, 0.0)}


def test_packed_runs_mask_as_each_run_alone(fake_english_data, tmp_path):
    """Four runs with four policies stacked in one group: each run's targets and replacement shares in the packed
    batches are those of its own fairseq batches, and its flags' probabilities."""
    from test_fake_english import make_task, write_twin_table
    from test_packed_training import command, fairseq_sample

    write_twin_table(make_task(fake_english_data), tmp_path / "knn.pt", k=K)
    flags = {"bert": (), "no-random": ("--no-random",),
             "knn": ("--knn-replace", str(K), "--knn-table", str(tmp_path / "knn.pt")),
             "no-random-.9": ("--no-random", "--no-random-mask-share", "0.9")}
    runs = [runs_module.parse_run(command(fake_english_data, tmp_path, name, 1, *extra)).build()
            for name, extra in flags.items()]
    group = GroupData(runs, torch.device("cpu"))
    schedules = [runs_module.epoch_batches(run, 1) for run in runs]
    batches = 80
    packed = torch.zeros(len(runs), 4, dtype=torch.long)
    for at in range(batches):
        inputs, langs, positions, target_ids, _ = group.batch([s[at] for s in schedules],
                                                              torch.Generator().manual_seed(at))
        for slot, run in enumerate(runs):
            sample = fairseq_sample(inputs, langs, positions, target_ids, slot, run.task.dictionary.pad())
            packed[slot] += torch.bincount(task_kinds(run.task, sample["net_input"]["src_tokens"], sample["target"],
                                                      sample["net_input"]["lang_ids"],
                                                      run.task.datasets["train"].masker.knn_neighbours), minlength=4)
    for slot, (name, run) in enumerate(zip(flags, runs)):
        task, dataset = run.task, run.task.datasets["train"]
        alone = torch.zeros(4, dtype=torch.long)
        iterator = task.get_batch_iterator(dataset, max_sentences=run.cfg.dataset.batch_size, seed=1, epoch=1)
        for _, batch in zip(range(batches), iterator.next_epoch_itr(shuffle=True)):
            alone += torch.bincount(task_kinds(task, batch["net_input"]["src_tokens"], batch["target"],
                                               batch["net_input"]["lang_ids"], dataset.masker.knn_neighbours),
                                    minlength=4)
        probs = dataset.masker.probs
        assert probs == pytest.approx(FLAG_PROBS[name])
        n_packed, n_alone = int(packed[slot].sum()), int(alone.sum())
        assert n_packed > 15_000 and abs(n_packed / n_alone - 1) < 0.02, (name, n_packed, n_alone)
        for kind, p in zip(KINDS, probs):
            slack = 0.002 if p else 0  # a random word may hit the token itself or one of its neighbours
            for path, counts, n in (("packed", packed[slot], n_packed), ("alone", alone, n_alone)):
                share = int(counts[KINDS.index(kind)]) / n
                bound = SIGMAS * math.sqrt(p * (1 - p) / n) + slack
                assert abs(share - p) <= bound, f"{name} {path}: {kind} share {share:.4f}, expected {p} +- {bound:.4f}"
