"""python -m fairseq_xmlm.experiments.similarity: the commands it plans, and summary.md from hand-made analysis
JSONs."""
import json

import pytest

from conftest import expect_cli_error
from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.experiments.similarity.__main__ import main
from fairseq_xmlm.experiments.similarity.report import summary_markdown


def write_pair(results, pair, retrieval, cka, word=None):
    folder = results / pair
    folder.mkdir(parents=True)
    (folder / "sentence.json").write_text(json.dumps({"layers": [{"a_to_b": r, "b_to_a": r / 2} for r in retrieval]}))
    (folder / "cka.json").write_text(json.dumps({"cka": cka, "cka_random": [c / 4 for c in cka],
                                                 "pearson_cka_retrieval": 0.5}))
    if word:
        (folder / "word.json").write_text(json.dumps(word))


def test_summary_tables_per_layer_and_word_translation(tmp_path):
    write_pair(tmp_path, "en-fr", [0.2, 0.6], [0.8, 0.4],
               {"noncontextual": {"p1": 0.1}, "fasttext": {"p1": 0.25}, "contextual": [{"p1": 0.2}, {"p1": 0.3}]})
    write_pair(tmp_path, "en-zh", [0.1, 0.3], [0.6, 0.2])
    text = summary_markdown(tmp_path)
    assert "| pair | L0 | L1 |" in text
    assert "| en-fr | 15.0 | 45.0 |" in text  # retrieval: both directions averaged
    assert "| en-zh | 60.0 | 20.0 |" in text and "| en-zh | 15.0 | 5.0 |" in text  # CKA and its random bound
    assert "| en-fr | 10.0 | 25.0 | L1: 30.0 |" in text and "| en-zh | 1" not in text.split("CSLS")[1]


def test_summary_without_results_is_refused(tmp_path, capsys):
    with pytest.raises(XmlmError, match="no <pair>/cka.json"):
        summary_markdown(tmp_path)
    expect_cli_error(capsys, main, ["--report", "--results", str(tmp_path / "none")], "no <pair>/cka.json")


def test_plans_six_models_and_the_analyses_of_en_against_each(tmp_path, capsys):
    main(["quick", "--dry-run", "--corpus-dir", str(tmp_path / "bible"), "--data", str(tmp_path / "bin"),
          "--checkpoints", str(tmp_path / "ck"), "--results", str(tmp_path / "out")])
    planned = [line[2:] for line in capsys.readouterr().err.splitlines() if line.startswith("+ ")]
    trained = [c for c in planned if "fairseq_cli.train" in c]
    assert len(trained) == 6 and all("--cpu" in c and "--max-update 200" in c for c in trained)
    assert "--langs en" in trained[-1] and "--seed 2" in trained[-1]  # the paper's en'
    assert str(tmp_path / "ck" / "en_prime") in trained[-1]
    assert sum(" word " in c for c in planned) == 3 and sum(" cka " in c for c in planned) == 5
    assert not list(tmp_path.iterdir())  # a dry run writes nothing
