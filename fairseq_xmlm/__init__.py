"""fairseq-xmlm: a fairseq plugin for training and dissecting bilingual masked language models.

Importing the package (through `--user-dir fairseq_xmlm` or a plain `import fairseq_xmlm`, which is what spawned
distributed workers do when they unpickle our task configs) registers every task, model and criterion, and
installs the allowlist that lets fairseq checkpoints load with `torch.load(weights_only=True)`.
"""
from fairseq_xmlm import checkpoints  # noqa: F401  (installs the safe-loading allowlist first)
from fairseq_xmlm import criterions, models, optim, tasks  # noqa: F401
