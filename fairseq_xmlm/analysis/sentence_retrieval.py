"""Sentence retrieval across two languages after a linear map (Conneau et al. 2020, section 5): per layer,
mean-pooled sentence vectors (`pooled_layers`), Procrustes learned on the first n parallel pairs, P@1 on the rest."""
import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, nearest_neighbours, procrustes
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import PairedEncoder, model_device


def pooled_layers(model, task, lang, sentences, max_tokens=8192):
    """Mean-pooled (specials excluded) vectors of every layer: list of (n, D) float tensors on the model's device,
    layer 0 first; each sentence as `task.sentence_input` makes it, under language `lang`."""
    device = model_device(model)
    layers = range(len(model.layers) + 1)
    encoder = PairedEncoder.for_task(model, task, layers, device, max_tokens)
    pooled = encoder.pooled([task.sentence_input(ids, lang) for ids in sentences], lang)
    return [pooled[layer].to(device) for layer in layers]


def sentence_retrieval(vectors_a, vectors_b, n_train):
    """Procrustes on the first n_train pairs (after iterative normalisation), P@1 on the rest, both ways."""
    if not 0 < n_train < len(vectors_a):
        raise XmlmError(f"--n-train {n_train} must leave held-out sentences (have {len(vectors_a)})")
    a, b = iterative_normalize(vectors_a), iterative_normalize(vectors_b)
    w = procrustes(a[:n_train], b[:n_train])
    held_a, held_b = a[n_train:], b[n_train:]
    truth = torch.arange(len(held_a), device=held_a.device)
    return {"a_to_b": (nearest_neighbours(held_a @ w, held_b)[:, 0] == truth).float().mean().item(),
            "b_to_a": (nearest_neighbours(held_b @ w.T, held_a)[:, 0] == truth).float().mean().item()}
