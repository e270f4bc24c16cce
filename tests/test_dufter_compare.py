"""`python -m fairseq_xmlm.experiments.dufter compare`: two dufter_table1.json side by side against the paper."""
import json

from conftest import expect_cli_error
from fairseq_xmlm.experiments.dufter.__main__ import main


def row(mu, std=0.02, stalled=0, rho0=0.1, n=5):
    return {"mu": mu, "mu_std": std, "n": n, "stalled": stalled, "ppl_train": 9.4, "ppl_dev": 230.0,
            "layers": {"0": {"align_f1": 1.0, "retrieval": rho0, "translation": 0.9},
                       "8": {"align_f1": 1.0, "retrieval": 0.9, "translation": 0.7}}}


def write_table(path, setting, rows):
    path.write_text(json.dumps({"setting": setting, "updates": 13700, "seeds": [0, 42, 43, 100, 101], "rows": rows}))
    return str(path)


def test_rows_in_both_side_by_side_and_how_many_are_near_the_paper(tmp_path, capsys):
    before = write_table(tmp_path / "a.json", "old", {"0": row(0.64), "1": row(0.10, 0.15, stalled=2), "3": row(0.01)})
    after = write_table(tmp_path / "b.json", "new", {"1": row(0.41, 0.20, rho0=0.5), "0": row(0.69, 0.01),
                                                     "21": row(0.17), "3": row(0.01, n=2)})
    main(["compare", before, after, "--names", "default,habits", "--out", str(tmp_path / "c.md"), "--plot",
          str(tmp_path / "c.png")])
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("| run | μ paper | μ default | μ habits | stalled | L0 ρ |")
    # AFTER's order, the IDs both have; the paper's μ of lang-pos is .30, original .70
    assert lines[2].startswith("| 1 lang-pos | .30 | .10 ± .15 | .41 ± .20 | 2 → 0 | .10 → .50 |")
    assert lines[3].startswith("| 0 original | .70 | .64 ± .02 | .69 ± .01 | 0 → 0 |")
    # a row trained on fewer seeds than its table's says how many
    assert lines[4].startswith("| 3 inv-order | .01 | .01 ± .02 | .01 ± .02 (n=2) | 0 → 0 |") and len(lines) == 8
    assert "- default: 2 of 3 rows within 0.10 of the paper's μ (not: 1); old" in out
    assert "- habits: 2 of 3 rows within 0.10 of the paper's μ (not: 1); new" in out  # .41 is .11 above .30
    assert (tmp_path / "c.md").read_text() == out
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_that_is_not_a_table_is_one_error_line(tmp_path, capsys):
    good = write_table(tmp_path / "a.json", "s", {"0": row(0.6)})
    (tmp_path / "genre.json").write_text('{"checkpoint_best.pt": {"test": {"fr": 48.0}}}')
    expect_cli_error(capsys, main, ["compare", good, str(tmp_path / "none.json")], "none.json not found")
    expect_cli_error(capsys, main, ["compare", str(tmp_path / "genre.json"), good],
                     "genre.json is not a dufter_table1.json")
    other = write_table(tmp_path / "b.json", "s", {"1": row(0.3)})
    expect_cli_error(capsys, main, ["compare", good, other], "no run ID in common")
    expect_cli_error(capsys, main, ["compare", good, good, "--names", "one"], "--names must be two names")
    assert not (tmp_path / "c.md").exists()
