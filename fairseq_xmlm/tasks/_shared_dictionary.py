"""What every task of this plugin shares: one dictionary serves as source and target (masked LM, classification),
and the masked-LM tasks' replacement policy, the same flags in both (`masking.ReplacementConfig`)."""
import os
from dataclasses import dataclass, field

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import FairseqTask

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.masking import RANDOM_SOURCES, ReplacementConfig
from fairseq_xmlm.vocabulary import dictionary_fingerprint


class SharedDictionaryTask(FairseqTask):
    @property
    def source_dictionary(self):
        return self.dictionary

    @property
    def target_dictionary(self):
        return self.dictionary


@dataclass
class ReplacementPolicyConfig(FairseqDataclass):
    """The masking flags of fake_english and bilingual_mlm."""

    mask_prob: float = field(default=0.15, metadata={"help": "fraction of the non-special tokens chosen as targets"})
    replacement_probs: str = field(
        default="",
        metadata={"help": "MASK,KEEP,RANDOM[,KNN] for targets; default .8,.1,.1 (.5,.1,.1,.3 with --knn-replace)"},
    )
    # a str, checked by masking.resolve_replacement_probs: a ChoiceEnum field's class cannot be pickled, and spawned
    # workers unpickle the task config
    random_replace: str = field(
        default="cross",
        metadata={"help": f"{'|'.join(RANDOM_SOURCES)}: random words from the whole vocabulary (cross), the row "
                  "language's own (within), or never (none: the RANDOM share goes to KEEP)"},
    )
    no_random: bool = field(
        default=False,
        metadata={"help": "never replace targets by random tokens (.8,.2,0): --random-replace none, and a RANDOM "
                  "probability > 0 in --replacement-probs is refused"},
    )
    knn_replace: int = field(default=0, metadata={"help": "K: replace targets by one of K cross-lingual neighbours"})
    knn_table: str = field(default="", metadata={"help": "neighbour table written by xmlm-build-knn"})


def replacement_config(cfg):
    """The ReplacementConfig of a task config holding ReplacementPolicyConfig's fields."""
    return ReplacementConfig(cfg.replacement_probs, cfg.random_replace, cfg.no_random, cfg.knn_replace)


def load_knn_table(path, dictionary, k):
    """The (len(dictionary), k) neighbour ids written by xmlm-build-knn, checked against this dictionary."""
    if not path:
        raise XmlmError("--knn-replace needs --knn-table (build it with xmlm-build-knn)")
    if not os.path.isfile(path):
        raise XmlmError(f"knn table not found: {path}")
    try:
        table = torch.load(path, weights_only=True)
    except Exception as err:  # noqa: BLE001 (whatever a damaged file makes torch raise, it is this file's fault)
        raise XmlmError(f"cannot read knn table {path}: corrupt, truncated or not written by xmlm-build-knn "
                        f"({type(err).__name__})") from None
    if not isinstance(table, dict) or not isinstance(table.get("neighbours"), torch.Tensor):
        raise XmlmError(f"knn table {path} holds no neighbour table (write it with xmlm-build-knn)")
    if table.get("dict_size") != len(dictionary) or table.get("dict_md5") != dictionary_fingerprint(dictionary):
        raise XmlmError(f"knn table {path} was built for another vocabulary (rebuild it with xmlm-build-knn)")
    neighbours = table["neighbours"]
    if neighbours.dim() != 2 or neighbours.size(0) != len(dictionary):
        raise XmlmError(f"knn table {path} has neighbours of shape {tuple(neighbours.shape)}, not "
                        f"({len(dictionary)}, K)")
    if neighbours.size(1) < k:
        raise XmlmError(f"knn table {path} has {neighbours.size(1)} neighbours per token, --knn-replace asks {k}")
    return neighbours[:, :k].contiguous()
