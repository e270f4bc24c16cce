"""xmlm-eval-mult end to end on tiny real checkpoints, the training-time hook's log, and bad input."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import TIMEOUT, fairseq_train, expect_cli_error
from fairseq_xmlm.evaluation import eval_mult
from fairseq_xmlm.experiments.dufter.figures import curves_over_seeds, plot_training_curves

ARGS = ["--max-sentences", "200", "--max-train-sentences", "200"]


@pytest.fixture(scope="module")
def evaluated(fake_english_checkpoint, fake_english_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "eval.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the CPU evaluation runs 2 single-threaded workers, then gives torch its 2 back
    try:
        result = eval_mult.run([str(fake_english_checkpoint), "--data", str(fake_english_data), "--json", str(out),
                                *ARGS])
        threads_after = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    return result, out, threads_after


def test_evaluation_gives_torch_its_threads_back(evaluated):
    assert evaluated[2] == 2


def test_json_schema_and_value_ranges(evaluated, fake_english_checkpoint):
    result, out, _ = evaluated
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(result))
    assert set(written) == {"checkpoint", "task", "products", "mu", "mu_parts", "layers", "ppl", "n_sentences",
                            "n_words", "padding"}
    assert written["checkpoint"] == str(fake_english_checkpoint) and written["task"] == "fake_english"
    assert written["products"] == "fp32" and written["padding"] == "masked"  # trained with it masked
    assert written["mu_parts"] == ["tau0", "rho0", "tau8", "rho8"]
    assert set(written["layers"]) == {"0", "8"}
    for scores in written["layers"].values():
        assert set(scores) == {"align_f1", "retrieval", "translation"}
        assert all(0.0 <= value <= 1.0 for value in scores.values())
    assert written["mu"] == pytest.approx(sum(
        s["retrieval"] + s["translation"] for s in written["layers"].values()) / 4)
    assert written["n_sentences"] == 200 and written["n_words"] > 1000
    assert set(written["ppl"]) == {"train", "valid"} and all(p > 1 for p in written["ppl"].values())


def test_tf32_allows_tf32_products_and_leaves_a_cpu_evaluation_as_it_is(evaluated, fake_english_checkpoint,
                                                                       fake_english_data):
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        result = eval_mult.run([str(fake_english_checkpoint), "--data", str(fake_english_data), "--device", "cpu",
                                "--tf32", *ARGS])
        assert torch.backends.cuda.matmul.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    assert result == {**evaluated[0], "checkpoint": result["checkpoint"]}


def test_padding_attended_changes_the_states_and_masked_is_the_trained_default(evaluated, fake_english_checkpoint,
                                                                             fake_english_data):
    """--padding attended: the dev states see their batch's padding (batches of 256 in corpus order), so the
    sentence vectors, and with them some score, change; perplexity masks its batches either way. --padding masked
    on a model trained so gives the default's result."""
    common = [str(fake_english_checkpoint), "--data", str(fake_english_data), "--device", "cpu", *ARGS]
    attended = eval_mult.run(common + ["--padding", "attended"])
    masked = eval_mult.run(common + ["--padding", "masked"])
    assert attended["padding"] == "attended" and masked == {**evaluated[0], "checkpoint": masked["checkpoint"]}
    assert attended["ppl"] == masked["ppl"]
    assert attended["layers"] != masked["layers"]


def test_an_untrained_model_is_not_multilingual(evaluated):
    """Ten updates are as good as none: tau at chance, while shared positions align (paper: ID 18). rho stays a
    little above chance (1/200) on 200 sentences: the pooled position embeddings tell sentence lengths apart."""
    layers = evaluated[0]["layers"]
    for scores in layers.values():
        assert scores["retrieval"] < 0.1 and scores["translation"] < 0.01
    assert layers["0"]["align_f1"] > 0.8
    assert evaluated[0]["ppl"]["valid"] > 100  # close to the vocabulary size, far from a trained model's


def test_console_script_prints_one_summary_line(fake_english_checkpoint, fake_english_data):
    command = [str(Path(sys.executable).parent / "xmlm-eval-mult"), str(fake_english_checkpoint), "--data",
               str(fake_english_data), "--layers", "0", "2", "--max-sentences", "50", "--max-train-sentences", "50"]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT)
    assert finished.returncode == 0, finished.stderr[-2000:]
    lines = finished.stdout.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"{fake_english_checkpoint}: mu=") and "L2 F1=" in lines[0] and "ppl train=" in lines[0]


def test_inv_order_is_read_from_the_checkpoint(fake_english_data, tmp_path):
    """Under inv-order the gold alignment is reversed: the position-driven identity alignment of a barely trained
    model is then wrong (paper ID 3: F1 .02)."""
    fairseq_train(fake_english_data, tmp_path, "--task", "fake_english", "--inv-order", updates=2)
    result = eval_mult.run([str(tmp_path / "checkpoint_last.pt"), "--data", str(fake_english_data), "--layers", "0",
                             "--max-sentences", "50", "--max-train-sentences", "20"])
    assert result["layers"]["0"]["align_f1"] < 0.2


def test_training_logs_multilinguality_curves(fake_english_data, tmp_path):
    """The task's validation hook logs mu and its parts with fairseq's validation stats: Fig. 6/7 from one run."""
    log = fairseq_train(fake_english_data, tmp_path, "--task", "fake_english", "--eval-multilinguality",
                        "--eval-mult-sentences", "40", "--validate-interval-updates", "2", "--log-format", "json",
                        updates=4)
    log_path = tmp_path / "train.log"
    log_path.write_text(log)
    updates, mean, std = curves_over_seeds([log_path, log_path], "mu")
    assert list(updates) == [2, 4] and (std == 0).all() and ((0 <= mean) & (mean <= 1)).all()
    assert plot_training_curves({"original": [log_path]}, tmp_path / "fig6.png").stat().st_size > 10_000


def test_checkpoint_of_another_task_is_refused(fake_english_checkpoint, fake_english_data, tmp_path, capsys):
    state = torch.load(fake_english_checkpoint, weights_only=True)
    state["cfg"]["task"]["_name"] = "masked_lm"
    other = tmp_path / "masked_lm.pt"
    torch.save(state, other)
    expect_cli_error(capsys, eval_mult.main,
                     [str(other), "--data", str(fake_english_data)], "trained with task 'masked_lm'")


def test_bilingual_options_are_refused_for_fake_english(fake_english_checkpoint, fake_english_data, capsys):
    expect_cli_error(capsys, eval_mult.main,
                     [str(fake_english_checkpoint), "--data", str(fake_english_data), "--split", "test"],
                 "--dict and --split are for bilingual_mlm")


def test_dev_data_of_another_dictionary_is_refused(fake_english_checkpoint, bible_dir, tmp_path, capsys):
    from fairseq_xmlm.data.preparation import prepare_fake_english

    other = tmp_path / "small_vocab"
    prepare_fake_english(bible_dir, other, vocab_size=500, valid_size=20)
    expect_cli_error(capsys, eval_mult.main, [str(fake_english_checkpoint), "--data", str(other)], "dictionary")
    expect_cli_error(capsys, eval_mult.main, [str(tmp_path / "missing.pt"), "--data", str(other)], "does not exist")


def test_layer_beyond_the_model_is_refused(fake_english_checkpoint, fake_english_data, capsys):
    expect_cli_error(capsys, eval_mult.main,
                     [str(fake_english_checkpoint), "--data", str(fake_english_data), "--layers", "0", "13",
                          "--max-sentences", "5"], "layer 13 does not exist")
