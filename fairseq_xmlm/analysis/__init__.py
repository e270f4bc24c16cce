"""Comparing representations: aligning embedding spaces (`alignment.py`) and centred kernel alignment (`cka.py`).

    from fairseq_xmlm.analysis import procrustes, csls_scores, linear_cka, ...

The rest of the package applies them to models: `sentence_retrieval.py` and `word_vectors.py` (Conneau et al.
2020, section 5; the command `xmlm-analyze`, `cli.py`), `knn_builder.py` (Dufter & Schuetze's knn-replace
neighbours, from `fasttext.py`'s vectors; the command `xmlm-build-knn`, `knn_table.py`).
"""
from fairseq_xmlm.analysis.alignment import (csls_scores, iterative_normalize, nearest_neighbours, procrustes,
                                             translation_accuracy, unsupervised_mapping)
from fairseq_xmlm.analysis.cka import debiased_linear_cka, linear_cka

__all__ = ["procrustes", "iterative_normalize", "csls_scores", "nearest_neighbours", "translation_accuracy",
           "linear_cka", "debiased_linear_cka", "unsupervised_mapping"]
