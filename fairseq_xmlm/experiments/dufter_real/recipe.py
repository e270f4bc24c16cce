"""The Table 3 recipe: the Bibles, one data-bin (one BPE per language, prefixed pieces), the knn-replace
neighbour tables, every (setting, seed) trained side by side and evaluated as soon as it has trained.

Restartable at every step: the data-bin and each neighbour table are written once, atomically; a run whose result
file exists is skipped; a run without one trains (fairseq-train resumes from checkpoint_last.pt, and returns at
once when its schedule is complete) and is then evaluated.

Layout: data_root/ (data-bin, knn_<vectors>.pt, knn.json), checkpoint_root/<setting>/seed<S>/ (+ train.log),
results_root/<setting>/seed<S>.json.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from fairseq_xmlm.data.bible_verses import DEFAULT_VERSION
from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.commands import python_module
from fairseq_xmlm.experiments.dufter_real.runs import KNN_PER_LANGUAGE, PRESETS, settings
from fairseq_xmlm.experiments.word_order.recipe import fetch_bibles
from fairseq_xmlm.io import log, write_json

PLUGIN_DIR = Path(__file__).resolve().parents[2]
KNN_VECTORS = ("fasttext", "verse_ids")


@dataclass(frozen=True)
class Run:
    setting: str
    seed: int

    def save_dir(self, checkpoint_root):
        return Path(checkpoint_root) / self.setting / f"seed{self.seed}"

    def result_path(self, results_root):
        return Path(results_root) / self.setting / f"seed{self.seed}.json"


def parse_langs(text):
    langs = [lang.strip() for lang in text.split(",") if lang.strip()]
    if len(langs) < 2 or len(set(langs)) != len(langs) or any(lang not in DEFAULT_VERSION for lang in langs):
        raise XmlmError(f"--langs takes two or more distinct languages of {', '.join(DEFAULT_VERSION)}, "
                        f"the fine-tuning one first (en,de,hi); got {text!r}")
    return langs


def prepare_data(corpus_dir, langs, preset, data_dir):
    """The Bibles (xmlm-fetch-bible's default versions: BBE, Schlachter, Hindi IRV, ...) and the data-bin."""
    from fairseq_xmlm.data.preparation import prepare_pair

    fetch_bibles(corpus_dir, {lang: DEFAULT_VERSION[lang] for lang in langs})
    if not (Path(data_dir) / "meta.json").is_file():
        log(f"dufter table 3: preparing {data_dir} (one BPE of {PRESETS[preset]['vocab']} pieces per language)")
        prepare_pair(corpus_dir, list(langs), "prefixed", PRESETS[preset]["vocab"], data_dir,
                     **PRESETS[preset]["books"])


def knn_table_path(data_dir, vectors):
    return Path(data_dir).parent / f"{Path(data_dir).name}.knn_{vectors}.pt"


def build_knn_tables(data_dir, langs, preset, seed=1, threads=None):
    """Both neighbour tables (mapped fastText, the paper's; verse-ID Dice) and DIR.knn.json: how often the fastText
    neighbours hold the verse-ID first neighbour, against chance (the mapping's quality on this corpus)."""
    from fairseq_xmlm.analysis.knn_builder import build_multilingual_table, neighbour_agreement, save_table

    options = PRESETS[preset]["knn"]
    threads = threads or max(1, min(8, torch.get_num_threads()))
    tables = {}
    for vectors in ("verse_ids", "fasttext"):
        path = knn_table_path(data_dir, vectors)
        if not path.is_file():
            save_table(build_multilingual_table(
                str(data_dir), langs, KNN_PER_LANGUAGE, vectors, options["dim"], options["epochs"], seed, threads,
                **options["mapping"]), path)
        tables[vectors] = torch.load(path, weights_only=True)
    report = Path(data_dir).parent / f"{Path(data_dir).name}.knn.json"
    if not report.is_file():
        agreement = neighbour_agreement(tables["fasttext"]["neighbours"], tables["verse_ids"]["neighbours"],
                                        KNN_PER_LANGUAGE)
        symbols = int((tables["verse_ids"]["neighbours"][:, 0] >= 0).sum())
        write_json(report, {"fasttext_hits_verse_id_first": agreement,
                            "chance": KNN_PER_LANGUAGE * len(langs) / symbols,  # k of a language's symbols
                            "fasttext": {k: options[k] for k in ("dim", "epochs")}, "mapping": options["mapping"]})
    return json.loads(report.read_text())


def train_command(run, langs, preset, data_dir, checkpoint_root, knn_vectors, extra=()):
    """fairseq-train's argv for one run (fp16 with fp32 master weights in xmlm_adamw on a GPU)."""
    setting = settings(langs)[run.setting]
    device = ["--fp16", "--memory-efficient-fp16"] if has_gpu() else ["--cpu"]
    knn = ["--knn-table", str(knn_table_path(data_dir, knn_vectors))] if setting.knn else []
    save_dir = run.save_dir(checkpoint_root)
    return [
        *python_module("fairseq_cli.train"), str(data_dir), "--user-dir", str(PLUGIN_DIR),
        "--task", "bilingual_mlm", "--langs", ",".join(langs), "--arch", "xmlm_bert_base",
        "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw", "--adam-betas", "(0.9,0.98)",
        "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr-scheduler", "inverse_sqrt",
        "--valid-subset", ",".join(f"valid_{lang}" for lang in langs), "--save-dir", str(save_dir),
        "--log-file", str(save_dir / "train.log"), "--keep-interval-updates", "1", "--no-epoch-checkpoints",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "100", "--seed", str(run.seed),
        *device, *PRESETS[preset]["train"], *setting.train_args, *knn, *extra,
    ]


def evaluate_command(run, checkpoint_root, results_root, preset):
    return [*python_module("fairseq_xmlm.experiments.dufter_real"), "evaluate",
            "--checkpoint", str(run.save_dir(checkpoint_root) / "checkpoint_last.pt"),
            "--out", str(run.result_path(results_root)), "--setting", run.setting, "--seed", str(run.seed),
            "--genre-options", json.dumps({**PRESETS[preset]["genre"], "seed": run.seed})]


def runs_to_do(names, seeds, results_root):
    """Every (setting, seed) without a result file, the settings of one seed before the next seed's."""
    return [Run(name, seed) for seed in seeds for name in names
            if not Run(name, seed).result_path(results_root).is_file()]


def train_and_evaluate(runs, langs, preset, data_dir, checkpoint_root, results_root, slots, knn_vectors,
                       train_extra=()):
    """Train the runs side by side (at most `slots` processes), each one's evaluation starting when it ends."""
    from fairseq_xmlm.packed.processes import Job, run_jobs, several_gpus

    jobs = []
    for run in runs:
        run.save_dir(checkpoint_root).mkdir(parents=True, exist_ok=True)
        jobs.append(Job(train_command(run, langs, preset, data_dir, checkpoint_root, knn_vectors, train_extra),
                        then=[evaluate_command(run, checkpoint_root, results_root, preset)]))
    log_dir = Path(results_root) / "logs"
    log(f"dufter table 3: training {len(runs)} run(s), {slots} at a time; logs in {log_dir}")
    return run_jobs(jobs, slots, log_dir, devices=several_gpus()) if jobs else []  # each run on one GPU
