"""The multilinguality metrics and masked perplexity on hand-made tensors (Dufter & Schuetze 2020, section 2.2)."""
import math

import pytest
import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import PairedEncoder, length_batches
from fairseq_xmlm.evaluation.multilinguality import (
    compact_tokens,
    f1_score,
    gold_alignment,
    mask_positions,
    mean_pool,
    multilinguality_score,
    mutual_argmax_counts,
    precision_at_1,
)
from fairseq_xmlm.evaluation.scores import masked_perplexity


def padded_sentences(lengths, dim=16, seed=0):
    """Random word vectors for sentences of the given lengths, right-padded with garbage (not zeros)."""
    gen = torch.Generator().manual_seed(seed)
    states = torch.randn(len(lengths), max(lengths), dim, generator=gen)
    return states, torch.tensor(lengths)


def reverse_each(states, lengths):
    out = states.clone()
    for b, n in enumerate(lengths.tolist()):
        out[b, :n] = states[b, :n].flip(0)
    return out


def test_identical_representations_score_one_everywhere():
    states, lengths = padded_sentences([5, 9, 3, 7])
    counts = mutual_argmax_counts(states, states, lengths, lengths, gold_alignment(lengths))
    assert counts == (24, 24, 24)
    assert f1_score(*counts) == 1.0
    vectors = torch.randn(50, 16, generator=torch.Generator().manual_seed(1))
    rho = tau = precision_at_1(vectors, vectors.clone())
    assert rho == 1.0
    assert multilinguality_score({0: {"retrieval": rho, "translation": tau}, 8: {"retrieval": rho, "translation": tau}}) == 1.0


def test_permuted_twins_score_the_share_of_fixed_points():
    n = 200
    vectors = torch.randn(n, 32, generator=torch.Generator().manual_seed(2))
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    fixed_points = int((permutation == torch.arange(n)).sum())
    score = precision_at_1(vectors, vectors[permutation], chunk_size=37)  # several chunks
    assert score == pytest.approx(fixed_points / n)
    assert score < 5 / n  # ~1/n: retrieval finds the permuted item, not the twin


def test_retrieval_counts_a_verbatim_repeat_as_a_hit():
    vectors = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    vectors[3] = vectors[1]  # sentence 3 is sentence 1 again: argmax returns row 1 for query 3
    assert precision_at_1(vectors, vectors.clone()) == pytest.approx(0.75)
    assert precision_at_1(vectors, vectors.clone(), labels=torch.tensor([0, 1, 2, 1])) == 1.0


def test_retrieval_refuses_unequal_sets():
    with pytest.raises(XmlmError, match="equally long"):
        precision_at_1(torch.randn(3, 4), torch.randn(4, 4))


def test_inverted_order_is_handled_by_the_gold_alignment():
    states, lengths = padded_sentences([6, 4, 8])
    inverted = reverse_each(states, lengths)
    reversed_gold = gold_alignment(lengths, reversed_order=True)
    assert reversed_gold[1].tolist() == [3, 2, 1, 0, -1, -1, -1, -1]
    assert f1_score(*mutual_argmax_counts(states, inverted, lengths, lengths, reversed_gold)) == 1.0
    # against the identity gold every prediction is wrong (even lengths: no middle word maps onto itself)
    correct, predicted, gold = mutual_argmax_counts(states, inverted, lengths, lengths, gold_alignment(lengths))
    assert (correct, predicted, gold) == (0, 18, 18)


def test_padding_never_takes_part_in_the_alignment():
    states, lengths = padded_sentences([3, 6])
    target = states.clone()
    target[0, 3:] = states[0, :3].repeat(1, 1)  # padding of sentence 0 copies its words: would steal the argmax
    counts = mutual_argmax_counts(states, target, lengths, lengths, gold_alignment(lengths))
    assert counts == (9, 9, 9)


def test_mutual_argmax_drops_one_sided_matches():
    src = torch.tensor([[[1.0, 0.0], [0.9, 0.1]]])  # both source words are closest to target word 0
    tgt = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]])
    lengths = torch.tensor([2])
    correct, predicted, gold = mutual_argmax_counts(src, tgt, lengths, lengths, gold_alignment(lengths))
    assert (correct, predicted, gold) == (1, 1, 2)  # only 0<->0 is mutual
    assert f1_score(correct, predicted, gold) == pytest.approx(2 * 1 * 0.5 / 1.5)
    assert f1_score(0, 0, 2) == 0.0


def test_specials_are_excluded_from_pooling_and_alignment():
    states = torch.tensor([[[100.0, 100.0], [1.0, 3.0], [3.0, 5.0], [-100.0, 7.0], [9.0, 9.0]]])
    keep = torch.tensor([[False, True, True, False, False]])  # <s> w w </s> <pad>
    assert mean_pool(states, keep).tolist() == [[2.0, 4.0]]
    words, lengths = compact_tokens(states, keep)
    assert lengths.tolist() == [2]
    assert words[0, :2].tolist() == [[1.0, 3.0], [3.0, 5.0]]
    assert mean_pool(states, torch.zeros_like(keep)).tolist() == [[0.0, 0.0]]  # nothing kept: no NaN


def test_length_batches_cover_every_item_once_within_the_token_budget():
    lengths = [5, 1, 30, 7, 7, 2, 64, 3]
    batches = length_batches(lengths, max_tokens=40)
    assert sorted(k for batch in batches for k in batch) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or max(lengths[k] for k in batch) * len(batch) <= 40


def test_mask_positions_ignore_specials_and_batching():
    maskable = [torch.tensor([False] + [True] * n + [False]) for n in (20, 3, 50, 11)] * 50
    chosen = mask_positions(maskable, 0.15, seed=7)
    assert all(not (c & ~m).any() for c, m in zip(chosen, maskable))
    rate = sum(int(c.sum()) for c in chosen) / sum(int(m.sum()) for m in maskable)
    assert 0.12 < rate < 0.18
    again = mask_positions(maskable, 0.15, seed=7)
    assert all(torch.equal(a, b) for a, b in zip(chosen, again))
    assert not all(torch.equal(a, b) for a, b in zip(chosen, mask_positions(maskable, 0.15, seed=8)))


def test_masked_perplexity_of_uniform_and_perfect_predictors():
    vocab, mask_id = 10, 9
    tokens = torch.tensor([[0, 4, 5, 6, 1], [0, 7, 8, 1, 2]])
    masked = torch.tensor([[False, True, False, True, False], [False, True, True, False, False]])
    batch = (tokens, torch.tensor([0, 1]), masked, torch.tensor([mask_id, mask_id]))
    seen_inputs = []

    def uniform(inputs, lang_ids, positions):
        seen_inputs.append(inputs)
        return torch.zeros(int(positions.sum()), vocab)

    assert masked_perplexity(uniform, [batch]) == pytest.approx(vocab)
    assert torch.equal(seen_inputs[0][masked], torch.full((4,), mask_id))  # masked positions are <mask> only
    assert torch.equal(seen_inputs[0][~masked], tokens[~masked])

    def perfect(inputs, lang_ids, positions):
        return F_one_hot(tokens[positions], vocab) * 50.0

    assert masked_perplexity(perfect, [batch]) == pytest.approx(1.0)
    with pytest.raises(XmlmError, match="no token was masked"):
        masked_perplexity(uniform, [(tokens, torch.tensor([0, 1]), torch.zeros_like(masked), torch.tensor([9, 9]))])


def F_one_hot(ids, vocab):
    return torch.nn.functional.one_hot(ids, vocab).float()


class TokenEmbeddingEncoder(torch.nn.Module):
    """Our model interface at its smallest: layer 0 = token embedding, layer 1 = that plus the language's offset."""

    def __init__(self, vocab, dim):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, dim)
        self.offset = torch.nn.Parameter(torch.randn(2, dim))

    layers = ("offset",)  # one layer above the embeddings: the evaluation reads the depth from len(model.layers)

    def encode_layers(self, tokens, lang_ids, last_layer=None):
        x = self.embedding(tokens)
        return [x, x + self.offset[lang_ids].unsqueeze(1)][: (1 if last_layer is None else last_layer) + 1]


def test_paired_encoder_restores_input_order_and_skips_specials():
    torch.manual_seed(0)
    encoder_model = TokenEmbeddingEncoder(vocab=40, dim=8)
    bos, eos, pad = 0, 2, 1
    sentences = [torch.tensor([bos, *range(3, 3 + n), eos]) for n in (9, 1, 4, 12, 2)]
    encoder = PairedEncoder(encoder_model, torch.tensor([bos, eos, pad]), pad, (0, 1), torch.device("cpu"),
                            max_tokens=20)
    with torch.no_grad():
        pooled, counts = encoder.pooled_and_aligned(sentences, sentences, gold_reversed=False)
        expected = torch.stack([encoder_model.embedding(s[1:-1]).mean(0) for s in sentences])
    assert torch.allclose(pooled[0][0], expected, atol=1e-6)
    assert torch.allclose(pooled[0][1], expected, atol=1e-6)
    assert counts[0] == (28, 28, 28)
    with pytest.raises(XmlmError, match="layer 5 does not exist"):
        PairedEncoder(encoder_model, torch.tensor([0]), pad, (0, 5), torch.device("cpu")).pooled_and_aligned(
            sentences, sentences)


class PaddingSeeingEncoder(TokenEmbeddingEncoder):
    """Layer 1 adds the mean of the row's embeddings: over its real tokens, or over the whole padded row when the
    attention mask is dropped (has_padding False), as attention to padding would."""

    def encode_layers(self, tokens, lang_ids, last_layer=None, has_padding=None):
        x = self.embedding(tokens)
        seen = torch.ones_like(tokens, dtype=torch.bool) if has_padding is False else tokens.ne(1)
        context = (x * seen.unsqueeze(-1)).sum(1, keepdim=True) / seen.sum(1).view(-1, 1, 1)
        return [x, x + context]


def test_runs_trained_attending_to_padding_are_evaluated_so():
    """--attend-padding: batches of 256 in input order without an attention mask, as the paper's code evaluates;
    otherwise a sentence's vectors do not depend on the sentences batched with it."""
    from types import SimpleNamespace

    from fairseq_xmlm.evaluation.encode import ATTENDED_BATCH

    torch.manual_seed(0)
    model = PaddingSeeingEncoder(vocab=40, dim=8)
    bos, eos, pad = 0, 2, 1
    short, long = torch.tensor([bos, 5, 6, eos]), torch.tensor([bos, *range(3, 20), eos])

    def task(attend):
        return SimpleNamespace(cfg=SimpleNamespace(attend_padding=attend), special_ids={bos, eos, pad},
                               dictionary=SimpleNamespace(pad=lambda: pad))

    vectors = {}
    for attend in (False, True):
        encoder = PairedEncoder.for_task(model, task(attend), (1,), torch.device("cpu"))
        assert encoder.attend_padding == attend
        with torch.no_grad():
            alone = encoder.pooled([short], lang=0)[1][0]
            beside_long = encoder.pooled([short, long], lang=0)[1][0]
        vectors[attend] = (alone, beside_long)
    assert torch.allclose(*vectors[False], atol=1e-6)  # masked: the long neighbour's padding is not seen
    assert not torch.allclose(*vectors[True], atol=1e-3)  # attended: the short row's padding is
    lengths = [3] * (ATTENDED_BATCH + 10)
    assert PairedEncoder.for_task(model, task(True), (1,), torch.device("cpu"))._batches(lengths) == [
        list(range(ATTENDED_BATCH)), list(range(ATTENDED_BATCH, ATTENDED_BATCH + 10))]
    # a task without cfg.attend_padding (bilingual_mlm's) masks
    assert not PairedEncoder.for_task(model, SimpleNamespace(special_ids={0}, dictionary=SimpleNamespace(
        pad=lambda: pad)), (1,), torch.device("cpu")).attend_padding


def test_perplexity_is_base_e():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]]))
    tokens = torch.tensor([[1]])
    batch = (tokens, torch.tensor([0]), torch.tensor([[True]]), torch.tensor([2]))
    assert masked_perplexity(lambda *_: logits, [batch]) == pytest.approx(math.exp(-math.log(0.25)))


def test_workers_change_nothing_but_the_speed():
    """Batches spread over threads come back in input order; counts and the NLL sum add up in batch order."""
    torch.manual_seed(0)
    encoder_model = TokenEmbeddingEncoder(vocab=40, dim=8)
    bos, eos, pad = 0, 2, 1
    lengths = [9, 1, 4, 12, 2, 7, 7, 3, 15, 5]
    sentences = [torch.tensor([bos, *torch.randint(3, 40, (n,)).tolist(), eos]) for n in lengths]
    twins = [torch.tensor([bos, *reversed(s[1:-1].tolist()), eos]) for s in sentences]
    results = {}
    for workers in (1, 3):
        encoder = PairedEncoder(encoder_model, torch.tensor([bos, eos, pad]), pad, (0, 1), torch.device("cpu"),
                                max_tokens=20, workers=workers)
        results[workers] = (*encoder.pooled_and_aligned(sentences, twins, gold_reversed=True),
                            encoder.pooled(sentences, lang=1))
    (pooled_1, counts_1, single_1), (pooled_3, counts_3, single_3) = results[1], results[3]
    assert counts_1 == counts_3 and counts_1[0][2] == sum(lengths)
    for layer in (0, 1):
        assert all(torch.equal(a, b) for a, b in zip(pooled_1[layer], pooled_3[layer]))
        assert torch.equal(single_1[layer], single_3[layer])
        assert torch.allclose(single_1[layer], pooled_1[layer][1], atol=1e-6)  # twins: the same pieces, reversed

    vocab = 12
    batches = [(torch.randint(0, vocab, (2, 6)), torch.tensor([0, 1]), torch.rand(2, 6) < 0.5, torch.tensor([11, 11]))
               for _ in range(7)]
    logits = torch.randn(vocab)

    def predict(inputs, lang_ids, positions):
        return logits.expand(int(positions.sum()), vocab)

    assert masked_perplexity(predict, batches, workers=3) == masked_perplexity(predict, batches)
