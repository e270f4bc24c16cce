"""What bounds the Dufter 5-seed sweep on one GPU: the model FLOPs of every trained run of Tables 1 and 2, counted
from the training data (each batch padded to its longest sentence: length-sorted batches, or under a schedule that
attends to padding the random mixed batches of the paper's code, which pad far more), and the time they take at the
GPU's peak. A measured sweep time (--measured-s) gives the fraction of peak it reached.

    python3 benchmarks/dufter_sweep_flops.py [--data data-bin/fake_english] [--schedule paper-code] [--seeds 5]
        [--measured-s 1645 --measured-schedule 2026-11-28] [--out OUT]

FLOPs per sequence of T positions (forward + backward = 3 x forward; `_common.train_flops_per_token`'s terms):
layers x (2 (4 d^2 + 2 d ffn) T + 4 T^2 d) + the LM head on the masked 15 %: 0.15 T 2 (d^2 + d V).
"""
import argparse
import json
import os

import numpy as np
from _common import BERT_BASE, BERT_SMALL, FAKE_VOCAB, PEAK_FLOPS

from fairseq_xmlm.experiments.dufter.runs import DEFAULT_SCHEDULE, RUNS, SCHEDULES, SEEDS, TABLE1_IDS, TABLE2_IDS
from fairseq_xmlm.vocabulary import load_data_dictionary, load_split_sentences

MATMUL_PEAK = 790e12  # bf16 products measured on an H200 (the device notes' figure), below the datasheet's
EPOCHS = 100
RANDOM_EPOCHS = 5  # random mixed batches differ every epoch: their padding is averaged over this many draws


def sequence_flops(lengths, layers, dim, ffn, vocab=FAKE_VOCAB, mask_prob=0.15, **_):
    """Training FLOPs of sequences padded to `lengths` positions (an array): the formula of the module's text."""
    lengths = np.asarray(lengths, dtype=np.float64)
    per_layer = 2 * (4 * dim * dim + 2 * dim * ffn) * lengths + 4 * lengths ** 2 * dim
    head = mask_prob * lengths * 2 * (dim * dim + dim * vocab)
    return 3 * (layers * per_layer + head)


def batch_longest(in_order, batch_size):
    """Positions each sequence takes when consecutive runs of `batch_size` of `in_order` form the batches: its
    batch's longest length."""
    padded = np.empty_like(in_order)
    for start in range(0, len(in_order), batch_size):
        padded[start:start + batch_size] = in_order[start:start + batch_size].max()
    return padded


def epoch_positions(lengths, batch_size):
    """(lengths, positions) of an epoch of length-sorted batches."""
    ordered = np.sort(np.asarray(lengths))
    return ordered, batch_longest(ordered, batch_size)


def random_epoch_positions(lengths, batch_size, generator):
    """(lengths, positions) of an epoch of random mixed batches (`tasks.fake_english.RandomMixedBatches`: consecutive
    slots of a random permutation of every item)."""
    shuffled = np.asarray(lengths)[generator.permutation(len(lengths))]
    return shuffled, batch_longest(shuffled, batch_size)


def trained_ids():
    return [run_id for run_id in dict.fromkeys(TABLE1_IDS + TABLE2_IDS) if not RUNS[run_id].untrained]


def padded_draws(lengths, batch_size, attend_padding):
    """The positions of each sequence in the epochs that count: one epoch of length-sorted batches, or
    RANDOM_EPOCHS epochs of random mixed batches when they attend to padding."""
    if not attend_padding:
        return [epoch_positions(lengths, batch_size)[1]]
    generator = np.random.default_rng(0)
    return [random_epoch_positions(lengths, batch_size, generator)[1] for _ in range(RANDOM_EPOCHS)]


def sweep_flops(lengths, schedule, seeds):
    """{"useful", "padded"} FLOPs of the sweep and the BERT-base runs' share of the padded ones. Under a schedule
    whose overparam runs accumulate micro-batches, theirs are padded to each micro-batch's longest sentence, as
    fairseq-train runs each micro-batch by itself (micro-batches of random mixed batches are random too)."""
    spec = SCHEDULES[schedule]
    real = np.sort(np.asarray(lengths))
    draws = padded_draws(lengths, spec.batch_size, spec.attend_padding)
    micro_draws = (padded_draws(lengths, spec.overparam_micro_batch, spec.attend_padding)
                   if spec.overparam_micro_batch else draws)
    total = {"useful": 0.0, "padded": 0.0, "bert_base": 0.0}
    for run_id in trained_ids():
        model = BERT_BASE if "xmlm_bert_base" in RUNS[run_id].flags else BERT_SMALL
        # no-parallel: each sentence in one language, twice the epochs: the same sequences in all
        epochs = EPOCHS * spec.epoch_factor * seeds
        useful = epochs * float(sequence_flops(real, **model).sum())
        run_draws = micro_draws if RUNS[run_id].overparam else draws
        executed = epochs * float(np.mean([sequence_flops(draw, **model).sum() for draw in run_draws]))
        total["useful"] += useful
        total["padded"] += executed
        if model is BERT_BASE:
            total["bert_base"] += executed
    return total


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="data-bin/fake_english")
    parser.add_argument("--schedule", default=DEFAULT_SCHEDULE, choices=list(SCHEDULES))
    parser.add_argument("--seeds", type=int, default=len(SEEDS))
    parser.add_argument("--measured-s", type=float, help="a sweep's measured time, start to tables (seconds)")
    parser.add_argument("--measured-schedule", default="2026-11-28", choices=list(SCHEDULES))
    parser.add_argument("--out", help="folder for dufter_sweep_flops.json")
    args = parser.parse_args(argv)
    if SCHEDULES[args.schedule].clauses or SCHEDULES[args.measured_schedule].clauses:
        parser.error("the clause schedule trains other data: give its data-bin with --data and a sentence schedule")
    english = load_data_dictionary(args.data)
    # both languages of every training sentence, each with <s> and </s>
    lengths = np.array([len(s) + 2 for s in load_split_sentences(args.data, "train", "en", english)] * 2)
    result = {"data": args.data, "sequences_per_epoch": int(len(lengths)), "seeds": args.seeds}
    for name in dict.fromkeys([args.schedule, args.measured_schedule]):
        flops = sweep_flops(lengths, name, args.seeds)
        entry = {key: value / 1e15 for key, value in flops.items()} | {
            "seconds_at_datasheet_peak": flops["padded"] / PEAK_FLOPS["H200"],
            "seconds_at_measured_matmul_peak": flops["padded"] / MATMUL_PEAK}
        if name == args.measured_schedule and args.measured_s:
            entry["measured_s"] = args.measured_s
            entry["fraction_of_datasheet_peak"] = flops["padded"] / (args.measured_s * PEAK_FLOPS["H200"])
        result[name] = entry
        print(f"{name}: {entry['padded']:.0f} PFLOP executed ({entry['useful']:.0f} without padding; BERT-base runs "
              f"{entry['bert_base']:.0f}): {entry['seconds_at_datasheet_peak']:.0f} s at the H200's datasheet peak, "
              f"{entry['seconds_at_measured_matmul_peak']:.0f} s at 790 TFLOP/s"
              + (f"; measured {args.measured_s:.0f} s = {entry['fraction_of_datasheet_peak']:.1%} of the datasheet "
                 "peak" if "measured_s" in entry else ""))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "dufter_sweep_flops.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
