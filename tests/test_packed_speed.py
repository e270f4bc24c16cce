"""benchmarks/packed_speed.py's rates and losses, on the CPU with a stand-in group: a step's batch already sums its
tokens over the stacked runs, so tokens/s counts each token once (it once counted them once per run)."""
import os
import sys
import time
from argparse import Namespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "benchmarks"))
import packed_speed  # noqa: E402


class TwoRunGroup:
    """PackedGroup's step interface: summed losses and target counts per run, then the batch, whose last field is
    its real tokens, summed over the runs."""

    def step(self, batches):
        time.sleep(0.01)
        return torch.tensor([2.0, 6.0]), torch.tensor([1, 2]), (sum(batches),)


def test_tokens_per_second_counts_each_token_once():
    schedules = [[10, 20], [30, 40]]  # run 0's and run 1's batch sizes, in tokens
    args = Namespace(warmup=1, steps=2, profile_steps=1, beside=[])
    result, _ = packed_speed.profile_group(TwoRunGroup(), schedules, args, torch.device("cpu"))
    assert result["stacked"] == 2
    # timed: batches 1 and 0 (after the warm-up's 0), 60 + 40 tokens in the time of 4 run-updates
    assert abs(result["tokens_per_s"] / result["run_updates_per_s"] - 100 / 4) < 0.5
    assert result["loss_first_step"] == result["loss_last_timed_step"] == 2.5  # the mean of 2 / 1 and 6 / 2


def test_steps_beside_commands_are_timed_while_they_run(tmp_path):
    """--beside: the commands start before the second timing of the steps and are waited for; the result says
    whether they ran all the way beside those steps, and how they ended."""
    marker = tmp_path / "ran"
    args = Namespace(warmup=1, steps=3, profile_steps=1, beside_after=0.0, beside=[f"sleep 2; touch {marker}; exit 3"])
    result, _ = packed_speed.profile_group(TwoRunGroup(), [[10, 20], [30, 40]], args, torch.device("cpu"))
    assert marker.exists()  # waited for
    assert result["beside_running_at_end"] == 1  # three 10 ms steps end well inside its 2 s
    assert result["beside_exit_codes"] == [3] and result["ms_per_step_beside"] > 0


def test_benchmarked_runs_train_the_recipes_default_schedule_unless_told(tmp_path):
    from _common import recipe_commands

    def batch(schedule):
        argv = recipe_commands(["0"], 1, tmp_path, tmp_path / "runs", 10, "", schedule=schedule)[0]
        return argv[argv.index("--batch-size") + 1], "--clip-norm" in argv and argv[argv.index("--clip-norm") + 1]

    assert batch(None) == ("128", "1.0")  # the sweep's default schedule
    assert batch("2026-11-28") == ("256", False)  # unclipped
    with pytest.raises(SystemExit, match="schedule 'clauses'"):
        batch("clauses")
