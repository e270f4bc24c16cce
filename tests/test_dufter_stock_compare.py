"""`python -m fairseq_xmlm.experiments.dufter stock-compare`: stock fairseq's masked_lm and the plugin's run 0 on one
corpus with one set of options, scored by the same code."""
import json

import torch

from fairseq_xmlm.experiments.dufter import stock_compare
from fairseq_xmlm.experiments.dufter.__main__ import main


def test_the_stock_command_is_the_plugin_command_with_task_model_and_data_swapped(fake_english_data, tmp_path):
    data, stock_bin = fake_english_data, tmp_path / "bin"
    plugin = stock_compare.plugin_command(data, tmp_path / "run", stock_compare.preset_of("full"), 42, 2)
    stock = stock_compare.stock_command(plugin, data, stock_bin)

    def options(command):  # what follows the data directory
        return command[next(k for k, part in enumerate(command) if part.startswith("--")):]

    plugin_options, stock_options = options(plugin), options(stock)
    assert "fairseq_xmlm.experiments.dufter.stock_train" in stock and str(stock_bin) in stock
    assert str(data) not in stock and "--user-dir" not in stock and "--eval-multilinguality" not in plugin
    for name in ("--task", "--criterion", "--arch"):
        assert stock[stock.index(name) + 1] == {"--task": "masked_lm", "--criterion": "masked_lm",
                                                "--arch": "roberta"}[name]
    # every option of the plugin run but its task, criterion, model and --user-dir is in the stock run, in order
    shared = stock_compare.without(plugin_options, {"--task": 1, "--criterion": 1, "--arch": 1, "--user-dir": 1})
    assert stock_options[-len(shared):] == shared
    assert shared[shared.index("--total-num-update") + 1] == "13700"  # paper-code: the paper's updates
    assert shared[-4:] == ["--num-workers", "2", "--log-file", str(tmp_path / "run" / "train.log")]


def test_last_logged_reads_fairseqs_json_log(tmp_path):
    log = tmp_path / "train.log"
    log.write_text('2026-11-29 | INFO | train | {"epoch": 1, "train_loss": "12.5", "train_ppl": "5.8e+03"}\n'
                   'not json {\n{"epoch": 1, "valid_loss": "12.7"}\n{"epoch": 2, "train_loss": "11.25"}\n')
    assert stock_compare.last_logged(log, "train_loss") == 11.25
    assert stock_compare.last_logged(log, "valid_loss") == 12.7
    assert stock_compare.last_logged(log, "train_wps") is None


def test_stock_compare_trains_and_scores_stock_and_plugin_runs(fake_english_data, tmp_path, capsys):
    """The tiny preset end to end on the CPU: export, stock fairseq-preprocess, three real fairseq-train runs (two of
    stock masked_lm), each scored; the stock model reads the same token ids through its own dictionary."""
    from fairseq_xmlm.checkpoints import load_checkpoint
    from fairseq_xmlm.evaluation.stock_roberta import StockRobertaEncoder, id_table
    from fairseq_xmlm.tasks.fake_english import FakeEnglishConfig, FakeEnglishTask

    results = tmp_path / "stock"
    main(["stock-compare", "tiny", "--data", str(fake_english_data), "--results", str(results), "--device", "cpu"])
    summary = json.loads((results / "stock.json").read_text())
    assert list(summary["runs"]) == list(stock_compare.RUNS) and summary["updates"] == 2
    for row in summary["runs"].values():
        assert 0 <= row["mu"] <= 1 and set(row["layers"]) == {"0", "8"}
        assert row["train_loss"] > 5 and row["valid_loss"] > 5  # 2 updates: near the uniform 11.8 bits
    assert "| stock-workers2 |" in capsys.readouterr().out

    task = FakeEnglishTask.setup_task(FakeEnglishConfig(data=str(fake_english_data)))
    roberta, stock_task, _ = load_checkpoint(results / "stock-workers2" / "checkpoints" / "checkpoint_last.pt",
                                             "cpu", data=results / "corpus" / "bin")
    table = id_table(task.dictionary, stock_task.source_dictionary)
    sentence = task.load_split_sentences("valid")[0]
    for lang in (0, 1):
        ids = task.sentence_input(sentence, lang)
        assert [stock_task.source_dictionary[int(i)] for i in table[ids]] == [task.dictionary[int(i)] for i in ids]
    encoder = StockRobertaEncoder(roberta, table).eval()
    ids = task.sentence_input(sentence, 1)[None]
    with torch.no_grad():
        states = encoder.encode_layers(ids, last_layer=8)
        features, _ = roberta(table[ids], features_only=True)
    assert len(states) == 9 and states[0].shape == (1, ids.shape[1], 64)
    assert len(encoder.layers) == 12
    full = encoder.encode_layers(ids)
    assert torch.allclose(full[-1], features)  # the last state is stock's own output features


def test_runs_picks_which_runs_train_and_unknown_ones_are_refused(fake_english_data, tmp_path, capsys):
    from conftest import expect_cli_error

    common = ["stock-compare", "--data", str(fake_english_data), "--results", str(tmp_path), "--dry-run"]
    main(common + ["--runs", "stock-workers2,fake_english-workers2"])
    trained = [line for line in capsys.readouterr().err.splitlines() if "--save-dir" in line]
    assert len(trained) == 2 and "stock_train" in trained[0] and "fairseq_cli.train" in trained[1]
    assert all("--num-workers 2" in line and "--clip-norm 1.0" in line for line in trained)  # the default's clipping
    expect_cli_error(capsys, main, common + ["--runs", "stock-workers1"], "unknown runs ['stock-workers1']")
