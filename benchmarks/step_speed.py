"""How fast is one training run of ours on one GPU, against stock fairseq RoBERTa (tokens/s, updates/s, MFU)?

    python3 benchmarks/step_speed.py --out DIR [--sections single,strategies,rows]

Every run is a real `python3 -m fairseq_cli.train` on the same card, one after another, with the same data and
batch; tokens/s is fairseq's own `wps` (averaged over the logged intervals after the first, which holds start-up
and compilation) and updates/s its `ups`. Sections:

- single:     Conneau config (8 layers, 768, 12 heads, 3072 FFN, 256 tokens, batch 96) and Dufter's BERT-small
              (12 layers, 64, 1 head, 256 FFN, 128 tokens, batch 256) on synthetic 32k-vocabulary data:
              stock `roberta` (--fp16, and fp32 for BERT-small) vs ours (--fp16 + xmlm_adamw; with its flat master
              weights, --memory-efficient-fp16, alone, with cuDNN's attention, with --compile and with its CUDA-graph
              mode; BENCH_VARIANTS picks, BENCH_BEFORE adds the runs of an earlier tree of this package).
              Prints the ratio to stock --fp16 and the model FLOPs utilisation (MFU).
- strategies: replacement-strategy cost vs plain masking: knn-replace (Fake-English, Bible, BERT-small) and
              within-language random words (Conneau config, Bible en-fr).
- rows:       Conneau's Sep Emb, Sep L1-3, Sep L1-6 and Sep Emb + L1-6 against Default (Conneau config, the
              synthetic data as two languages), each with its recipe options; prints each one's ratio to Default.

Several GPUs: `ddp_scaling.py`; Dufter's packed runs: `packed_speed.py`. Logs go to DIR/logs/<run>.log, the
figures to DIR/summary.json (rewritten after every run). Stopped by SIGTERM (`timeout`), the script stops its
fairseq-train run and everything that started, then exits.
"""
import argparse
import json
import os
import shutil

import torch

from _common import (BERT_SMALL, CONNEAU, FAKE_VOCAB, FAST, SYNTH_DIR, XMLM_TRAIN, Bench, before_variants,
                     dufter_args, entry_module, log, ours_args, single_variants, stock_args, updates_for,
                     write_synthetic)

def section_single(b, synth):
    """Stock in fp16 (and fp32 for BERT-small), then our variants (`single_variants`) named in BENCH_VARIANTS
    (default: all but bf16 and xmlm-train's). BENCH_BEFORE=DIR also runs the fairseq_xmlm package in DIR (e.g.
    `git archive` of an earlier commit) with BENCH_BEFORE_VARIANTS (default fp16_flat_master): a before/after pair on
    one machine. BENCH_MODELS=conneau (or bertsmall) runs one model only."""
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    known = single_variants()
    # xmlm-train runs one process with fairseq's own trainer: on one GPU its variant would time the same code again
    default = [name for name in known if name != "bf16" and not name.endswith(XMLM_TRAIN)]
    names = os.environ.get("BENCH_VARIANTS", ",".join(default)).split(",")
    before = before_variants()
    before_names = os.environ.get("BENCH_BEFORE_VARIANTS", "fp16_flat_master").split(",") if before else []
    unknown = sorted(set(names + before_names) - set(known))
    if unknown:
        raise SystemExit(f"step_speed: unknown variants {unknown}; BENCH_VARIANTS may hold {', '.join(known)}")
    runs = [(name, known[name]) for name in names]
    runs += [(f"before_{name}", before[f"before_{name}"]) for name in before_names]
    models = os.environ.get("BENCH_MODELS", "conneau,bertsmall").split(",")
    for prefix, model, stocks in (("conneau", CONNEAU, ["fp16"]), ("bertsmall", BERT_SMALL, ["fp32", "fp16"])):
        if prefix not in models:
            continue
        for precision in stocks:
            fp16 = ["--fp16"] if precision == "fp16" else []
            b.train(f"{prefix}_stock_{precision}", stock_args(synth, model) + fp16, u, 50, model)
        for name, extra in runs:
            b.train(f"{prefix}_ours_{name}", ours_args(synth, model) + extra, updates_for(extra, u), 50, model,
                    module=entry_module(name))
            for precision in stocks:
                b.ratio(f"{prefix}_ours_{name} / {prefix}_stock_{precision}", f"{prefix}_ours_{name}",
                        f"{prefix}_stock_{precision}")


def write_random_knn_table(data, path, k=10):
    """A neighbour table of the right vocabulary with random cross-language neighbours: costs what a real one
    costs (the masking path does not look at which neighbours they are)."""
    from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask
    from fairseq_xmlm.vocabulary import dictionary_fingerprint

    task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=data))
    v = task.english_size
    own = torch.randint(v, (v, k))
    neighbours = torch.cat([own + v, own])  # English rows point at Fake ids, Fake rows at English ids
    torch.save({"dict_size": len(task.dictionary), "dict_md5": dictionary_fingerprint(task.dictionary),
                "neighbours": neighbours}, path)


def section_strategies(b, fake_data, bible_data):
    u = int(os.environ.get("BENCH_UPDATES", "250"))
    knn = os.path.join("/tmp", "xmlm-bench-knn.pt")
    write_random_knn_table(fake_data, knn)
    b.train("dufter_plain", dufter_args(fake_data), u + 150, 50, BERT_SMALL | {"tokens": 30}, vocab=FAKE_VOCAB)
    b.train("dufter_knn", dufter_args(fake_data, extra=["--knn-replace", "10", "--knn-table", knn]), u + 150, 50,
            BERT_SMALL | {"tokens": 30}, vocab=FAKE_VOCAB)
    b.ratio("dufter_knn / dufter_plain", "dufter_knn", "dufter_plain")
    bible = ours_args(bible_data, CONNEAU, langs="en,fr") + FAST
    b.train("bible_conneau_cross", bible, u, 50, CONNEAU)
    b.train("bible_conneau_within", bible + ["--random-replace", "within"], u, 50, CONNEAU)
    b.ratio("bible_conneau_within / bible_conneau_cross", "bible_conneau_within", "bible_conneau_cross")

def write_synthetic_pair(root):
    """The synthetic data as two languages, en and a copy named fr, for the rows with language-specific parts."""
    write_synthetic(root)
    for split in ("train", "valid"):
        for suffix in (".bin", ".idx"):
            target = os.path.join(root, f"{split}.fr{suffix}")
            if not os.path.exists(target):
                shutil.copyfile(os.path.join(root, f"{split}.en{suffix}"), target)
    return root


def section_rows(b, synth):
    """Conneau's parameter-sharing rows against Default, each with its recipe options (conneau.runs.SETTINGS:
    --sep-emb, --sep-layers, within-language random words), on both languages' one-language streams, with our
    variant BENCH_ROWS_VARIANT (default fp16_flat_master_cudagraphs_cudnn); BENCH_ROWS picks rows (default all; Default
    always runs, as every ratio's denominator)."""
    from fairseq_xmlm.experiments.conneau.runs import SETTINGS

    u = int(os.environ.get("BENCH_UPDATES", "250"))
    name = os.environ.get("BENCH_ROWS_VARIANT", "fp16_flat_master_cudagraphs_cudnn")
    variant = single_variants()[name]
    rows = ("default", "sep_emb", "sep_l1_3", "sep_l1_6", "sep_emb_l1_6")
    wanted = os.environ.get("BENCH_ROWS", ",".join(rows)).split(",")
    if set(wanted) - set(rows):
        raise SystemExit(f"step_speed: unknown rows {sorted(set(wanted) - set(rows))}; BENCH_ROWS may hold {rows}")
    for row in (r for r in rows if r == "default" or r in wanted):
        argv = ours_args(synth, CONNEAU, langs="en,fr") + variant + list(SETTINGS[row].train_args)
        b.train(f"rows_{row}", argv, updates_for(argv, u), 50, CONNEAU, module=entry_module(name))
        if row != "default":
            b.ratio(f"rows_{row} / rows_default", f"rows_{row}", "rows_default")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--sections", default="single,strategies")
    parser.add_argument("--fake-data", default="data-bin/fake_english")
    parser.add_argument("--bible-data", default="data-bin/bible_en_fr")
    args = parser.parse_args()
    b = Bench(args.out)
    log(f"card {b.results['card']} x {b.results['gpus']}, torch {torch.__version__}")
    sections = args.sections.split(",")
    if "single" in sections:
        section_single(b, write_synthetic(SYNTH_DIR))
    if "strategies" in sections:
        section_strategies(b, args.fake_data, args.bible_data)
    if "rows" in sections:
        section_rows(b, write_synthetic_pair(SYNTH_DIR))
    print(json.dumps(b.results, indent=1))


if __name__ == "__main__":
    main()
