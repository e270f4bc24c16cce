"""Stock fairseq's `masked_lm` against the plugin's `fake_english` on one corpus with one set of hyper-parameters.

    python -m fairseq_xmlm.experiments.dufter stock-compare [full|tiny] [--seed S] [--runs a,b] [--data DIR]
        [--results DIR]

fairseq 0.12's MaskTokensDataset draws each sentence's mask from (seed, epoch, index), and with --num-workers > 0
its data-loader workers, kept across epochs, never see `set_epoch`: every sentence has the same mask in every
epoch. Three runs show what that does to Dufter & Schütze's original model (run 0, schedule paper-code):

    stock-workers2         fairseq's masked_lm + roberta at Dufter's BERT-small sizes, --num-workers 2
    stock-workers0         the same with --num-workers 0 (the dataset of the main process sees set_epoch)
    fake_english-workers2  the plugin's run 0, --num-workers 2

The stock runs train on `export-stock`'s text (English, then every sentence again in Fake-English), binarized by
fairseq-preprocess with its doubled dictionary; their command is the plugin run's with the task, criterion, model
and data swapped (`stock_command`), so every other option is the same. Each run is scored by the same code: μ and
its parts at layers 0 and 8 on the dev set (a stock model through `evaluation.stock_roberta`), and fairseq's last
logged train and dev loss (bits per masked token). RESULTS/stock/<run>/ holds each run; RESULTS/stock/stock.json
and stock.md the comparison of the runs with a result. Runs with a result are skipped, so the command resumes;
--runs trains and scores some of them (stock-workers0, whose main process masks every batch, is the slowest).
"""
import json
from pathlib import Path

from fairseq_xmlm.devices import default_device, has_gpu
from fairseq_xmlm.errors import ArgumentParser
from fairseq_xmlm.experiments.commands import parse_choices, python_module, run_command
from fairseq_xmlm.experiments.dufter import recipe
from fairseq_xmlm.experiments.dufter.runs import PRESETS, SCHEDULES, SEEDS
from fairseq_xmlm.experiments.dufter.stock import export_stock
from fairseq_xmlm.io import log, write_atomic, write_json

RUNS = {  # name: (stock?, data-loader workers)
    "stock-workers2": (True, 2),
    "stock-workers0": (True, 0),
    "fake_english-workers2": (False, 2),
}
LAYERS = (0, 8)
# xmlm_bert_small's sizes as stock roberta options; one sentence per sample, at most 128 positions as fake_english.
# masked_lm cuts a sentence to --tokens-per-sample and then prepends <s>, so a sentence of more than 126 pieces is
# one position too long: fairseq-train skips it (BBE's training set has none; 2 of KJV's 10,000 dev sentences),
# where fake_english cuts it.
STOCK_MODEL = ["--arch", "roberta", "--encoder-layers", "12", "--encoder-embed-dim", "64",
               "--encoder-ffn-embed-dim", "256", "--encoder-attention-heads", "1", "--max-positions", "128",
               "--tokens-per-sample", "128", "--sample-break-mode", "eos", "--skip-invalid-size-inputs-valid-test"]
PLUGIN_ONLY = {"--user-dir": 1}  # option: how many values follow it
# run 0's multilinguality curve: validations in mid-epoch, which the stock runs would not have
CURVE_OPTIONS = {"--eval-multilinguality": 0, "--validate-interval-updates": 1}


# The schedule both sides train: paper-code (the paper's updates, clipping) without the code's attended padding,
# which stock masked_lm cannot do (it batches by length and always masks the padding)
SCHEDULE = "paper-code"


def preset_of(name):
    return recipe.scheduled(PRESETS[name], SCHEDULES[SCHEDULE])


def without(command, options):
    """`command` without each of `options` (option: how many values follow it)."""
    kept, k = [], 0
    while k < len(command):
        if command[k] in options:
            k += 1 + options[command[k]]
            continue
        kept.append(command[k])
        k += 1
    return kept


def plugin_command(data, run_dir, preset, seed, workers):
    """Run 0's fairseq-train command (recipe.train_command), validating at the end of each epoch only, logging to
    run_dir/train.log."""
    command = recipe.train_command("0", seed, data, run_dir / "checkpoints", preset, knn_table=None,
                                   train_args=["--num-workers", workers, "--log-file", run_dir / "train.log"])
    return without([str(part) for part in command], CURVE_OPTIONS)


def stock_command(plugin, data, stock_bin):
    """The plugin run's fairseq-train command for stock fairseq: its data-bin, task, criterion and model swapped for
    stock_bin, masked_lm, masked_lm and roberta (STOCK_MODEL); the plugin's own options (PLUGIN_ONLY) dropped;
    every other option kept as it is."""
    swapped = {"--task": 1, "--criterion": 1, "--arch": 1}
    command = [str(stock_bin) if part == str(data) else part for part in without(plugin, PLUGIN_ONLY | swapped)]
    at = command.index("fairseq_cli.train")
    command[at] = "fairseq_xmlm.experiments.dufter.stock_train"
    return command[:at + 2] + ["--task", "masked_lm", "--criterion", "masked_lm", *STOCK_MODEL] + command[at + 2:]


def prepare_stock_data(data, out, dry_run):
    """export-stock's text and its fairseq-preprocess'd data-bin in out/bin (kept once made)."""
    if (out / "bin" / "dict.txt").exists():
        return out / "bin"
    if not dry_run:
        export_stock(data, out / "text")
    run_command([*python_module("fairseq_cli.preprocess"), "--only-source", "--srcdict", out / "text" / "dict.txt",
                 "--trainpref", out / "text" / "train.txt", "--validpref", out / "text" / "valid.txt",
                 "--destdir", out / "bin", "--workers", "2"], dry_run)
    return out / "bin"


def train(commands, results, dry_run):
    """Train the runs without a result: side by side on a GPU, else one after another. fairseq-train resumes an
    interrupted run from its checkpoint_last.pt, and a finished one returns at once."""
    pending = {name: command for name, command in commands.items() if not (results / name / "result.json").exists()}
    if not dry_run:
        for name in pending:
            (results / name).mkdir(parents=True, exist_ok=True)
    if dry_run or not has_gpu():
        for command in pending.values():
            run_command(command, dry_run)
        return
    from fairseq_xmlm.packed.processes import Job, run_jobs, several_gpus

    for command in pending.values():
        log("+ " + " ".join(command))
    if pending:
        run_jobs([Job(command) for command in pending.values()], len(pending), results / "logs",
                 devices=several_gpus())


def last_logged(log_path, key):
    """The last value of `key` (e.g. "train_loss") in a fairseq json log (--log-format json), or None."""
    value = None
    for line in Path(log_path).read_text(encoding="utf-8", errors="replace").splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and key in record:
            value = float(record[key])
    return value


def score(name, run_dir, data, stock_bin, max_sentences, device):
    """μ and its parts (evaluation.scores.multilinguality_scores) of one trained run on the dev set."""
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.evaluation.scores import multilinguality_scores

    checkpoint = run_dir / "checkpoints" / "checkpoint_last.pt"
    if RUNS[name][0]:
        from fairseq_xmlm.evaluation.stock_roberta import StockRobertaEncoder, id_table
        from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask

        roberta, stock_task, _ = load_checkpoint(checkpoint, device, data=stock_bin)
        task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=str(data)))
        model = StockRobertaEncoder(roberta, id_table(task.dictionary, stock_task.source_dictionary)).to(device)
    else:
        model, task, _ = load_checkpoint(checkpoint, device, data=data)
    dev = task.load_split_sentences("valid")[:max_sentences]
    return multilinguality_scores(model, task, dev, LAYERS, device)


def markdown(rows, preset, seed, updates):
    lines = ["# Stock fairseq masked_lm against fake_english (Dufter & Schütze's run 0)", "",
             f"Preset {preset}, seed {seed}, {updates} updates; μ and its parts on the dev set; losses: fairseq's last "
             "logged train and dev loss (bits per masked token).", "",
             "| run | μ | L0 F1 | L0 ρ | L0 τ | L8 F1 | L8 ρ | L8 τ | train loss | dev loss |", "|---" * 10 + "|"]
    for name, row in rows.items():
        parts = [row["layers"][str(layer)][key] for layer in LAYERS for key in ("align_f1", "retrieval", "translation")]
        losses = [f"{row[key]:.2f}" if row[key] is not None else "-" for key in ("train_loss", "valid_loss")]
        lines.append(f"| {name} | {row['mu']:.2f} | " + " | ".join(f"{v:.2f}" for v in parts) + " | "
                     + " | ".join(losses) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter stock-compare",
                            description=__doc__.split("\n")[0])
    parser.add_argument("preset", nargs="?", choices=("full", "tiny"), default="full")
    parser.add_argument("--seed", type=int, default=SEEDS[0])
    parser.add_argument("--runs", help=f"comma-separated, of {', '.join(RUNS)} (default: all)")
    parser.add_argument("--data", default=str(recipe.REPO / "data-bin" / "fake_english"))
    parser.add_argument("--results", default=str(recipe.REPO / "results" / "dufter" / "stock"))
    parser.add_argument("--device", default=None, help="where the runs are scored (default: the GPU if any)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    names = parse_choices(args.runs, RUNS, "runs")
    data, results, preset = Path(args.data), Path(args.results), preset_of(args.preset)
    recipe.ensure_data(data, args.dry_run)
    stock_bin = prepare_stock_data(data, results / "corpus", args.dry_run)
    commands = {}
    for name in names:
        stock, workers = RUNS[name]
        plugin = plugin_command(data, results / name, preset, args.seed, workers)
        commands[name] = stock_command(plugin, data, stock_bin) if stock else plugin
    train(commands, results, args.dry_run)
    if args.dry_run:
        return
    device = args.device or default_device()
    rows = {}
    for name in RUNS:  # with the results of earlier calls
        if name not in commands and not (results / name / "result.json").exists():
            continue
        run_dir = results / name
        if not (run_dir / "result.json").exists():
            result = score(name, run_dir, data, stock_bin, preset["eval_sentences"], device)
            result |= {key: last_logged(run_dir / "train.log", key) for key in ("train_loss", "valid_loss")}
            write_json(run_dir / "result.json", {"run": name, "seed": args.seed, **result})
        rows[name] = json.loads((run_dir / "result.json").read_text())
    updates = preset.get("max_update") or recipe.updates_per_epoch(data, False, preset["batch_size"]) * preset["epochs"]
    write_json(results / "stock.json", {"preset": args.preset, "seed": args.seed, "updates": updates, "runs": rows})
    text = markdown(rows, args.preset, args.seed, updates)
    write_atomic(results / "stock.md", text)
    print(text)
