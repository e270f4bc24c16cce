"""Table 3's settings, the presets that train them, and the paper's numbers.

The paper's Table 3 trains BERT-base on Wikipedia (1 GB per language, 140k updates of 256 sequences, 20k
language-specific pieces per language) and tests XNLI. On the Bible the model keeps BERT-base's shape (12 layers,
heads of 64 dimensions, FFN 4x) at half its width, the vocabularies are one BPE per language with a language prefix
on every piece (no symbol shared, as the paper's separate vocabularies), and the schedule fits the whole table
(4 settings x 3 seeds) into 45 minutes of one H200.
"""
from dataclasses import dataclass

LANGS = ("en", "de", "hi")  # the first is the language the genre classifier is fine-tuned on
SEEDS = (1, 42, 100)  # the paper's
KNN_PER_LANGUAGE = 5  # "one of the five nearest neighbors", in each other language


@dataclass(frozen=True)
class Setting:
    label: str
    train_args: tuple = ()
    knn: bool = False  # needs the neighbour table


def settings(langs=LANGS):
    """The four rows; inv-order reverses the second language (the paper's German)."""
    return {
        "0-base": Setting("original"),
        "3-base": Setting(f"inv-order[{langs[1]}]", ("--inv-order-langs", langs[1])),
        "8-base": Setting("lang-pos;shift-special;no-random", ("--lang-pos", "--shift-special", "--no-random")),
        "30-base": Setting("knn-replace", ("--knn-replace", str(KNN_PER_LANGUAGE * (len(langs) - 1))), knn=True),
    }


SETTING_IDS = tuple(settings())


def _model(layers, dim, heads, ffn, tokens):
    return ["--encoder-layers", str(layers), "--encoder-embed-dim", str(dim), "--encoder-attention-heads",
            str(heads), "--encoder-ffn-embed-dim", str(ffn), "--tokens-per-sample", str(tokens)]


def _schedule(batch, lr, warmup, updates, interval):
    # The gradient norm clipped at 1.0 (as Dufter's code): unclipped, 5 of the gpu preset's 12 runs diverged at the
    # peak learning rate (loss back up to 9.6-10.9 bits) and 3 of 4 with 12,000 updates; clipped, none of the 4
    # retried. --train-args "--clip-norm 0" trains unclipped.
    return ["--batch-size", str(batch), "--lr", str(lr), "--warmup-updates", str(warmup), "--max-update",
            str(updates), "--validate-interval-updates", str(interval), "--save-interval-updates", str(interval),
            "--clip-norm", "1.0"]


# tiny: a CPU test (a few books on each side of the genre benchmark, a few updates); gpu: the table on one H200,
# 12 runs side by side (12 x 384, 6 heads, FFN 1536; 6,000 updates of 32 streams of 256 pieces, about 16 passes
# over the ~3M training pieces; Adam + inverse square root to 5e-4 as the Conneau recipe's calibration chose).
# knn: the neighbour tables' fastText and mapping, as Table 4 measured mapped fastText on whole Bibles (50 dims,
# 5 epochs; self-learning on the 4000 most frequent pieces, at most 60 iterations): minutes on the CPU.
PRESETS = {
    "tiny": {"vocab": 300, "seeds": (1,), "train": [*_model(2, 16, 2, 32, 64), *_schedule(4, 1e-3, 2, 6, 3)],
             "books": {"train_books": "Micah,Zephaniah,Galatians,1 Thessalonians", "valid_books": "Joel,Titus",
                       "test_books": "Jonah,Habakkuk,Jude"},
             "genre": {"max_train": 60, "epochs": 1, "batch_size": 16},
             "knn": {"dim": 8, "epochs": 1, "mapping": {"init_vocab": 200, "vocab_cutoff": 300, "patience": 2,
                                                         "max_iterations": 5}}},
    "gpu": {"vocab": 6000, "seeds": SEEDS,
            "train": [*_model(12, 384, 6, 1536, 256), *_schedule(32, 5e-4, 1000, 6000, 1000)],
            "books": {}, "genre": {"max_train": 8000, "epochs": 3, "batch_size": 32},
            "knn": {"dim": 50, "epochs": 5, "mapping": {"init_vocab": 2000, "vocab_cutoff": 4000, "patience": 5,
                                                         "max_iterations": 60}}},
}

# The paper's Table 3: XNLI test accuracy (mean, std over 3 seeds) for ENG, DEU, HIN; majority baseline .33.
PAPER_TABLE3 = {
    "0-base": {"en": (0.75, 0.00), "de": (0.57, 0.02), "hi": (0.45, 0.01)},
    "3-base": {"en": (0.75, 0.00), "de": (0.41, 0.01), "hi": (0.46, 0.04)},
    "8-base": {"en": (0.74, 0.00), "de": (0.37, 0.02), "hi": (0.38, 0.02)},
    "30-base": {"en": (0.74, 0.01), "de": (0.61, 0.01), "hi": (0.54, 0.00)},
}
