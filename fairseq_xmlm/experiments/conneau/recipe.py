"""The Table 1 recipe: prepare each pair's data kinds, train every (pair, row, seed) side by side, evaluate each run
as soon as it has trained. Restartable at every step:

- a data-bin is prepared once (xmlm-prepare writes it atomically; one exists when its meta.json does);
- a run whose result file exists is skipped; a run without one trains (fairseq-train resumes from
  checkpoint_last.pt, and returns at once when the schedule is complete) and is then evaluated.

Layout under the three roots: data_root/<l1>_<l2>_<kind>/, checkpoint_root/<pair>/<row>/seed<S>/ (+ train.log),
results_root/<pair>/<row>/seed<S>.json.
"""
import os
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from fairseq_xmlm.devices import has_gpu
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.commands import python_module
from fairseq_xmlm.experiments.conneau.runs import PRESETS, SETTINGS
from fairseq_xmlm.io import log

PLUGIN_DIR = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    """One trained model of the table: a language pair (English first), a row of SETTINGS, a seed."""
    pair: str
    row: str
    seed: int

    @property
    def langs(self):
        return tuple(self.pair.split("-"))

    def save_dir(self, checkpoint_root):
        return Path(checkpoint_root) / self.pair / self.row / f"seed{self.seed}"

    def result_path(self, results_root):
        return Path(results_root) / self.pair / self.row / f"seed{self.seed}.json"


def parse_pairs(text):
    """'en-fr,en-ru' -> ['en-fr', 'en-ru']: English and one other language each ('en,fr' alone is en-fr)."""
    if "-" not in text and text.count(",") == 1:
        text = text.replace(",", "-")
    pairs = [pair.strip() for pair in text.split(",") if pair.strip()]
    for pair in pairs:
        langs = pair.split("-")
        if len(langs) != 2 or langs[0] != "en" or langs[1] in ("", "en"):
            raise XmlmError(f"a pair is English and one other language, e.g. en-fr; got {pair!r}")
    if not pairs:
        raise XmlmError("no language pair given (e.g. --pairs en-fr,en-ru,en-zh)")
    return pairs


def data_dir(data_root, pair, kind):
    return Path(data_root) / f"{pair.replace('-', '_')}_{kind}"


def dictionary_path(dict_dir, pair):
    return Path(dict_dir) / f"{pair}.txt"


def fetch_inputs(pairs, corpus_dir, dict_dir, dictionaries=True):
    """The Bibles (xmlm-fetch-bible's default versions) and, with `dictionaries`, each pair's MUSE dictionary
    (FreeDict, or CC-CEDICT for en-zh; pairs whose source word occurs in the English Bible and target word in the
    other one), fetched only where missing: a machine without network runs on what is there."""
    from fairseq_xmlm.data import bible_verses
    from fairseq_xmlm.data.bilingual_dictionary import build_dictionary

    corpus_dir = Path(corpus_dir)
    langs = ["en", *(pair.split("-")[1] for pair in pairs)]
    missing = [lang for lang in langs if not (corpus_dir / f"{lang}.txt").is_file()]
    if missing or not (corpus_dir / "verses.tsv").is_file():
        log(f"conneau: fetching the Bibles of {', '.join(missing or langs)} into {corpus_dir}")
        bible_verses.fetch_bible(corpus_dir, {lang: bible_verses.DEFAULT_VERSION[lang] for lang in missing or langs})
    for pair in pairs if dictionaries else ():
        path = dictionary_path(dict_dir, pair)
        if not path.is_file():
            log(f"conneau: building the {pair} dictionary {path}")
            build_dictionary(pair, path, vocab=corpus_dir / "en.txt", tgt_vocab=corpus_dir / f"{pair[3:]}.txt")


def _prepare_one(job):
    from fairseq_xmlm.data.preparation import prepare_pair

    corpus_dir, langs, kind, vocab, out, codeswitch = job
    mode = "joint" if kind in ("joint", "codeswitch") else kind
    log(f"conneau: preparing {out} ({mode}, vocabulary {vocab})")
    prepare_pair(corpus_dir, list(langs), mode, vocab, out, codeswitch_dict=codeswitch)
    return str(out)


def prepare_data(runs, preset, corpus_dir, data_root, dict_dir, workers=None):
    """Every data kind the runs need, prepared in parallel processes (sentencepiece and Moses are CPU-bound)."""
    jobs = {}
    for run in runs:
        kind = SETTINGS[run.row].data
        out = data_dir(data_root, run.pair, kind)
        if (out / "meta.json").is_file() or out in jobs:
            continue
        codeswitch = None
        if kind == "codeswitch":
            codeswitch = dictionary_path(dict_dir, run.pair)
            if not codeswitch.is_file():
                raise XmlmError(f"the extra_anchors row of {run.pair} needs the dictionary {codeswitch} "
                                f"(xmlm-fetch-dict --pair {run.pair} --out {codeswitch})")
        vocab = PRESETS[preset]["vocab_joint" if kind in ("joint", "codeswitch") else "vocab_per_lang"]
        jobs[out] = (str(corpus_dir), run.langs, kind, vocab, out, codeswitch and str(codeswitch))
    if not jobs:
        return
    workers = workers or min(len(jobs), os.cpu_count() or 1)
    if workers == 1:
        for job in jobs.values():
            _prepare_one(job)
        return
    with ProcessPoolExecutor(workers) as pool:
        list(pool.map(_prepare_one, jobs.values()))


def train_command(run, preset, data_root, checkpoint_root, extra=()):
    """fairseq-train's argv for one run. On a GPU: fp16 with fp32 master weights kept by xmlm_adamw (one flat
    tensor), the criterion that never waits for the host; on a CPU the same optimizer in fp32."""
    setting = SETTINGS[run.row]
    device = ["--fp16", "--memory-efficient-fp16"] if has_gpu() else ["--cpu"]
    langs = run.langs
    return [
        *python_module("fairseq_cli.train"), str(data_dir(data_root, run.pair, setting.data)),
        "--user-dir", str(PLUGIN_DIR), "--task", "bilingual_mlm", "--langs", ",".join(langs),
        "--arch", "xmlm_conneau", "--criterion", "xmlm_masked_lm", "--optimizer", "xmlm_adamw",
        "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--lr-scheduler", "inverse_sqrt",
        "--valid-subset", ",".join(f"valid_{lang}" for lang in langs), "--save-dir",
        str(run.save_dir(checkpoint_root)), "--log-file", str(run.save_dir(checkpoint_root) / "train.log"),
        "--keep-interval-updates", "-1", "--no-epoch-checkpoints",
        "--num-workers", "0", "--log-format", "simple", "--log-interval", "100", "--seed", str(run.seed),
        *device, *PRESETS[preset]["train"], *setting.train_args, *extra,
    ]


def evaluate_command(run, checkpoint_root, results_root, dict_dir, options=()):
    return [*python_module("fairseq_xmlm.experiments.conneau"), "evaluate",
            "--checkpoint", str(run.save_dir(checkpoint_root) / "checkpoint_best.pt"),
            "--out", str(run.result_path(results_root)), "--row", run.row, "--seed", str(run.seed),
            "--dict", str(dictionary_path(dict_dir, run.pair)), *options]


def runs_to_do(pairs, rows, seeds, results_root):
    """Every (pair, row, seed) without a result file, rows of one seed before the next seed's."""
    return [Run(pair, row, seed) for seed in seeds for pair in pairs for row in rows
            if not Run(pair, row, seed).result_path(results_root).is_file()]


def train_and_evaluate(runs, preset, data_root, checkpoint_root, results_root, dict_dir, slots, log_dir,
                       train_extra=(), evaluate_options=()):
    """Train the runs side by side (at most `slots` processes), each one's evaluation starting when it ends."""
    from fairseq_xmlm.packed.processes import Job, run_jobs, several_gpus

    if not runs:
        return {}
    jobs = []
    for run in runs:
        run.save_dir(checkpoint_root).mkdir(parents=True, exist_ok=True)
        jobs.append(Job(train_command(run, preset, data_root, checkpoint_root, train_extra),
                        then=[evaluate_command(run, checkpoint_root, results_root, dict_dir, evaluate_options)]))
    log(f"conneau: training {len(runs)} run(s), {slots} at a time; logs in {log_dir}")
    return run_jobs(jobs, slots, log_dir, devices=several_gpus())  # each run on one GPU, spread over them
