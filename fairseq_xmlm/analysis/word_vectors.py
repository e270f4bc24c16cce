"""Word translation across two languages after a linear map (Conneau et al. 2020, section 5): word vectors of a
model (its embedding rows, or its states per layer in context) or of fastText, Procrustes learned on a dictionary's
train pairs, CSLS P@1 on its test pairs (`word_translation`; per layer from contextual vectors:
`word_translation_by_layer`). Words are `vocabulary.sentence_words` (jieba's for Chinese); `word_states` reads the
contextual vectors of word occurrences, for this and for contextual word alignment."""
import collections
import os
import random
import tempfile

import torch

from fairseq_xmlm.analysis.alignment import iterative_normalize, procrustes, translation_accuracy
from fairseq_xmlm.analysis.fasttext import train_fasttext
from fairseq_xmlm.data.muse import load_muse_dictionary
from fairseq_xmlm.data.segment import SEGMENTED
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.evaluation.encode import EvalMode, length_batches, model_device, pad_batch
from fairseq_xmlm.io import log
from fairseq_xmlm.vocabulary import WORD_START, piece_text, sentence_words


def word_translation(vectors_a, vectors_b, train_pairs, test_pairs, label):
    """vectors_*: {word: 1-D tensor}. Procrustes on the train pairs both sides have, CSLS P@1 on the test ones."""
    words_a, words_b = sorted(vectors_a), sorted(vectors_b)
    row_a, row_b = {w: i for i, w in enumerate(words_a)}, {w: i for i, w in enumerate(words_b)}
    usable = lambda pairs: [(row_a[s], row_b[t]) for s, t in pairs if s in row_a and t in row_b]  # noqa: E731
    train, test = usable(train_pairs), usable(test_pairs)
    if not train or not test:
        raise XmlmError(f"{label}: no dictionary pair has both words in the vocabulary "
                        f"({len(train)} train, {len(test)} test pairs usable)")
    x = iterative_normalize(torch.stack([vectors_a[w] for w in words_a]))
    y = iterative_normalize(torch.stack([vectors_b[w] for w in words_b]))
    train = torch.tensor(train)
    w = procrustes(x[train[:, 0]], y[train[:, 1]])
    p1 = translation_accuracy(x @ w, y, test, method="csls", ks=(1,), csls_k=10)[1]
    return {"p1": p1, "train_pairs": len(train), "test_pairs": len(test)}


def input_position(task, lang, piece_position, n_pieces):
    """Where piece j of a sentence sits in `task.sentence_input` (after <s>; Fake-English may be reversed)."""
    return 1 + (n_pieces - 1 - piece_position if task.reverses(lang) else piece_position)


def model_words(task, lang, ids):
    """`sentence_words` of the part of a sentence the model reads (`sentence_input` keeps max_positions - 2)."""
    return sentence_words(task, lang, ids[: task.max_positions() - 2])


def word_states(model, task, lang, sentences, occurrences, n_slots, device=None, max_tokens=8192):
    """Contextual vectors of word occurrences, summed per slot: -> (sums (L+1, n_slots, D) float32, counts).

    occurrences: [(sentence index, piece positions (as `model_words` gives them), slot in [0, n_slots))]. An
    occurrence's vector at layer l is the mean of its pieces' states (Conneau et al. 2020, section 5.1.1); `sums`
    adds those of the occurrences given the same slot and `counts` (n_slots,) counts them. One scatter per batch.
    """
    device = torch.device(device) if device else model_device(model)
    by_sentence = collections.defaultdict(list)
    for sentence, positions, slot in occurrences:
        by_sentence[sentence].append((positions, slot))
    chosen = sorted(by_sentence)
    inputs = [task.sentence_input(sentences[k], lang) for k in chosen]
    counts = torch.zeros(n_slots).index_add_(0, torch.tensor([slot for *_, slot in occurrences], dtype=torch.long),
                                             torch.ones(len(occurrences)))
    sums = None
    with EvalMode(model, device):
        for batch in length_batches([len(x) for x in inputs], max_tokens):
            tokens = pad_batch([inputs[i] for i in batch], task.dictionary.pad()).to(device)
            states = model.encode_layers(tokens, torch.full((len(batch),), lang, dtype=torch.long, device=device))
            flat = torch.stack(states).float().flatten(1, 2)  # (L+1, B*T, D)
            rows, slots, weights = [], [], []
            for row, i in enumerate(batch):
                n_pieces = len(inputs[i]) - 2
                for positions, slot in by_sentence[chosen[i]]:
                    rows += [row * tokens.size(1) + input_position(task, lang, p, n_pieces) for p in positions]
                    slots += [slot] * len(positions)
                    weights += [1.0 / len(positions)] * len(positions)
            if sums is None:
                sums = flat.new_zeros(flat.size(0), n_slots, flat.size(2))
            pieces = flat.index_select(1, torch.tensor(rows, device=device))
            weights = torch.tensor(weights, device=device)[:, None]
            sums.index_add_(1, torch.tensor(slots, device=device), pieces * weights)
    return sums, counts


def contextual_word_vectors(model, task, lang, sentences, vocabulary, max_tokens=8192, device=None):
    """Per layer {word: mean over its occurrences of the mean of its pieces' vectors}, words of `vocabulary`
    (lowercase, as MUSE dictionaries are; a sentence's words are matched lowercased)."""
    slots, occurrences = {}, []
    for k, ids in enumerate(sentences):
        for word, positions in model_words(task, lang, ids):
            if word.lower() in vocabulary:
                occurrences.append((k, positions, slots.setdefault(word.lower(), len(slots))))
    if not slots:
        raise XmlmError(f"no dictionary word occurs in the {len(sentences)} sentences of language {lang}")
    sums, counts = word_states(model, task, lang, sentences, occurrences, len(slots), device, max_tokens)
    means = (sums / counts.to(sums.device)[:, None]).cpu()  # (L+1, W, D)
    return [dict(zip(slots, layer)) for layer in means]


def embedding_word_vectors(model, task, lang, vocabulary):
    """{word: embedding row} for the words of `vocabulary` that are one piece (`▁word` is a dictionary symbol; in
    a language without spaces, such as Chinese, a word rarely starts with `▁`: there the piece `word` counts too,
    the `▁word` form winning when both exist)."""
    tables = model.token_embeddings
    weight = tables[lang if len(tables) > 1 else 0].weight.detach().float().cpu()
    unspaced = task.langs[lang] in SEGMENTED
    vectors = {}
    for piece_id in sorted(range(task.dictionary.nspecial, len(task.dictionary)),
                           key=lambda i: piece_text(task, lang, i).startswith(WORD_START)):
        text = piece_text(task, lang, piece_id)
        word = text.removeprefix(WORD_START)
        whole = text.startswith(WORD_START) or unspaced
        if whole and word in vocabulary and piece_id not in task.special_ids:
            model_id = int(task.sentence_input(torch.tensor([piece_id]), lang)[1])  # Fake-English: shifted id
            vectors[word] = weight[model_id]
    return vectors


def fasttext_word_vectors(task, lang, sentences, vocabulary, dim, epochs, seed):
    """fastText skipgram vectors trained on the words of the same sentences, restricted to `vocabulary`."""
    with tempfile.TemporaryDirectory(prefix="xmlm-analyze-") as tmp:
        corpus = os.path.join(tmp, "words.txt")
        with open(corpus, "w", encoding="utf-8") as f:
            for ids in sentences:
                f.write(" ".join(word.lower() for word, _ in sentence_words(task, lang, ids)) + "\n")
        words, vectors = train_fasttext(corpus, dim, epochs, seed, threads=2)
    return {w: torch.from_numpy(v) for w, v in zip(words, vectors) if w in vocabulary}


def dictionary_pairs(dictionary):
    """A MUSE file (path) or a list of (src, tgt) pairs -> [(src, tgt)]."""
    if isinstance(dictionary, (str, os.PathLike)):
        return load_muse_dictionary(dictionary)
    return [tuple(pair[:2]) for pair in dictionary]


def split_dictionary(pairs, vectors_a, vectors_b, test_fraction=0.2, seed=1):
    """(train, test) pairs of the usable pairs (both words have vectors): a random `test_fraction` of their source
    words goes to test with all its translations (MUSE-style: no test source word in train)."""
    usable = [(s, t) for s, t in pairs if s in vectors_a and t in vectors_b]
    sources = sorted({s for s, _ in usable})
    if len(sources) < 2:
        raise XmlmError(f"only {len(sources)} dictionary source word(s) have vectors in both languages: "
                        f"cannot split train and test")
    test_words = set(random.Random(seed).sample(sources, max(1, round(test_fraction * len(sources)))))
    return [p for p in usable if p[0] not in test_words], [p for p in usable if p[0] in test_words]


def word_translation_by_layer(model, task, dictionary, test_pairs=None, split="train", langs=(0, 1),
                              max_sentences=10000, test_fraction=0.2, seed=1, device=None, max_tokens=8192):
    """{layer (str): word translation P@1} from contextual word vectors (`contextual_word_vectors` of the first
    `max_sentences` sentences of `split` in each language), Procrustes on the dictionary's train pairs, CSLS
    (k=10) on its test pairs (`word_translation`). `dictionary`: a MUSE file or pairs of (word of langs[0], word
    of langs[1]); without `test_pairs` it is split by `split_dictionary`. `device`: where the model is (default:
    its parameters' device)."""
    pairs = dictionary_pairs(dictionary)
    test_pairs = dictionary_pairs(test_pairs) if test_pairs is not None else []
    vectors = [contextual_word_vectors(model, task, lang, task.load_split_sentences(split, lang)[:max_sentences],
                                       {pair[side] for pair in pairs + test_pairs}, max_tokens, device)
               for side, lang in enumerate(langs)]
    train_pairs = pairs
    if not test_pairs:
        train_pairs, test_pairs = split_dictionary(pairs, vectors[0][0], vectors[1][0], test_fraction, seed)
    scores = {str(layer): word_translation(a, b, train_pairs, test_pairs, f"contextual layer {layer}")
              for layer, (a, b) in enumerate(zip(*vectors))}
    log(f"word translation: {scores['0']['train_pairs']} train / {scores['0']['test_pairs']} test pairs, P@1 by "
        f"layer {[round(score['p1'], 3) for score in scores.values()]}")
    return {layer: score["p1"] for layer, score in scores.items()}
