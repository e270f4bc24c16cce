from setuptools import find_packages, setup

setup(
    name="fairseq-xmlm",
    version="0.1.0",
    description="fairseq plugin for training and dissecting bilingual masked language models",
    packages=find_packages(include=["fairseq_xmlm", "fairseq_xmlm.*"]),
    python_requires=">=3.11",
    entry_points={
        "console_scripts": [
            "xmlm-fetch-bible = fairseq_xmlm.data.bible:main",
            "xmlm-fetch-dict = fairseq_xmlm.data.freedict:main",
            "xmlm-prepare = fairseq_xmlm.data.prepare:main",
            "xmlm-build-knn = fairseq_xmlm.analysis.knn_table:main",
            "xmlm-eval-mult = fairseq_xmlm.evaluation.eval_mult:main",
            "xmlm-analyze = fairseq_xmlm.analysis.cli:main",
            "xmlm-genre = fairseq_xmlm.zeroshot.genre:main",
            "xmlm-untrained = fairseq_xmlm.untrained:main",
            "xmlm-zeroshot = fairseq_xmlm.zeroshot.run:main",
            "xmlm-train = fairseq_xmlm.train:cli_main",
        ],
    },
)
