"""Controlled experiments: which differences between our training and the paper's (github pdufter/minimult) move
μ. Each cause trains the run IDs it matters for in one setting that differs from the 2026-11-28 baseline (or from
the setting it names as `before`) in that cause alone, and sets μ and its parts beside that setting's same runs.

    python -m fairseq_xmlm.experiments.dufter causes [--preset small|all|tiny|code] [--seeds N] [--causes a,b]
        [--data DIR] [--bible-dir DIR] [--results DIR] [--dry-run|--report]

Each setting's runs live in RESULTS/causes/SETTING/runs/ID/seedS/ (a run with its eval.json is skipped, so the
command resumes where it stopped); on a GPU they train packed, all settings of one precision in one sweep
(`packed.processes.train_side_by_side`). Then RESULTS/causes.json, causes.md and causes.png: per cause and run ID,
μ and its parts before (the baseline, or the cause's `before`) and after (the cause's setting), means over the seeds
present, and how many of those seeds stalled (`stalled`).
"""
import os
from dataclasses import dataclass, replace
from pathlib import Path

from fairseq_xmlm.errors import ArgumentParser, XmlmError
from fairseq_xmlm.experiments.commands import parse_choices
from fairseq_xmlm.experiments.dufter import figures, recipe, report, sweep
from fairseq_xmlm.experiments.dufter.runs import COLUMNS, LEGACY_SCHEDULE, PRESETS, RUNS, SCHEDULES, SEEDS
from fairseq_xmlm.io import log, write_atomic, write_json


@dataclass(frozen=True)
class Setting:
    """How the runs of a setting train: a schedule (runs.SCHEDULES) with some of its fields changed (`changes`:
    (field, value) pairs), so that which runs a field reaches is decided once, in `recipe.train_command`; and the
    packed models' precision on a GPU (fairseq-train on the CPU is fp32 always)."""

    schedule: str = LEGACY_SCHEDULE
    changes: tuple = ()
    precision: str = "bf16"

    def spec(self):
        return replace(SCHEDULES[self.schedule], **dict(self.changes))


BASELINE = "2026-11-28"
SETTINGS = {
    BASELINE: Setting(),
    "batch128": Setting("batch128"),
    "clauses": Setting("clauses"),
    "epochs200": Setting("epochs200"),
    "clip": Setting(changes=(("clip_norm", 1.0),)),
    "clip-fp32": Setting(changes=(("clip_norm", 1.0),), precision="fp32"),
    "batch128-clip": Setting("batch128-clip"),
    "paper-code": Setting("paper-code"),
    "paper-code-fp32": Setting("paper-code", precision="fp32"),
    "no-random-.9": Setting(changes=(("no_random_mask_share", 0.9),)),
    "attend-padding": Setting(changes=(("attend_padding", True),)),
    "paper-code-specials": Setting("paper-code", changes=(("shift_special_after_masking", True),)),
    "paper-code-attend-padding": Setting("paper-code", changes=(("attend_padding", True),)),
}


@dataclass(frozen=True)
class Cause:
    description: str
    setting: str  # trained so, against the same runs of `before`
    ids: tuple  # the runs it matters for
    indomain: bool = False  # instead: the setting's runs evaluated on the in-domain dev set, against KJV
    before: str = BASELINE  # the setting it is set against


MOST = ("0", "1", "2", "4", "7", "15")
CAUSES = {
    "batch128": Cause("matched updates: batches of 128 sentences (13,700 updates)", "batch128", MOST),
    "clauses": Cause("matched updates: clause units of >= 8 words, batches of 256 (13,700 updates)", "clauses", MOST),
    "epochs200": Cause("matched updates: 200 epochs of batches of 256 (13,800 updates)", "epochs200", MOST),
    "clip": Cause("--clip-norm 1.0 (packed, bf16), as the paper's code", "clip", MOST),
    "clip-fp32": Cause("--clip-norm 1.0 and fp32 (packed), as the paper's code", "clip-fp32", MOST),
    "batch128-clip": Cause("batches of 128 sentences (13,700 updates) and --clip-norm 1.0", "batch128-clip", MOST),
    "paper-code": Cause("paper-code: batch128-clip and no-random as .9 MASK/.1 keep, as the paper's code",
                        "paper-code", ("4", "7")),
    "no-random-.9": Cause("no-random as .9 MASK/.1 keep (the paper's code) for .8/.2 (its text)", "no-random-.9",
                          ("4", "7")),
    "attend-padding": Cause("random mixed batches attending to their padding (the paper's code)", "attend-padding",
                            ("0", "1", "2", "4", "7")),
    # lang-pos stalled in 2 of 3 seeds in bf16 under paper-code (its 5-seed table); the paper's code trains in fp32.
    # lang-pos alone: packed fp32 trained the clip-fp32 cause's 10 runs of 6,900 updates in 1,055 s on an H200, so
    # 5 seeds of 13,700 take about as long
    "fp32": Cause("fp32 (packed) for bf16 under paper-code, as the paper's code", "paper-code-fp32",
                  ("1",), before="paper-code"),
    # the paper's code shifts the specials after masking, by each row's content: English rows that drew a random
    # Fake-English word get Fake-English specials (19 % of the BBE's English rows in an epoch; at the same .75 % of
    # tokens, about 11 % of rows of 15 pieces, the paper's shorter sentences). Only runs with shift-special and
    # random words differ (IDs 2 and 5; 7 and 8 draw none)
    "shift-special-code": Cause("shift-special after masking, by each row's content, as the paper's code",
                                "paper-code-specials", ("2", "5"), before="paper-code"),
    # under the 2026-11-28 schedule attending to padding kept lang-pos from stalling; under paper-code, clipped, the
    # lang-pos rows were still the furthest below the paper (the default, paper-code-padding-specials, took it)
    "attend-padding-code": Cause("paper-code with random mixed batches attending to their padding (the paper's "
                                 "code)", "paper-code-attend-padding", ("1", "5", "6"), before="paper-code"),
    "indomain-dev": Cause("dev set in-domain (BBE Old Testament) for KJV: batch128-clip's runs, evaluated twice",
                          "batch128-clip", MOST, indomain=True),
}

# which runs and seeds a preset trains, on which recipe preset (runs.PRESETS)
PRESETS_OF_CAUSES = {
    "small": {"recipe": "full", "ids": ("0", "1", "2", "4", "7"), "seeds": 2},  # BERT-small runs only
    "all": {"recipe": "full", "ids": MOST, "seeds": 2},
    "tiny": {"recipe": "tiny", "ids": ("4",), "seeds": 1},  # the plumbing, on the CPU in about a minute
    "code": {"recipe": "full", "ids": ("1", "2", "5", "6"), "seeds": 2},  # the -code causes' shift-special and lang-pos
}


def runs_of(results, setting):
    return Path(results) / "causes" / setting / "runs"


def sides(cause):
    """The settings whose runs a cause compares: before (its `before`, or its own for an evaluation) and after."""
    return (cause.setting, cause.setting) if cause.indomain else (cause.before, cause.setting)


def needed(causes, ids):
    """{setting: the run IDs it trains} for these causes, restricted to `ids`."""
    plan = {BASELINE: []}
    for name in causes:
        for setting in sides(CAUSES[name]):
            plan.setdefault(setting, [])
            plan[setting] += [run_id for run_id in CAUSES[name].ids if run_id in ids and run_id not in plan[setting]]
    return {setting: run_ids for setting, run_ids in plan.items() if run_ids}


def train_all(plan, seeds, data, results, preset, dry_run):
    """Train and evaluate every (setting, run ID, seed) not yet evaluated: packed on a GPU, else one fairseq-train
    after another."""
    packed = recipe.has_gpu()
    jobs = {}  # precision -> (training jobs, side jobs)
    for name, run_ids in plan.items():
        setting = SETTINGS[name]
        spec = setting.spec()
        setting_preset = recipe.scheduled(preset, spec)
        setting_data = recipe.schedule_data(data, spec, dry_run)
        runs_dir = runs_of(results, name)
        knn_table = runs_dir.parent / "knn_table.pt"  # none of these runs needs it
        if not packed:
            for run_id in run_ids:
                for seed in seeds:
                    recipe.run_one(run_id, seed, setting_data, runs_dir, setting_preset, knn_table, dry_run)
            continue
        pending = [(run_id, seed) for run_id in run_ids for seed in seeds
                   if not (runs_dir / run_id / f"seed{seed}" / "eval.json").exists()]
        training, side = sweep.planned_jobs(pending, setting_data, runs_dir, setting_preset, knn_table)
        both = jobs.setdefault(setting.precision, ([], []))
        both[0].extend(training)
        both[1].extend(side)
    if packed:
        train_packed(jobs, results, dry_run)


def train_packed(jobs, results, dry_run):
    from fairseq_xmlm.packed import processes

    slots = max(1, (os.cpu_count() or 2) // 2)
    for precision, (training, side) in jobs.items():
        for job in side + training:
            log("+ " + " ".join(job.argv))
        if dry_run:
            continue
        work = Path(results) / "causes" / "pack" / precision
        if side:  # evaluations of runs trained before
            processes.run_jobs(side, slots, work / "side")
        if training:
            processes.train_side_by_side(training, work, precision=precision, slots=slots, tf32=True)


def evaluate_indomain(causes, ids, seeds, data, bible, results, preset, dry_run):
    for name in causes:
        cause = CAUSES[name]
        pairs = [(run_id, seed) for run_id in cause.ids if run_id in ids for seed in seeds] if cause.indomain else []
        if pairs:
            recipe.evaluate_indomain(pairs, runs_of(results, cause.setting), recipe.indomain_data(data, dry_run, bible),
                                     preset, dry_run)


def means(results, stall_ppl):
    """{column: mean over the seeds, "n": seeds, "stalled": seeds with a training perplexity over stall_ppl} of one
    run's eval JSONs; None without any."""
    if not results:
        return None
    summary = report.aggregate(results, stall_threshold=stall_ppl)
    return {column: summary[column][0] for column in COLUMNS} | {"n": summary["n"], "stalled": len(summary["stalled"])}


def summarise(causes, ids, results):
    """{cause: {"description", "setting", "before" (the setting set against), "updates": {"before", "after"}, "runs":
    {ID: {"before", "after"}}}}: μ and its parts (COLUMNS) averaged over the seeds present, and the seeds that stalled
    (report.stall_ppl); None where a side has no result yet."""
    loaded = {path.parent.name: report.load_run_results(path)
              for path in sorted((Path(results) / "causes").glob("*/runs"))}
    indomain = {setting: report.load_run_results(runs_of(results, setting), "eval_indomain.json")
                for setting in {CAUSES[name].setting for name in causes if CAUSES[name].indomain}}
    # stalls against the median of every trained run under RESULTS/causes (report.stall_ppl)
    stall_ppl = report.stall_ppl([result for by_id in loaded.values() for result in report.trained_results(by_id)])
    summary = {}
    for name in causes:
        cause = CAUSES[name]
        before, after = sides(cause)
        after_results = indomain.get(after, {}) if cause.indomain else loaded.get(after, {})
        rows = {run_id: {"before": means(loaded.get(before, {}).get(run_id, []), stall_ppl),
                         "after": means(after_results.get(run_id, []), stall_ppl)}
                for run_id in cause.ids if run_id in ids}
        summary[name] = {"description": cause.description, "setting": cause.setting, "before": before,
                         "updates": {"before": report.trained_updates(runs_of(results, before)),
                                     "after": report.trained_updates(runs_of(results, after))}, "runs": rows}
    return summary


def _pair(column, before, after):
    def cell(row):
        if row is None:
            return "–"
        return f"{row[column]:.0f}" if column.startswith("ppl") else f"{row[column]:.2f}"

    return f"{cell(before)} → {cell(after)}"


def markdown(summary, preset, seeds):
    header = ("| cause | run | n | stalled | μ | L0 F1 | L0 ρ | L0 τ | L8 F1 | L8 ρ | L8 τ | ppl train "
              "| ppl dev |")
    lines = [f"# Causes: μ and its parts before (baseline {BASELINE}, unless named below) → after", "",
             f"Preset {preset}, seeds {', '.join(map(str, seeds))}; means over the seeds present (stalled ones "
             f"included); stalled: seeds whose training perplexity ended over {report.STALL_FACTOR:g}x the median "
             "of every trained run here.", "", header, "|" + "---|" * (header.count("|") - 1)]
    for name, cause in summary.items():
        for run_id, row in cause["runs"].items():
            n, stalled = ("/".join(str(side[key]) if side else "0" for side in (row["before"], row["after"]))
                          for key in ("n", "stalled"))
            lines.append(f"| {name} | {run_id} {RUNS[run_id].description} | {n} | {stalled} | "
                         + " | ".join(_pair(column, row["before"], row["after"]) for column in COLUMNS) + " |")
    lines += [""] + [f"- {name}: {cause['description']}; updates {cause['updates']['before']} → "
                     f"{cause['updates']['after']}" + (f"; before: {cause['before']}" if cause["before"] != BASELINE
                                                       else "") for name, cause in summary.items()]
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = ArgumentParser(prog="python -m fairseq_xmlm.experiments.dufter causes",
                            description=__doc__.split("\n")[0])
    parser.add_argument("--preset", choices=list(PRESETS_OF_CAUSES), default="small")
    parser.add_argument("--seeds", type=int, help="how many of the paper's seeds (default: the preset's)")
    parser.add_argument("--causes", help=f"comma-separated, of {', '.join(CAUSES)} (default: all)")
    parser.add_argument("--data", default=str(recipe.REPO / "data-bin" / "fake_english"))
    parser.add_argument("--bible-dir", default=str(recipe.BIBLE), help="BBE's en.txt, for the in-domain dev set")
    parser.add_argument("--results", default=str(recipe.REPO / "results" / "dufter"))
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument("--report", action="store_true",
                        help="train and evaluate nothing: write causes.json, causes.md and causes.png from the "
                             "results present (causes without any are left out)")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    causes = parse_choices(args.causes, CAUSES, "causes")
    choice = PRESETS_OF_CAUSES[args.preset]
    if args.seeds is not None and not 1 <= args.seeds <= len(SEEDS):
        raise XmlmError(f"--seeds must be 1 to {len(SEEDS)}, got {args.seeds}")
    seeds, ids, preset = SEEDS[:args.seeds or choice["seeds"]], choice["ids"], PRESETS[choice["recipe"]]
    data, results = Path(args.data), Path(args.results)
    if not args.report:
        recipe.ensure_data(data, args.dry_run)
        train_all(needed(causes, ids), seeds, data, results, preset, args.dry_run)
        evaluate_indomain(causes, ids, seeds, data, Path(args.bible_dir), results, preset, args.dry_run)
    if args.dry_run:
        return
    summary = summarise(causes, ids, results)
    if args.report:
        summary = {name: cause for name, cause in summary.items()
                   if any(row["after"] for row in cause["runs"].values())}
        if not summary:
            raise XmlmError(f"no cause has results under {results / 'causes'}")
    write_json(results / "causes.json", {"preset": args.preset, "seeds": list(seeds), "baseline": BASELINE,
                                         "columns": list(COLUMNS), "causes": summary})
    text = markdown(summary, args.preset, seeds)
    write_atomic(results / "causes.md", text)
    figures.plot_causes(summary, results / "causes.png")
    print(text)
