"""The numbers of one trained run of Table 3.

- genre: zero-shot Bible-genre accuracy (fine-tuned on the first language's verses of the genre training books,
  language-specific parameters frozen; `zeroshot.bible_genre.genre_zero_shot`) on the held-out books of every language,
  in-language for the first, beside the majority-class baseline;
- retrieval: per other language and layer (0 = embeddings), P@1 of finding a test verse's translation among all
  test verses of the other side by cosine of mean-pooled states, both directions averaged (first language against
  each other one);
- curve: dev perplexity per language at every validation, from fairseq-train's log (how the schedule was sized).
"""
import re
from pathlib import Path

import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log

VALID_LINE = re.compile(r"valid on 'valid_(\w+)' subset \|.*?\| ppl ([0-9.]+) \|.*?\| num_updates (\d+)")


def retrieval_by_layer(model, task, other, split="test"):
    """{layer (str): P@1} between language 0 and language `other` on the split's parallel verses."""
    from fairseq_xmlm.analysis.sentence_retrieval import pooled_layers
    from fairseq_xmlm.evaluation.multilinguality import precision_at_1

    first, second = (task.load_split_sentences(split, lang) for lang in (0, other))
    if len(first) != len(second) or not first:
        raise XmlmError(f"{split}: {len(first)} {task.langs[0]} and {len(second)} {task.langs[other]} items are "
                        "not parallel verses")
    pooled = zip(pooled_layers(model, task, 0, first), pooled_layers(model, task, other, second))
    return {str(layer): float(precision_at_1(a.float(), b.float())) for layer, (a, b) in enumerate(pooled)}


def validation_curve(train_log):
    """{lang: {updates (str): dev perplexity}} from fairseq-train's log (base 2 loss, as fairseq prints ppl)."""
    curve = {}
    if Path(train_log).is_file():
        for lang, ppl, updates in VALID_LINE.findall(Path(train_log).read_text(errors="replace")):
            curve.setdefault(lang, {})[updates] = float(ppl)
    return curve


def evaluate_run(checkpoint, genre_options, device=None):
    """{"langs", "genre": {"test", "majority", "dev"}, "retrieval": {lang: {layer: P@1}}, "curve"}."""
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.zeroshot.finetune import FinetuneConfig
    from fairseq_xmlm.zeroshot.bible_genre import GENRE_CONFIG, genre_zero_shot

    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise XmlmError(f"{checkpoint} does not exist: has the run trained?")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    model, task, _ = load_checkpoint(checkpoint, device)
    langs = list(task.langs)
    retrieval = {langs[other]: retrieval_by_layer(model, task, other) for other in range(1, len(langs))}
    log(f"dufter table 3: {checkpoint}: retrieval by layer {retrieval}")
    del model
    options = dict(genre_options)
    max_train = options.pop("max_train", None)
    # the paper's fine-tuning (3 epochs, batch 32, lr 2e-5) is GENRE_CONFIG's; the preset may shorten it
    genre = genre_zero_shot(str(checkpoint), None, langs[1:], device, FinetuneConfig(**{**GENRE_CONFIG, **options}),
                            max_train, source=langs[0])
    return {"checkpoint": str(checkpoint), "langs": langs, "genre": genre, "retrieval": retrieval,
            "curve": validation_curve(checkpoint.parent / "train.log")}
