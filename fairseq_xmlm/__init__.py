"""fairseq-xmlm: a fairseq plugin for training and dissecting bilingual masked language models.

Importing the package (through `--user-dir fairseq_xmlm` or a plain `import fairseq_xmlm`, which is what spawned
distributed workers do when they unpickle our task configs) registers every task, model and criterion, installs
the allowlist that lets fairseq checkpoints load with `torch.load(weights_only=True)`, and makes an XmlmError that
ends the program one `error: ...` line with exit status 2, whichever program it is (fairseq-train included; under
fairseq-preprocess its text inputs are checked first, see preprocess_inputs).
"""
import logging
import sys
import warnings

from fairseq_xmlm.errors import install_excepthook


class _WithoutTensorboardHint(logging.Filter):
    """fairseq.tasks.text_to_speech logs "Please install tensorboardX" on import, in every program that loads
    fairseq's task registry; no command here writes tensorboard logs, so the hint is noise."""

    def filter(self, record):
        return "Please install tensorboardX" not in record.getMessage()


def _quiet_fairseq_imports():
    logging.getLogger("fairseq.tasks.text_to_speech").addFilter(_WithoutTensorboardHint())
    # fairseq 0.12 turns every command line into its config with hydra 1.3's deprecated API: six UserWarnings per
    # parse about fairseq's code, nothing a user can change. Warnings of any other origin stay on.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"hydra\.")
    warnings.filterwarnings("ignore", r"\s*'config' is validated against ConfigStore schema", UserWarning)
    # Two of fairseq's modules call logging.basicConfig when imported, one at DEBUG, which would print every
    # library's debug messages (matplotlib's font search, ...) on stderr. Configured first, the root logger keeps
    # fairseq-train's own settings (INFO, its format; stderr for our commands, whose stdout holds results), and
    # their calls change nothing. A program that configured logging already (fairseq-train) is left as it is.
    if not logging.getLogger().handlers:
        logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s",
                            datefmt="%Y-%m-%d %H:%M:%S", level=logging.INFO, stream=sys.stderr)


_quiet_fairseq_imports()
install_excepthook()

from fairseq_xmlm import checkpoints  # noqa: E402,F401  (installs the safe-loading allowlist first)
from fairseq_xmlm import criterions, models, optim, preprocess_inputs, tasks  # noqa: E402,F401

preprocess_inputs.install()
