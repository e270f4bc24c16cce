"""One zero-shot benchmark (XNLI, NER or dependency parsing; Conneau et al. 2020, section 3.2) for one checkpoint.

The task files are read and encoded once (text becomes pieces exactly as the checkpoint's data-bin was made,
`PieceEncoder`); `Benchmark.run(config)` fine-tunes a fresh copy of the encoder on the English (`source`) training
file with language-specific parameters frozen, keeps the epoch with the best English dev score, and evaluates every
test file with its own language's embeddings / layers. Heads: XNLI `<s> premise </s> hypothesis </s>` -> first
token -> linear; NER first subword of each word -> linear, predictions repaired to valid BIO, span F1; parsing
biaffine arcs and labels, MST decoding, LAS / UAS. Metrics are percentages. Used by `xmlm-zeroshot`
(`zeroshot/run.py`) and the sweep (`zeroshot/sweep.py`).
"""
import copy
import random

import torch

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.io import log
from fairseq_xmlm.zeroshot.finetune import (DependencyParser, SentenceClassifier, WordExample, WordTagger, accuracy,
                                            freeze_language_specific, language_index, load_pretrained, predict,
                                            train_head)
from fairseq_xmlm.zeroshot.inputs import pair_input, word_input
from fairseq_xmlm.zeroshot.ner import span_f1
from fairseq_xmlm.zeroshot.parsing import attachment_scores
from fairseq_xmlm.zeroshot.readers import NLI_LABELS, READERS
from fairseq_xmlm.zeroshot.subwords import PieceEncoder

TASKS = ("xnli", "ner", "parse")
PRIMARY_METRIC = {"xnli": "accuracy", "ner": "f1", "parse": "las"}
# The paper's middle settings; XNLI: constant lr for up to 200 epochs of 20,000 examples (XLM's --epoch_size);
# NER / parsing: 10 % warm-up, 10 passes.
DEFAULT_CONFIG = {
    "xnli": {"batch_size": 8, "encoder_lr": 2.5e-6, "head_lr": 2.5e-5, "epochs": 200, "schedule": "constant",
             "epoch_size": 20000},
    "ner": {"batch_size": 16, "encoder_lr": 3e-5, "head_lr": 3e-5, "epochs": 10, "schedule": "warmup_linear"},
    "parse": {"batch_size": 16, "encoder_lr": 3e-5, "head_lr": 3e-5, "epochs": 10, "schedule": "warmup_linear"},
}


class Benchmark:
    """One task's data encoded once for one checkpoint; `run(config)` fine-tunes a fresh copy of the encoder."""

    def __init__(self, kind, checkpoint, train_file, dev_file, test_files, source="en", max_train=None,
                 data=None, seed=1, device=None):
        if kind not in TASKS:
            raise XmlmError(f"unknown task {kind!r} (expected one of {', '.join(TASKS)})")
        self.kind, self.source, self.checkpoint = kind, source, str(checkpoint)
        # the task files first: a broken one is refused before the checkpoint is loaded
        train = READERS[kind](train_file, source)
        dev = READERS[kind](dev_file, source)
        tests = {lang: READERS[kind](path, lang) for lang, path in test_files.items()}
        self.encoder, self.task = load_pretrained(checkpoint, data, device)
        self.dictionary = self.task.dictionary
        self.pieces = PieceEncoder(self.task.cfg.data, self.dictionary)
        self.max_tokens = self.encoder.max_positions()
        if max_train is not None and len(train) > max_train:
            train = random.Random(seed).sample(train, max_train)
        if kind == "xnli":
            self.labels = list(NLI_LABELS)
        else:
            self.labels = sorted({label for record in train for label in self._gold_labels(record)})
        self.train = self._rows(train, source, with_labels=True)
        if kind != "xnli":
            fitting = [row for row in self.train if len(row.positions) == len(row.labels)]
            if len(fitting) < len(self.train):
                log(f"{len(self.train) - len(fitting)} training sentences exceed {self.max_tokens} tokens: skipped")
            self.train = fitting
        self.dev = self._evaluation_set(dev, source)
        self.tests = {lang: self._evaluation_set(records, lang) for lang, records in tests.items()}
        log(f"{kind}: {len(self.train)} {source} training examples, {len(self.labels)} labels, "
            f"test languages {', '.join(self.tests) or 'none'}")

    def _gold_labels(self, record):
        return record.tags if self.kind == "ner" else record.rels

    def _evaluation_set(self, records, lang):
        language_index(self.task, lang)
        return records, self._rows(records, lang, with_labels=False)

    def _rows(self, records, lang, with_labels):
        if self.kind == "xnli":
            premises = self.pieces.encode_sentences([r.premise for r in records], lang)
            hypotheses = self.pieces.encode_sentences([r.hypothesis for r in records], lang)
            return [(pair_input(self.dictionary, p, h, self.max_tokens), NLI_LABELS.index(r.label))
                    for p, h, r in zip(premises, hypotheses, records)]
        word_ids = self.pieces.encode_words([word for record in records for word in record.words], lang)
        label_index = {label: index for index, label in enumerate(self.labels)}
        rows = []
        for record in records:
            tokens, positions = word_input(self.dictionary, record.words, word_ids, self.max_tokens)
            labels = heads = None
            if with_labels:
                labels = torch.tensor([label_index[label] for label in self._gold_labels(record)])
                heads = torch.tensor(record.heads) if self.kind == "parse" else None
            rows.append(WordExample(tokens, positions, labels, heads))
        return rows

    def score(self, records, predictions):
        """Metrics (percent) of predictions against gold records; words cut off for length count as 'O' /
        attached to the root with no relation."""
        if self.kind == "xnli":
            return {"accuracy": accuracy(predictions, [NLI_LABELS.index(r.label) for r in records]),
                    "examples": len(records)}
        if self.kind == "ner":
            predicted = [[self.labels[t] for t in tags] + ["O"] * (len(r.words) - len(tags))
                         for tags, r in zip(predictions, records)]
            scores = span_f1([r.tags for r in records], predicted)
            return {**scores, **{key: 100.0 * scores[key] for key in ("precision", "recall", "f1")}}
        heads = [list(h) + [0] * (len(r.words) - len(h)) for (h, _), r in zip(predictions, records)]
        rels = [[self.labels[x] for x in labels] + ["_"] * (len(r.words) - len(labels))
                for (_, labels), r in zip(predictions, records)]
        return attachment_scores([r.heads for r in records], [r.rels for r in records], heads, rels)

    def build_head(self, encoder, config):
        head_class = {"xnli": SentenceClassifier, "ner": WordTagger, "parse": DependencyParser}[self.kind]
        return head_class(encoder, len(self.labels), config.dropout)

    def finetune(self, config):
        """-> (head with a fine-tuned copy of the encoder, in its best English dev epoch's state; history)."""
        encoder = copy.deepcopy(self.encoder)
        freeze_language_specific(encoder)
        torch.manual_seed(config.seed)
        model = self.build_head(encoder, config)
        metric = PRIMARY_METRIC[self.kind]
        source_id = language_index(self.task, self.source)
        dev_records, dev_rows = self.dev
        history = train_head(model, self.train, dev_rows, source_id, config,
                             lambda m, rows: self.score(dev_records, predict(m, rows, source_id))[metric],
                             f"dev_{metric}")
        return model, history

    def run(self, config):
        """-> {"dev": {source: best primary score}, "test": {lang: metrics}, "history", "config", ...}."""
        model, history = self.finetune(config)
        metric = PRIMARY_METRIC[self.kind]
        result = {"task": self.kind, "checkpoint": self.checkpoint, "metric": metric,
                  "config": vars(config).copy(), "train_examples": len(self.train),
                  "dev": {self.source: max(epoch[f"dev_{metric}"] for epoch in history)}, "test": {},
                  "history": history}
        for lang, (records, rows) in self.tests.items():
            result["test"][lang] = self.score(records, predict(model, rows, language_index(self.task, lang)))
            log(f"{self.kind}: {lang} test {metric} {result['test'][lang][metric]:.2f}")
        return result


def parse_test_files(items):
    """['fr=path', ...] -> {'fr': 'path'}."""
    files = {}
    for item in items or []:
        lang, sep, path = item.partition("=")
        if not sep or not lang or not path:
            raise XmlmError(f"--test-file {item!r}: expected LANG=FILE, e.g. fr=xnli.test.tsv")
        files[lang] = path
    return files


def benchmark_from_args(kind, args):
    """The benchmark of a command line's --checkpoint, --train-file, --dev-file, --test-file, ... (xmlm-zeroshot
    and the sweep name them alike)."""
    return Benchmark(kind, args.checkpoint, args.train_file, args.dev_file, parse_test_files(args.test_file),
                     args.source, args.max_train, args.data, args.seed, args.device)
