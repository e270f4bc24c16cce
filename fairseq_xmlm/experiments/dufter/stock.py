"""Dufter & Schuetze's corpus for stock fairseq: English and Fake-English as plain text with one doubled dictionary,
so that fairseq's own `masked_lm` task trains on what `fake_english` trains on.

    python -m fairseq_xmlm.experiments.dufter export-stock [--data data-bin/fake_english] --out DIR

DIR/train.txt holds every training sentence in English, then every one in Fake-English (each piece `w` as its twin
`::w`), one a line; DIR/valid.txt the dev set likewise; DIR/dict.txt the doubled dictionary (`vocabulary.
doubled_dictionary`: the English pieces, then their twins). Then, with stock fairseq only:

    fairseq-preprocess --only-source --srcdict DIR/dict.txt --trainpref DIR/train.txt --validpref DIR/valid.txt \\
        --destdir DIR/bin --workers 2
    fairseq-train DIR/bin --task masked_lm --sample-break-mode eos --tokens-per-sample 128 --arch roberta \\
        --encoder-layers 12 --encoder-embed-dim 64 --encoder-ffn-embed-dim 256 --encoder-attention-heads 1 \\
        --max-positions 128 --criterion masked_lm --optimizer adam --adam-eps 1e-6 --weight-decay 0.01 --lr 2e-3 \\
        --lr-scheduler polynomial_decay --warmup-updates 50 --total-num-update 13700 --max-epoch 100 \\
        --batch-size 128 --num-workers 2

With --num-workers > 0 fairseq 0.12's masked_lm gives every sentence the same mask in every epoch: its
MaskTokensDataset draws from (seed, epoch, index), and the data-loader workers, kept across epochs, never see
`set_epoch`. `fake_english` keeps its epoch in shared memory (`data.mlm_dataset`), so its masks change each epoch
with any number of workers (tests/test_resume.py).
"""
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError
from fairseq_xmlm.io import log, replace_atomically, write_lines
from fairseq_xmlm.vocabulary import TWIN_PREFIX, doubled_dictionary, load_data_dictionary, load_split_sentences

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "data-bin" / "fake_english"


def bilingual_lines(english, sentences):
    """Piece-id sentences -> their English lines, then the same lines in Fake-English (every piece as its twin)."""
    lines = [english.string(ids) for ids in sentences]
    return lines + [" ".join(TWIN_PREFIX + piece for piece in line.split()) for line in lines]


def export_stock(data, out):
    """Write out/train.txt, valid.txt and dict.txt (see the module's text); returns the number of training lines."""
    data, out = Path(data), Path(out)
    english = load_data_dictionary(data)
    counts = {}
    for split in ("train", "valid"):
        lines = bilingual_lines(english, load_split_sentences(data, split, "en", english))
        if not lines:
            raise XmlmError(f"{data}: the {split} split is empty")
        write_lines(out / f"{split}.txt", lines)
        counts[split] = len(lines)
    doubled = doubled_dictionary(english)
    replace_atomically(out / "dict.txt", doubled.save)
    log(f"export-stock: {counts['train']} training and {counts['valid']} dev lines, {len(doubled)} symbols, in {out}")
    return counts["train"]


def main(argv=None):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter export-stock",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA), help="the fake-english data-bin (xmlm-prepare)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    export_stock(args.data, args.out)
