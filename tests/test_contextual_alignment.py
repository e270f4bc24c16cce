"""Contextual word alignment (Conneau et al. 2020, section 5.1.2) and per-layer word translation: the metric on
synthetic cases with a known answer, then both per-layer functions on the tiny real en-fr checkpoint."""
import pytest
import torch

from fairseq_xmlm.analysis import contextual_alignment as ca
from fairseq_xmlm.analysis.word_vectors import word_translation_by_layer
from fairseq_xmlm.checkpoints import load_checkpoint
from fairseq_xmlm.errors import XmlmError

pytestmark = pytest.mark.usefixtures("one_thread")

# frequent Bible words of the en_fr_checkpoint fixture's books, one French translation each
EN_FR = [("god", "dieu"), ("lord", "seigneur"), ("israel", "israël"), ("father", "père"), ("son", "fils"),
         ("king", "roi"), ("people", "peuple"), ("man", "homme"), ("day", "jour"), ("house", "maison"),
         ("word", "parole"), ("earth", "terre"), ("heaven", "ciel"), ("water", "eau"), ("land", "pays"),
         ("children", "enfants"), ("priest", "sacrificateur"), ("brothers", "frères"), ("spirit", "esprit"),
         ("law", "loi"), ("city", "ville"), ("sin", "péché"), ("hand", "main"), ("name", "nom"), ("life", "vie"),
         ("faith", "foi"), ("heart", "cœur"), ("fire", "feu"), ("blood", "sang"), ("sons", "fils"),
         ("paul", "paul"), ("jerusalem", "jérusalem"), ("moses", "moïse"), ("job", "job"), ("jesus", "jésus")]


def test_dictionary_links_are_one_to_one():
    translations = {"the": {"le", "la"}, "dog": {"chien"}, "big": {"grand"}, "cat": {"chat"}}
    source = ["The", "big", "dog", "and", "the", "cat"]
    target = ["le", "grand", "chien", "et", "le", "chat", "grand"]
    # "the" x2 / "le" x2 are ambiguous, "big" has two partners "grand": only dog and cat are linked
    assert ca.dictionary_links(source, target, translations) == [(2, 2), (5, 5)]
    assert ca.dictionary_links(["dog"], ["chat"], translations) == []


def synthetic_verses(n_verses, words_per_verse, dim, seed):
    """Source word vectors of n_verses sentences and the sentence number of each row."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(words_per_verse // 2, words_per_verse + 1, (n_verses,), generator=generator)
    sentence = torch.repeat_interleave(torch.arange(n_verses), lengths)
    return torch.randn(len(sentence), dim, generator=generator), sentence, generator


def test_a_rotated_permutation_is_recovered_exactly():
    dim = 32
    source, sentence, generator = synthetic_verses(300, 12, dim, seed=0)
    rotation, _ = torch.linalg.qr(torch.randn(dim, dim, generator=generator))
    # the target verse holds the same words, rotated, in another order
    permutation = torch.cat([torch.nonzero(sentence == k).squeeze(1)[torch.randperm(int((sentence == k).sum()),
                                                                                        generator=generator)]
                             for k in range(300)])
    target = source[permutation] @ rotation
    inverse = torch.argsort(permutation)  # source row i is target row inverse[i]
    links = torch.stack([torch.arange(len(source)), inverse], dim=1)
    train = torch.randn(200, dim, generator=generator)
    for method in ("nn", "csls"):
        result = ca.alignment_accuracy(train, train @ rotation, source, target, sentence, sentence[permutation],
                                       links, method)
        assert result["accuracy"] == 1.0 and result["links"] == len(source)
        assert result["chance"] == pytest.approx(float((1.0 / torch.bincount(sentence)[sentence].float()).mean()))


def test_unrelated_vectors_score_near_chance():
    dim = 32
    source, sentence, generator = synthetic_verses(400, 12, dim, seed=1)
    target = torch.randn(source.shape, generator=generator)  # a "model" whose two languages share nothing
    links = torch.stack([torch.arange(len(source)), torch.arange(len(source))], dim=1)
    train_source, train_target = torch.randn(500, dim, generator=generator), torch.randn(500, dim,
                                                                                         generator=generator)
    result = ca.alignment_accuracy(train_source, train_target, source, target, sentence, sentence, links)
    assert 0.09 < result["chance"] < 0.15
    assert abs(result["accuracy"] - result["chance"]) < 0.03  # ~3700 links: 4 standard errors


def test_bad_input():
    with pytest.raises(XmlmError, match="unknown alignment method"):
        ca.alignment_accuracy(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                              [0], [0], [(0, 0)], method="cosine")
    with pytest.raises(XmlmError, match="needs linked words"):
        ca.alignment_accuracy(torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(1, 2), torch.zeros(1, 2),
                              [0], [0], [])


@pytest.fixture(scope="module")
def en_fr_model(en_fr_checkpoint):
    model, task, _ = load_checkpoint(en_fr_checkpoint)
    return model, task


def test_by_layer_on_a_real_checkpoint(en_fr_model):
    model, task = en_fr_model
    layers = [str(layer) for layer in range(len(model.layers) + 1)]
    # one language against itself: identical vectors, so every linked word finds itself
    same = ca.contextual_alignment_by_layer(model, task, [(w, w) for w, _ in EN_FR], langs=(0, 0))
    assert list(same) == layers and all(value == 1.0 for value in same.values())
    bilingual = ca.contextual_alignment_by_layer(model, task, EN_FR, method="csls")
    assert list(bilingual) == layers and all(0 <= value <= 1 for value in bilingual.values())
    with pytest.raises(XmlmError, match="no dictionary pair links a word"):
        ca.contextual_alignment_by_layer(model, task, [("zzz", "qqq")])

    same = word_translation_by_layer(model, task, [(w, w) for w, _ in EN_FR], langs=(0, 0), test_fraction=0.3)
    assert list(same) == layers and all(value == 1.0 for value in same.values())
    bilingual = word_translation_by_layer(model, task, EN_FR, test_fraction=0.3)
    assert list(bilingual) == layers and all(0 <= value <= 1 for value in bilingual.values())
