"""Static fastText skipgram vectors: the knn-replace neighbour table's embeddings (`knn_builder.py`) and
xmlm-analyze word's baseline (`word_vectors.py`)."""
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from fairseq_xmlm.errors import XmlmError

# What `train_fasttext` runs in a fresh interpreter: fastText's options (JSON) in, words and vectors (.npz) out.
FASTTEXT_PROGRAM = """
import json, sys
import numpy as np
from fasttext import FastText

options, out = json.loads(sys.argv[1]), sys.argv[2]
# fasttext.train_unsupervised does not pass fastText's -seed through; build its arguments the way it does.
args = FastText._build_args({**FastText.unsupervised_default, **options}, set(options))
model = FastText._FastText(args=args)
FastText.fasttext.train(model.f, args)
model.set_args(model.f.getArgs())
words = [w for w in model.get_words() if w != "</s>"]  # fastText's own end-of-line token
np.savez(out, words=np.array(words), vectors=np.stack([model.get_word_vector(w) for w in words]))
"""


def train_fasttext(corpus_path, dim, epochs, seed, threads, min_count=1):
    """Skipgram vectors of every word of the corpus -> (words sorted by decreasing frequency, (n, dim) array).

    Trains in a fresh interpreter. fastText randomly initialises only the first `threads` tenths of its input matrix
    (the words, then 2M subword buckets) and leaves the rest as malloc returns it: zeros in a young process, where a
    matrix that large is freshly mapped, but stale heap data in a long-lived one such as a test session, where the
    same seed gave other vectors (mappings that recovered no twin, or fastText's "Encountered NaN.")."""
    if importlib.util.find_spec("fasttext") is None:  # else the child's ModuleNotFoundError names no remedy
        raise XmlmError(f"fastText vectors of {corpus_path} need the fasttext module (pip install "
                        "fasttext-numpy2==0.10.4, as scripts/setup.sh does); a knn-replace table can also be built "
                        "where it is installed and copied")
    options = dict(input=str(corpus_path), model="skipgram", dim=dim, epoch=epochs, minCount=min_count, seed=seed,
                   thread=threads, verbose=0)
    with tempfile.TemporaryDirectory(prefix="xmlm-fasttext-") as tmp:
        out = os.path.join(tmp, "vectors.npz")
        child = subprocess.run([sys.executable, "-c", FASTTEXT_PROGRAM, json.dumps(options), out],
                               capture_output=True, text=True)
        if child.returncode != 0:
            reason = (child.stderr.strip().splitlines() or [f"exit status {child.returncode}"])[-1]
            raise XmlmError(f"fastText training failed on {corpus_path}: {reason}")
        with np.load(out) as trained:
            return trained["words"].tolist(), trained["vectors"]
