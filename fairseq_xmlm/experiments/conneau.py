"""Conneau et al. 2020, Table 1 on the Bible: one command per language pair prepares, trains and evaluates the rows.

    python -m fairseq_xmlm.experiments.conneau --pair en,fr --preset quick [--settings default,sep_emb,...]

Every row is a (data preparation, training flags) pair (`SETTINGS`). Data goes to data-bin/conneau/<pair>_<kind>,
checkpoints to checkpoints/conneau/<pair>/<setting>, per-row results to results/conneau/<pair>/<setting>.json.
Each step is skipped when its output exists, and fairseq-train resumes from checkpoint_last.pt, so a killed run is
restarted with the same command. The rows are evaluated on the held-out test verses (parallel in both languages):
sentence retrieval P@1 on mean-pooled states of every layer, English dev perplexity of the best checkpoint (which
selects it), and, with --genre, zero-shot Bible genre accuracy (`xmlm-genre`). Finally results/conneau/table1.md and
results/conneau/figure3.png are rebuilt from every result file present (all pairs).

The training text may be any verse-aligned pair of files (`--corpus-dir DIR` with DIR/<l1>.txt, DIR/<l2>.txt and
verses.tsv), which is how the Wiki-CC domain row is run on corpora from elsewhere.
"""
import argparse
import json
import logging
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from fairseq_xmlm.errors import XmlmError, cli_errors

# Rows of Table 1. data: joint (one BPE over both languages), separate (one per language, vocabularies united),
# prefixed (separate + language prefix: no shared symbol), codeswitch (joint on dictionary code-switched text).
# The parameter-sharing rows use separate BPE as in the paper (40k/40k) and draw random words within a language.
WITHIN = ("--random-replace", "within")


@dataclass(frozen=True)
class Setting:
    label: str
    data: str
    train_args: tuple = ()


SETTINGS = {
    "default": Setting("Default", "joint"),
    "no_anchors": Setting("No anchors", "prefixed"),
    "default_anchors": Setting("Default anchors", "separate"),
    "extra_anchors": Setting("Extra anchors", "codeswitch"),
    "sep_emb": Setting("Sep Emb", "separate", ("--sep-emb", *WITHIN)),
    "sep_l1_3": Setting("Sep L1-3", "separate", ("--sep-layers", "1-3", *WITHIN)),
    "sep_l1_6": Setting("Sep L1-6", "separate", ("--sep-layers", "1-6", *WITHIN)),
    "sep_emb_l1_3": Setting("Sep Emb + L1-3", "separate", ("--sep-emb", "--sep-layers", "1-3", *WITHIN)),
    "sep_emb_l1_6": Setting("Sep Emb + L1-6", "separate", ("--sep-emb", "--sep-layers", "1-6", *WITHIN)),
}

# quick: minutes per row on a CPU; paper: the paper's model and schedule (8 x 768, Adam, inverse sqrt, 30k warm-up,
# 96 streams of 256 per GPU), its 80k / 40k+40k BPE scaled down to the Bible's size.
PRESETS = {
    "quick": {"vocab_joint": 4000, "vocab_per_lang": 2000, "train": [
        "--encoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256", "--encoder-attention-heads", "2",
        "--tokens-per-sample", "128", "--batch-size", "32", "--lr", "5e-4", "--warmup-updates", "100",
        "--max-update", "400", "--validate-interval-updates", "100", "--save-interval-updates", "100"]},
    "paper": {"vocab_joint": 12000, "vocab_per_lang": 6000, "train": [
        "--batch-size", "96", "--lr", "1e-4", "--warmup-updates", "30000", "--max-update", "100000",
        "--validate-interval-updates", "2000", "--save-interval-updates", "2000"]},
}


def log(message):
    print(message, file=sys.stderr, flush=True)


def data_dir(root, langs, kind):
    return Path(root) / f"{'_'.join(langs)}_{kind}"


def prepare_data(kind, langs, corpus_dir, root, preset, codeswitch_dict):
    """data-bin for one data kind, prepared once (xmlm-prepare pair writes it atomically)."""
    from fairseq_xmlm.data.prepare import prepare_pair

    out = data_dir(root, langs, kind)
    if (out / "meta.json").is_file():
        return out
    mode = "joint" if kind in ("joint", "codeswitch") else kind
    vocab = PRESETS[preset]["vocab_joint" if mode == "joint" else "vocab_per_lang"]
    if kind == "codeswitch" and not codeswitch_dict:
        raise XmlmError("the extra_anchors row needs --codeswitch-dict (a MUSE dictionary L1->L2, e.g. from "
                        f"xmlm-fetch-dict --pair {'-'.join(langs)} --out data/dicts/{'-'.join(langs)}.txt)")
    log(f"conneau: preparing {out} ({mode}, vocabulary {vocab})")
    prepare_pair(corpus_dir, list(langs), mode, vocab, out,
                 codeswitch_dict=codeswitch_dict if kind == "codeswitch" else None)
    return out


def train_command(data, save_dir, langs, setting, preset, extra):
    device = [] if torch.cuda.is_available() else ["--cpu"]
    return [
        str(Path(sys.executable).parent / "fairseq-train"), str(data), "--user-dir",
        str(Path(__file__).resolve().parents[1]), "--task", "bilingual_mlm", "--langs", ",".join(langs),
        "--arch", "xmlm_conneau", "--criterion", "xmlm_masked_lm", "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
        "--lr-scheduler", "inverse_sqrt", "--valid-subset", ",".join(f"valid_{lang}" for lang in langs),
        "--save-dir", str(save_dir), "--no-epoch-checkpoints", "--num-workers", "0", "--log-format", "simple",
        "--log-interval", "50", "--seed", "1", *device, *PRESETS[preset]["train"], *setting.train_args, *extra,
    ]


def retrieval_by_layer(model, task, split="test"):
    """{layer: P@1} of finding a verse's translation among the split's verses by cosine of mean-pooled states
    (xmlm-eval-mult's retrieval rho, at every layer)."""
    from fairseq_xmlm.evaluation.multilinguality import parallel_retrieval, parallel_sentences

    layers = range(len(model.layers) + 1)
    retrieval = parallel_retrieval(model, task, *parallel_sentences(task, split), layers)
    return {str(layer): value for layer, value in retrieval.items()}


def evaluate_row(checkpoint, genre_langs=None, genre_args=()):
    """The result dict of one trained row."""
    from fairseq_xmlm.checkpoints import load_checkpoint, safe_torch_load

    best_loss = safe_torch_load(checkpoint, map_location="cpu", mmap=True)["extra_state"]["best"]
    model, task, _ = load_checkpoint(checkpoint, "cuda" if torch.cuda.is_available() else "cpu")
    retrieval = retrieval_by_layer(model, task)
    result = {"checkpoint": str(checkpoint), "langs": list(task.langs), "retrieval": retrieval,
              "retrieval_mean": sum(retrieval.values()) / len(retrieval),
              "en_dev_ppl": 2.0 ** best_loss,  # fairseq's masked_lm loss is in base 2
              "language_parameters": {str(k): len(v) for k, v in model.language_parameters().items()}}
    if genre_langs:
        out = Path(checkpoint).with_name("genre.md")
        subprocess.run(["xmlm-genre", "--checkpoints", str(checkpoint), "--langs", ",".join(genre_langs),
                        "--out", str(out), *genre_args], check=True)
        genre = json.loads(out.with_suffix(".json").read_text())[str(checkpoint)]
        result["genre"] = {"test": genre["test"], "majority": genre["majority"]}
    return result


def run_pair(langs, settings, preset, corpus_dir, data_root, checkpoint_root, results_root, codeswitch_dict=None,
             train_extra=(), genre=False, genre_args=()):
    """Prepare, train and evaluate the requested rows of one pair; returns {setting: result}."""
    from fairseq_xmlm.evaluation.tables import write_atomic

    pair = "_".join(langs)
    results = {}
    for name in settings:
        setting = SETTINGS[name]
        result_path = Path(results_root) / pair / f"{name}.json"
        if result_path.is_file():
            log(f"conneau: {pair} {name}: done ({result_path})")
            results[name] = json.loads(result_path.read_text())
            continue
        data = prepare_data(setting.data, langs, corpus_dir, data_root, preset, codeswitch_dict)
        save_dir = Path(checkpoint_root) / pair / name
        log(f"conneau: {pair} {name}: training into {save_dir}")
        train_log = save_dir / "train.log"
        save_dir.mkdir(parents=True, exist_ok=True)
        with open(train_log, "a") as handle:
            code = subprocess.run(train_command(data, save_dir, langs, setting, preset, train_extra),
                                  stdout=handle, stderr=subprocess.STDOUT).returncode
        if code != 0:
            last = train_log.read_text(errors="replace").strip().splitlines()[-1:]
            raise XmlmError(f"fairseq-train failed for {pair} {name} (see {train_log}): {''.join(last)}")
        log(f"conneau: {pair} {name}: evaluating")
        results[name] = {"setting": name, "label": setting.label, "pair": pair, "preset": preset,
                         **evaluate_row(save_dir / "checkpoint_best.pt", langs[1:] if genre else None, genre_args)}
        write_atomic(result_path, json.dumps(results[name], indent=1) + "\n")
    return results


def load_results(results_root):
    """{pair: {setting: result}} of every result file under results_root."""
    found = {}
    for path in sorted(Path(results_root).glob("*/*.json")):
        result = json.loads(path.read_text())
        if result.get("setting") in SETTINGS:
            found.setdefault(result["pair"], {})[result["setting"]] = result
    return found


def table1_markdown(found):
    """Rows = settings in Table 1 order; per pair: retrieval at layer 0 / middle / top, their mean with its
    difference to Default (the paper's Delta), English dev perplexity and, when evaluated, genre accuracy."""
    pairs = sorted(found)
    header = ["setting"]
    for pair in pairs:
        header += [f"{pair} rho L0/mid/top", f"{pair} rho mean (Δ)", f"{pair} en ppl", f"{pair} genre"]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, setting in SETTINGS.items():
        if not any(name in found[pair] for pair in pairs):
            continue
        cells = [setting.label]
        for pair in pairs:
            result = found[pair].get(name)
            if result is None:
                cells += ["-"] * 4
                continue
            by_layer = [result["retrieval"][str(k)] for k in range(len(result["retrieval"]))]
            default = found[pair].get("default")
            delta = f" ({result['retrieval_mean'] - default['retrieval_mean']:+.3f})" if default else ""
            genre = result.get("genre")
            cells += [f"{by_layer[0]:.3f} / {by_layer[len(by_layer) // 2]:.3f} / {by_layer[-1]:.3f}",
                      f"{result['retrieval_mean']:.3f}{delta}", f"{result['en_dev_ppl']:.1f}",
                      " ".join(f"{lang} {acc:.1f}" for lang, acc in genre["test"].items() if lang != "en")
                      if genre else "-"]
        rows.append("| " + " | ".join(cells) + " |")
    note = ("rho: sentence retrieval P@1 (cosine of mean-pooled states, both directions averaged) on the held-out "
            "test verses, per layer (0 = embeddings); en ppl: English dev perplexity of the selected checkpoint; "
            "genre: zero-shot Bible genre accuracy (%) after English fine-tuning (xmlm-genre).")
    return "\n".join(["# Table 1 (Conneau et al. 2020) on the Bible", "", note, "", *rows]) + "\n"


def plot_figure3(found, path):
    """Figure 3: mean retrieval per setting, one line per language pair."""
    import matplotlib

    matplotlib.use("Agg")
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's root logger would print font searches
    import matplotlib.pyplot as plt

    from fairseq_xmlm.evaluation.figures import _save

    names = [name for name in SETTINGS if any(name in by_setting for by_setting in found.values())]
    fig, axis = plt.subplots(figsize=(9, 4))
    for pair, by_setting in sorted(found.items()):
        shown = [k for k, name in enumerate(names) if name in by_setting]
        axis.plot(shown, [by_setting[names[k]]["retrieval_mean"] for k in shown], marker="o", label=pair)
    axis.set_xticks(range(len(names)), [SETTINGS[name].label for name in names], rotation=30, ha="right")
    axis.set_ylabel("retrieval P@1 (mean over layers)")
    axis.set_title("Bilingual MLM under different settings (cf. Conneau et al. 2020, Fig. 3)")
    axis.legend()
    return _save(fig, path)


def write_summary(results_root):
    from fairseq_xmlm.evaluation.tables import write_atomic

    found = load_results(results_root)
    if not found:
        raise XmlmError(f"no results under {results_root}")
    write_atomic(Path(results_root) / "table1.md", table1_markdown(found))
    plot_figure3(found, Path(results_root) / "figure3.png")
    log(f"conneau: wrote {results_root}/table1.md and figure3.png")


def parse_settings(text):
    names = list(SETTINGS) if text == "all" else [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in SETTINGS]
    if unknown or not names:
        raise XmlmError(f"unknown setting(s) {', '.join(unknown) or '(none)'}; choose from all, {', '.join(SETTINGS)}")
    return names


@cli_errors
def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m fairseq_xmlm.experiments.conneau",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--pair", required=True, help="two languages, English first, e.g. en,fr")
    parser.add_argument("--settings", default="all", help=f"comma-separated rows: all or {', '.join(SETTINGS)}")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument("--corpus-dir", default="data/bible", help="verse-aligned <lang>.txt + verses.tsv")
    parser.add_argument("--data-root", default="data-bin/conneau")
    parser.add_argument("--checkpoint-root", default="checkpoints/conneau")
    parser.add_argument("--results", default="results/conneau")
    parser.add_argument("--codeswitch-dict", help="MUSE dictionary L1->L2 for the extra_anchors row")
    parser.add_argument("--genre", action="store_true", help="also run the zero-shot genre benchmark (xmlm-genre)")
    parser.add_argument("--genre-args", default="", help="extra xmlm-genre options, e.g. '--max-train 2000'")
    parser.add_argument("--train-args", default="", help="extra fairseq-train options, e.g. '--max-update 50000'")
    args = parser.parse_args(argv)
    langs = [lang.strip() for lang in args.pair.split(",") if lang.strip()]
    if len(langs) != 2 or langs[0] == langs[1]:
        raise XmlmError(f"--pair needs two different languages, got {args.pair!r}")
    corpus = Path(args.corpus_dir)
    missing = [str(corpus / name) for name in (f"{langs[0]}.txt", f"{langs[1]}.txt", "verses.tsv")
               if not (corpus / name).is_file()]
    if missing:
        raise XmlmError(f"missing corpus file(s) {', '.join(missing)} (fetch with xmlm-fetch-bible)")
    run_pair(langs, parse_settings(args.settings), args.preset, corpus, args.data_root, args.checkpoint_root,
             args.results, args.codeswitch_dict, args.train_args.split(), args.genre, args.genre_args.split())
    write_summary(args.results)


if __name__ == "__main__":
    main()
