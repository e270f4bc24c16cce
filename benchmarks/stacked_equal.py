"""Whether the stacked model gives each run's own logits on the GPU, where its attention runs `short_attention`'s
Triton kernels with several short sentences to a row (`stacked_encoder.attention_code`).

    python3 benchmarks/stacked_equal.py --ids 0,1 --out OUT/stacked_equal

The recipe's runs --ids (first seed, fp32, evaluation mode) on every batch of epoch 1: the stacked logits at the
batch's target positions against each model's own forward pass (`PartiallySharedRoberta`, one sentence to a row).
Prints the largest difference for batches whose sentences share rows and for those whose do not, and exits 1 if
either is over --tolerance. The CPU tests check the same on the CPU's attention; CI has no GPU. Not a test.
"""
import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ids", default="0,1", help="run IDs of examples/dufter/run.py (tables.RUNS)")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--data", default=str(HERE.parent / "data-bin" / "fake_english"))
    parser.add_argument("--knn-table", default=str(HERE.parent / "results" / "dufter" / "knn_table.pt"))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("stacked_equal: needs a GPU")
    sys.path.insert(0, str(HERE))
    import pack_speed
    from fairseq_xmlm import packed_training
    from fairseq_xmlm.stacked_encoder import StackedEncoder, sentences_per_row

    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products on both sides
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device("cuda")
    commands = pack_speed.recipe_commands(args.ids.split(","), 1, Path(args.data), out / "runs", 10 ** 6,
                                          args.knn_table)
    runs = [packed_training.parse_run(c).build() for c in commands]
    models = [run.model.to(device).eval() for run in runs]
    stacked = StackedEncoder(models, device)
    data = packed_training.GroupData(runs, device)
    schedules = [packed_training.epoch_batches(run, 1) for run in runs]
    generator = torch.Generator(device=device).manual_seed(0)
    largest = {}  # sentences to a row -> (largest difference, batches)
    with torch.no_grad():
        for at in range(len(schedules[0])):
            inputs, langs, positions, _, _ = data.batch([schedule[at] for schedule in schedules], generator)
            share = sentences_per_row(inputs.size(0) * inputs.size(1), inputs.size(2))
            logits = stacked.masked_logits(inputs, langs, positions)
            for slot, model in enumerate(models):
                features = model(inputs[slot], langs[slot], features_only=True)[0].flatten(0, 1)
                expected = model.output_logits(features[positions[slot]], langs[slot].new_zeros(positions.size(1)))
                difference = float((logits[slot] - expected).abs().max())
                worst, batches = largest.get(share, (0.0, 0))
                largest[share] = (max(worst, difference), batches + (slot == 0))
    rows = [{"sentences_per_row": share, "batches": batches, "max_logit_difference": worst}
            for share, (worst, batches) in sorted(largest.items())]
    failed = False
    for row in rows:
        ok = row["max_logit_difference"] <= args.tolerance
        failed |= not ok
        print(f"[stacked_equal] {row['batches']} batches with {row['sentences_per_row']} sentences to a row: logits "
              f"differ by {row['max_logit_difference']:.2e} at most: {'same' if ok else 'DIFFERENT'} "
              f"(tolerance {args.tolerance:g})", flush=True)
    (out / "stacked_equal.json").write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows,
                                                        "argv": sys.argv[1:]}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
