"""Zero-shot cross-lingual transfer on XNLI, NER and dependency parsing (Conneau et al. 2020, section 3.2).

    python -m fairseq_xmlm.zeroshot.run xnli --checkpoint CK.pt --train-file multinli.train.en.tsv \
        --dev-file xnli.dev.tsv --test-file fr=xnli.test.tsv --test-file de=xnli.test.tsv --out results/xnli.json
    python -m fairseq_xmlm.zeroshot.run ner   ... --train-file en/train --dev-file en/dev --test-file fr=fr/test
    python -m fairseq_xmlm.zeroshot.run parse ... --train-file en_ewt-ud-train.conllu ... --test-file fr=fr.conllu

The head is fine-tuned on the English (`--source`) training file with language-specific parameters frozen, the
epoch with the best English dev score is kept, and every test file is evaluated with its own language's
embeddings / layers. Text becomes pieces exactly as the checkpoint's data-bin was made (`PieceEncoder`).
Heads: XNLI `<s> premise </s> hypothesis </s>` -> first token -> linear; NER first subword of each word ->
linear, predictions repaired to valid BIO, span F1; parsing biaffine arcs and labels, MST decoding, LAS / UAS.
Metrics are percentages. XNLI files with a `language` column (the XNLI dev/test release) are filtered to the
file's language; WikiAnn words written `fr:Paris` lose their `<lang>:` prefix. Fine-tuning runs on the GPU when
there is one (`--device`). An epoch is `--epoch-size` training examples or one pass, whichever is smaller: XNLI's
200 epochs are the paper's (its XLM code's) epochs of 20,000 examples; NER and parsing epochs are passes.
"""
import argparse
import copy
import random

import torch

from fairseq_xmlm.errors import XmlmError, cli_errors
from fairseq_xmlm.io import log, write_json
from fairseq_xmlm.zeroshot.finetune import (SCHEDULES, DependencyParser, FinetuneConfig, SentenceClassifier,
                                            WordExample, WordTagger, accuracy, freeze_language_specific,
                                            default_device, language_index, load_pretrained, predict, train_head)
from fairseq_xmlm.zeroshot.ner import span_f1
from fairseq_xmlm.zeroshot.parsing import attachment_scores
from fairseq_xmlm.zeroshot.readers import NLI_LABELS, read_bio, read_conllu, read_xnli_tsv
from fairseq_xmlm.zeroshot.subwords import PieceEncoder, first_subword_index

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


def pair_input(dictionary, first, second, max_tokens):
    """`<s> first </s> second </s>` of at most max_tokens; the longer side is shortened first."""
    first, second = list(first), list(second)
    while len(first) + len(second) + 3 > max_tokens:
        longer = first if len(first) >= len(second) else second
        longer.pop()
    return torch.tensor([dictionary.bos(), *first, dictionary.eos(), *second, dictionary.eos()])


def word_input(dictionary, words, word_ids, max_tokens):
    """-> (tokens `<s> pieces </s>`, first-subword position of each word that fits); a long sentence is cut."""
    pieces, first = first_subword_index(words, word_ids.__getitem__)
    pieces = pieces[: max_tokens - 2]
    positions = [index + 1 for index in first if index < len(pieces)]
    return torch.tensor([dictionary.bos(), *pieces, dictionary.eos()]), torch.tensor(positions, dtype=torch.long)


def read_nli(path, lang):
    """XNLI rows of `lang`: a file with a language column is filtered, one without is taken whole."""
    examples = read_xnli_tsv(path)
    if any(example.language is not None for example in examples):
        examples = read_xnli_tsv(path, language=lang)
    return examples


def read_tagged(path, lang):
    """BIO sentences; WikiAnn's `<lang>:` word prefix is stripped when every word carries it."""
    sentences = read_bio(path)
    if all(word.startswith(f"{lang}:") for sentence in sentences for word in sentence.words):
        sentences = read_bio(path, token_prefix=f"{lang}:")
    return sentences


READERS = {"xnli": read_nli, "ner": read_tagged, "parse": lambda path, lang: read_conllu(path)}


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


def add_benchmark_arguments(parser):
    """The data arguments shared by this command and the sweep."""
    parser.add_argument("--checkpoint", required=True, help="pretraining checkpoint (.pt)")
    parser.add_argument("--train-file", required=True, help="English training file")
    parser.add_argument("--dev-file", required=True, help="English dev file (model selection)")
    parser.add_argument("--test-file", action="append", default=[], metavar="LANG=FILE",
                        help="a zero-shot test file and its language (repeatable)")
    parser.add_argument("--source", default="en", help="fine-tuning language")
    parser.add_argument("--data", default=None, help="pretraining data-bin (default: the checkpoint's own)")
    parser.add_argument("--max-train", type=int, default=None, help="fine-tune on a random sample of this many")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--device", default=default_device(), help="cuda or cpu (default: cuda when available)")


def benchmark_from_args(kind, args):
    return Benchmark(kind, args.checkpoint, args.train_file, args.dev_file, parse_test_files(args.test_file),
                     args.source, args.max_train, args.data, args.seed, args.device)


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_xmlm.zeroshot.run",
                                     description="Fine-tune on English, evaluate zero-shot (XNLI, NER, parsing).")
    parser.add_argument("task", choices=TASKS)
    add_benchmark_arguments(parser)
    parser.add_argument("--out", required=True, help="result JSON to write")
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--lr", type=float, help="encoder and head learning rate (NER / parsing)")
    parser.add_argument("--encoder-lr", type=float)
    parser.add_argument("--head-lr", type=float)
    parser.add_argument("--epochs", type=int, help="XNLI: 200 as in the paper; NER / parsing: 10 (after each, "
                        "the English dev set selects)")
    parser.add_argument("--epoch-size", type=int, help="training examples per epoch, at most one pass (XNLI: "
                        "20000, XLM's epoch as the paper ran it; NER / parsing: one pass)")
    parser.add_argument("--schedule", choices=SCHEDULES)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args(argv)
    settings = dict(DEFAULT_CONFIG[args.task])
    if args.lr is not None:
        settings.update(encoder_lr=args.lr, head_lr=args.lr)
    for name in ("batch_size", "encoder_lr", "head_lr", "epochs", "schedule", "epoch_size"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    config = FinetuneConfig(**settings, dropout=args.dropout, seed=args.seed)
    result = benchmark_from_args(args.task, args).run(config)
    write_json(args.out, result, indent=2)
    metric = result["metric"]
    print(f"{args.task} {metric}: {args.source} dev {result['dev'][args.source]:.2f}; " + ", ".join(
        f"{lang} test {scores[metric]:.2f}" for lang, scores in result["test"].items()))


if __name__ == "__main__":
    main()
