"""partially_shared_roberta: routing, parameter counts, language-restricted softmax, attention math."""
import math
import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from fairseq.data import Dictionary

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.models.partially_shared_roberta import (PartiallySharedRoberta, PartiallySharedRobertaConfig,
                                                        lookup_by_language)

V, D, FFN, LAYERS, T = 40, 16, 32, 4, 12


class TwoLanguageTask(SimpleNamespace):
    """The three things the model asks of a task: languages, dictionary, max positions (+ vocab masks)."""

    def max_positions(self):
        return T

    def language_vocab_masks(self):
        ids = torch.arange(len(self.dictionary))
        return torch.stack([(ids < 4) | (ids % 2 == 0), (ids < 4) | (ids % 2 == 1)])


def make_task(lang_pos=False):
    dictionary = Dictionary()
    for i in range(V - len(dictionary)):
        dictionary.add_symbol(f"w{i}")
    return TwoLanguageTask(langs=("a", "b"), dictionary=dictionary, lang_pos=lang_pos)


def make_model(sep_emb=False, sep_layers="", lang_pos=False, dropout=0.0, **options):
    cfg = PartiallySharedRobertaConfig(encoder_layers=LAYERS, encoder_embed_dim=D, encoder_ffn_embed_dim=FFN,
                                       encoder_attention_heads=2, dropout=dropout, attention_dropout=dropout,
                                       sep_emb=sep_emb, sep_layers=sep_layers, **options)
    torch.manual_seed(0)
    return PartiallySharedRoberta.build_model(cfg, make_task(lang_pos))


def batch(lang, rows=3):
    tokens = torch.randint(4, V, (rows, T))
    tokens[0, -3:] = 1  # padding
    return tokens, torch.full((rows,), lang)


def layer_params():
    attention = 3 * D * D + 3 * D + D * D + D
    ffn = D * FFN + FFN + FFN * D + D
    return attention + ffn + 4 * D  # two LayerNorms


@pytest.mark.parametrize("sep_emb,sep_layers,lang_pos", [
    (False, "", False), (True, "", False), (False, "1-3", False), (True, "1-2", False), (False, "", True),
])
def test_parameter_counts(sep_emb, sep_layers, lang_pos):
    model = make_model(sep_emb, sep_layers, lang_pos)
    n_sep = {"": 0, "1-3": 3, "1-2": 2}[sep_layers]
    tables = 2 if sep_emb else 1
    expected = tables * (V * D + V)  # token embeddings + output bias
    expected += (2 if (sep_emb or lang_pos) else 1) * T * D  # positions
    expected += (2 * D if lang_pos else 0) + 2 * D  # segment embedding, embedding LayerNorm
    expected += (LAYERS + n_sep) * layer_params()
    expected += D * D + D + 2 * D  # LM head dense + LayerNorm
    assert sum(p.numel() for p in model.parameters()) == expected


def test_language_a_never_touches_language_b_parts():
    model = make_model(sep_emb=True, sep_layers="1-2")
    tokens, langs = batch(lang=0)
    logits, _ = model(tokens, lang_ids=langs)
    logits[torch.isfinite(logits)].sum().backward()
    owned = model.language_parameters()
    params = dict(model.named_parameters())
    for name in owned[1]:
        grad = params[name].grad
        assert grad is None or torch.count_nonzero(grad) == 0, name
    assert all(params[name].grad is not None and params[name].grad.abs().sum() > 0
               for name in owned[0] if "token_embeddings" in name or "layers.0" in name)
    shared = set(params) - set(owned[0]) - set(owned[1])
    assert any(n.startswith("layers.3") for n in shared) and not any(n.startswith("layers.1.") for n in shared)


def test_shared_layers_learn_from_both_languages():
    model = make_model(sep_emb=True, sep_layers="1-2")
    top = model.layers[3][0].ffn_out.weight
    grads = []
    for lang in (0, 1):
        model.zero_grad()
        tokens, langs = batch(lang)
        logits, _ = model(tokens, lang_ids=langs)
        logits[torch.isfinite(logits)].sum().backward()
        grads.append(top.grad.clone())
    assert grads[0].abs().sum() > 0 and grads[1].abs().sum() > 0 and not torch.equal(grads[0], grads[1])


def test_mixed_batch_routes_each_row_to_its_language():
    model = make_model(sep_emb=True, sep_layers="1-2").eval()
    tokens, _ = batch(0, rows=4)
    langs = torch.tensor([0, 1, 0, 1])
    together = model.encode_layers(tokens, langs)[-1]
    for lang in (0, 1):
        rows = langs == lang
        alone = model.encode_layers(tokens[rows], langs[rows])[-1]
        torch.testing.assert_close(together[rows], alone)


@pytest.mark.parametrize("lang", [0, 1])
def test_one_language_batch_routed_by_its_language_gives_the_same_logits_and_gradients(lang):
    """batch_lang (the collater's word that every row is of one language) skips finding the rows, nothing else."""
    results = []
    for batch_lang in (None, lang):
        model = make_model(sep_emb=True, sep_layers="1-2")
        tokens, langs = batch(lang)
        logits, _ = model(tokens, lang_ids=langs, batch_lang=batch_lang)
        logits[torch.isfinite(logits)].sum().backward()
        results.append((logits, {name: p.grad for name, p in model.named_parameters()}))
    (routed, routed_grads), (whole, whole_grads) = results
    assert torch.equal(routed, whole)
    assert routed_grads.keys() == whole_grads.keys()
    for name, grad in routed_grads.items():
        assert (grad is None) == (whole_grads[name] is None), name
        if grad is not None:
            assert torch.equal(grad, whole_grads[name]), name


@pytest.mark.parametrize("sep_layers", ["", "1-2"])
def test_unpadded_batch_without_attention_mask_is_the_same(sep_layers):
    """has_padding=False (the collater's word that no row is padded) drops the mask, also through routed layers."""
    model = make_model(sep_emb=True, sep_layers=sep_layers).eval()
    tokens = torch.randint(4, V, (4, T))
    langs = torch.tensor([0, 1, 0, 1])
    torch.testing.assert_close(model(tokens, langs, has_padding=False)[0], model(tokens, langs)[0])


def test_separate_softmax_covers_only_the_language_vocabulary():
    model = make_model(sep_emb=True)
    tokens, langs = batch(1)
    logits, _ = model(tokens, lang_ids=langs)
    allowed = make_task().language_vocab_masks()[1]
    assert torch.isinf(logits[..., ~allowed]).all() and torch.isfinite(logits[..., allowed]).all()
    probs = logits.softmax(-1)
    assert torch.allclose(probs[..., allowed].sum(-1), torch.ones(probs.shape[:-1]))


def test_every_layer_is_returned_layer0_after_layernorm():
    model = make_model().eval()
    tokens, langs = batch(0)
    states = model.encode_layers(tokens, langs)
    assert len(states) == LAYERS + 1 and all(s.shape == (3, T, D) for s in states)
    x = model.token_embeddings[0](tokens) + model.position_embeddings[0](torch.arange(T))
    torch.testing.assert_close(states[0], model.embedding_norm(x))


def test_sdpa_attention_equals_the_plain_softmax_formula():
    model = make_model().eval()
    attention = model.layers[0][0].attention
    x = torch.randn(2, T, D)
    keep = torch.ones(2, 1, 1, T, dtype=torch.bool)
    keep[1, ..., -4:] = False
    q, k, v = attention.qkv(x).view(2, T, 3, 2, D // 2).permute(2, 0, 3, 1, 4)
    scores = q @ k.transpose(-1, -2) / math.sqrt(D // 2)
    plain = scores.masked_fill(~keep, float("-inf")).softmax(-1) @ v
    expected = attention.out(plain.transpose(1, 2).reshape(2, T, D))
    torch.testing.assert_close(attention(x, keep), expected, atol=1e-6, rtol=1e-5)


def test_ffn_dropout_is_off_unless_asked_as_in_bert_and_xlm():
    """--dropout acts on the embeddings, attention output and FFN output; the FFN's inner activation gets only
    --activation-dropout (0 by default, like BERT, XLM and fairseq's RoBERTa)."""
    layer = make_model(dropout=0.5).layers[0][0].train()
    x = torch.randn(2, T, D)
    layer.dropout.p = layer.attention.dropout = 0.0  # leave only the FFN's inner dropout that may act
    assert torch.equal(layer(x, None), layer(x, None))
    layer.activation_dropout.p = 0.5
    assert not torch.equal(layer(x, None), layer(x, None))


def test_lang_pos_uses_language_specific_positions():
    model = make_model(lang_pos=True).eval()
    tokens, _ = batch(0)
    as_a = model.encode_layers(tokens, torch.zeros(3, dtype=torch.long))[0]
    as_b = model.encode_layers(tokens, torch.ones(3, dtype=torch.long))[0]
    x = model.token_embeddings[0](tokens) + model.position_embeddings[1](torch.arange(T)) + model.language_embedding.weight[1]
    torch.testing.assert_close(as_b, model.embedding_norm(x))
    assert not torch.allclose(as_a, as_b)


@pytest.mark.parametrize("lang_pos", [False, True])
def test_position_slices_equal_position_lookups_with_their_gradients(lang_pos):
    """Positions are added as slices of the tables (one sum over the batch in backward, no index sort): the same
    values and table gradients as looking every position up, and a language's table learns from its rows only."""
    model = make_model(lang_pos=lang_pos)
    lang_ids = torch.tensor([1, 0, 1])
    weights = torch.randn(3, T, D)
    values, grads = [], []
    for positions in (lambda: model.position_states(lang_ids, T).expand(3, T, D),
                      lambda: lookup_by_language(model.position_embeddings, lang_ids, torch.arange(T).expand(3, T))):
        model.zero_grad(set_to_none=True)
        values.append(positions())
        (values[-1] * weights).sum().backward()
        grads.append([table.weight.grad for table in model.position_embeddings])
    torch.testing.assert_close(*values)
    for sliced, looked_up in zip(*grads):
        torch.testing.assert_close(sliced, looked_up)
    if lang_pos:  # table 0 serves row 1 only
        torch.testing.assert_close(grads[0][0][:T], weights[1])


@pytest.mark.parametrize("bad", ["0-2", "3-9", "4-2", "one-two"])
def test_sep_layers_outside_the_model_are_refused(bad):
    with pytest.raises(XmlmError, match="sep-layers"):
        make_model(sep_layers=bad)


def test_bf16_params_build_a_bf16_model_and_refuse_autocast_beside_them():
    model = make_model(sep_emb=True, bf16_params=True)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert model.vocab_masks.dtype == torch.bool
    assert model(*batch(0))[0].dtype == torch.bfloat16
    with pytest.raises(XmlmError, match="choose one"):
        make_model(bf16_params=True, amp_bf16=True)


def test_language_parts_need_lang_ids():
    model = make_model(sep_layers="1-1")
    with pytest.raises(XmlmError, match="lang_ids"):
        model(batch(0)[0])


def test_masked_tokens_select_rows_before_the_softmax():
    model = make_model().eval()
    tokens, langs = batch(0)
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[:, 2] = True
    full, _ = model(tokens, lang_ids=langs)
    some, _ = model(tokens, lang_ids=langs, masked_tokens=masked)
    torch.testing.assert_close(some, full[masked])
    assert F.cross_entropy(some, tokens[masked]).isfinite()


def test_cublaslt_no_workspace_sets_the_variable_before_the_first_product_unless_the_environment_did(monkeypatch):
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "")  # so that monkeypatch restores the variable's absence
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE")
    make_model()
    assert "CUBLASLT_WORKSPACE_SIZE" not in os.environ
    make_model(cublaslt_no_workspace=True)
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "0"
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "1024")
    make_model(cublaslt_no_workspace=True)
    assert os.environ["CUBLASLT_WORKSPACE_SIZE"] == "1024"
