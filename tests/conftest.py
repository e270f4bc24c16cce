"""Session fixtures shared by the test modules: real Bible text, prepared data, tiny real training runs."""
import ast
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

# Triton's interpreter runs the packed encoder's attention kernels on the CPU; Triton reads this as the kernels are
# defined (tests/gpu runs them compiled, with TRITON_INTERPRET=0)
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from fairseq_xmlm.data import bible_verses  # noqa: E402
from fairseq_xmlm.data.cache import cache_dir  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TEST_VERSIONS = {"en": "3", "en_kjv": "k", "fr": "l", "de": "s", "ru": "r", "hi": "i", "zh": "c"}
# The code that writes the test Bibles: a change to it (the cleaning of a verse, say) is a new cache key.
BIBLE_CODE = [REPO / "fairseq_xmlm" / "data" / "bible_verses.py", REPO / "fairseq_xmlm" / "io.py"]
TIMEOUT = 900  # seconds for any one command a fixture or helper runs (a tiny training run takes well under one)


def bible_cache_key():
    digest = hashlib.sha256(repr(sorted(TEST_VERSIONS.items())).encode())
    for path in BIBLE_CODE:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def fetched_bible_dir():
    """The test Bibles, fetched once per version of the code that writes them (BIBLE_CODE) into the cache dir;
    test Bibles of other versions of that code are removed."""
    folder = cache_dir() / "tests" / f"bible-{bible_cache_key()}"
    if not folder.is_dir():
        build = folder.with_name(f".{folder.name}.{os.getpid()}")
        shutil.rmtree(build, ignore_errors=True)
        bible_verses.fetch_bible(build, TEST_VERSIONS)
        try:
            os.replace(build, folder)
        except OSError:  # another test session built it first
            shutil.rmtree(build, ignore_errors=True)
        for stale in folder.parent.glob("bible*"):
            if stale != folder and not stale.name.startswith("."):
                shutil.rmtree(stale, ignore_errors=True)
    return folder


def finished_then_aborted(output):
    """fairseq-train trained, saved and said so, then the interpreter aborted while tearing down a C++ thread
    (`terminate called without an active exception`; seen in 2 of about 8 CPU test sessions, in stock fairseq-train
    runs after every line of fairseq's and our code had run): the checkpoint is complete, the failure is not ours."""
    return "done training" in output and "terminate called without an active exception" in output


@pytest.fixture(scope="session")
def bible_dir():
    return fetched_bible_dir()


@pytest.fixture(scope="session")
def fake_english_data(bible_dir, tmp_path_factory):
    """Dufter's data (BBE New Testament, 2048 pieces) with a 1000-sentence KJV dev set."""
    from fairseq_xmlm.data.preparation import prepare_fake_english

    out = tmp_path_factory.mktemp("data-bin") / "fake_english"
    prepare_fake_english(bible_dir, out, vocab_size=2048, valid_size=1000)
    return out


# The entry points' modules: run as `python -m`, they need no console script (a GPU machine may have fairseq on
# its path without one).
ENTRY_MODULES = {"fairseq-train": "fairseq_cli.train", "xmlm-train": "fairseq_xmlm.train"}


def fairseq_train(data, save_dir, *extra, updates=8, batch_size=32, entry="fairseq-train", cpu=True):
    """A real `fairseq-train --user-dir fairseq_xmlm` run (or `entry`'s, e.g. xmlm-train) on the CPU (cpu=False: the
    GPU); returns its log."""
    command = [
        sys.executable, "-m", ENTRY_MODULES[entry], str(data), "--user-dir", str(REPO / "fairseq_xmlm"),
        "--arch", "xmlm_bert_small", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "2e-3",
        "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr-scheduler", "polynomial_decay", "--warmup-updates", "2",
        "--total-num-update", str(updates), "--batch-size", str(batch_size), "--max-update", str(updates),
        "--save-dir", str(save_dir), *(["--cpu"] if cpu else []), "--num-workers", "0", "--log-format", "simple",
        "--log-interval", "1", "--max-valid-steps", "2", "--no-epoch-checkpoints", "--seed", "1", *extra,
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=TIMEOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if result.returncode != 0 and not finished_then_aborted(result.stdout + result.stderr):
        raise AssertionError(f"{entry} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


@pytest.fixture(scope="session")
def fake_english_checkpoint(fake_english_data, tmp_path_factory):
    """A BERT-small trained for a few updates on Fake-English: the tiny real checkpoint other tests evaluate."""
    save_dir = tmp_path_factory.mktemp("checkpoints") / "original"
    fairseq_train(fake_english_data, save_dir, "--task", "fake_english", updates=10)
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def one_thread():
    # Fine-tuning is many tiny ops: on a busy 2-core machine two intra-op threads mostly wait for each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def en_fr_checkpoint(bible_dir, tmp_path_factory):
    """Bible en+fr (joint sentencepiece, 600 pieces) -> a tiny sep-emb + sep-layer-1 encoder, 60 real updates.

    Every data-bin split is read by the genre benchmark; these books put every genre on every benchmark side.
    The zero-shot tasks read its data-bin's spm model and dictionary."""
    from fairseq_xmlm.data.preparation import prepare_pair

    root = tmp_path_factory.mktemp("en_fr")
    prepare_pair(bible_dir, ["en", "fr"], "joint", 600, root / "data",
                 train_books="Leviticus,Judges,Job,Micah,Acts,Galatians", valid_books="Ruth,Joel,Titus",
                 test_books="Ecclesiastes,Jonah,Ezra,2 Peter,Jude")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", ENTRY_MODULES["fairseq-train"], str(root / "data"), "--user-dir",
                    "fairseq_xmlm", "--task", "bilingual_mlm", "--langs", "en,fr", "--arch", "xmlm_bert_small",
                    "--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                    "--encoder-attention-heads", "2", "--sep-emb", "--sep-layers", "1-1",
                    "--tokens-per-sample", "64", "--criterion", "masked_lm", "--optimizer", "adam", "--lr", "1e-3",
                    "--batch-size", "16", "--max-update", "60", "--cpu", "--num-workers", "0",
                    "--disable-validation", "--no-epoch-checkpoints", "--save-dir", str(root / "ckpt")],
                   cwd=REPO, env=env, check=True, capture_output=True, timeout=TIMEOUT)
    return root / "ckpt" / "checkpoint_last.pt"


@pytest.fixture(scope="session")
def bible_en_fr_data(bible_dir, tmp_path_factory):
    """A small real en-fr pair for bilingual_mlm: joint BPE (600 pieces), Mark + Luke to train, Jonah / Philippians
    held out."""
    from fairseq_xmlm.data.preparation import prepare_pair

    out = tmp_path_factory.mktemp("data-bin") / "bible_en_fr"
    prepare_pair(bible_dir, ["en", "fr"], "joint", 600, out, train_books="Mark,Luke", valid_books="Jonah",
                 test_books="Philippians")
    return out


def expect_cli_error(capsys, main, argv, message):
    """A console script's bad input: exit status 2 and ONE stderr line `error: ...` containing `message`."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err


def module_name(path):
    """fairseq_xmlm/a/b.py -> fairseq_xmlm.a.b; a package's __init__.py is the package."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_command(path):
    """A module a user runs: a `__main__.py`, or one with a `cli_errors` console script or a `__main__` guard."""
    if path.name == "__main__.py":
        return True
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef) and any(ast.unparse(d) == "cli_errors" for d in node.decorator_list):
            return True
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'", "'__main__' == __name__"):
            return True
    return False


def command_modules():
    """{module name: path} of every command module of the package (`is_command`)."""
    paths = sorted((REPO / "fairseq_xmlm").rglob("*.py"))
    return {module_name(path): path for path in paths if is_command(path)}
