"""Safe loading of fairseq checkpoints: `torch.load(weights_only=True)` with an explicit allowlist.

A fairseq checkpoint is a pickle. Loaded with `weights_only=False`, any global it names is imported and called,
so a crafted file runs arbitrary code. Importing this module (which `import fairseq_xmlm` and
`--user-dir fairseq_xmlm` do first) therefore

1. allowlists exactly the globals that real fairseq checkpoints hold (`FAIRSEQ_CHECKPOINT_GLOBALS`), and
2. makes every checkpoint read of `fairseq.checkpoint_utils` (`load_model_ensemble_and_task`, training resume from
   `checkpoint_last.pt`, pretrained components) go through `safe_torch_load`: `weights_only=True`, and a refused or
   unreadable file becomes one `XmlmError` line naming the file and the reason (for a refused file: the global).

Trusted legacy checkpoints that hold other globals can be loaded with the explicit, logged opt-in
`XMLM_TRUST_CHECKPOINTS=1` (environment) or `load_checkpoint(path, trust=True)` / `with trusted_checkpoints():`.
It is off by default and never changes how anything outside fairseq's checkpoint reading loads pickles.
"""
import argparse
import collections
import contextlib
import contextvars
import os
import pickle
import re
import sys
import types
import typing

import omegaconf
import omegaconf.base
import omegaconf.nodes
import fairseq.distributed.utils
import torch
from fairseq import checkpoint_utils

from fairseq_xmlm.errors import XmlmError

TRUST_ENV = "XMLM_TRUST_CHECKPOINTS"

# Globals found in real fairseq checkpoints beyond torch's own defaults (tensors, storages, OrderedDict), found with
# torch.serialization.get_unsafe_globals_in_checkpoint on (a) a stock roberta_base checkpoint written by
# fairseq-train 0.12 and (b) a checkpoint whose "cfg" is the hydra DictConfig itself, as fairseq 0.10-era
# releases were saved. Every entry is a plain data container: none can run code when the unpickler calls it.
FAIRSEQ_CHECKPOINT_GLOBALS = [
    # (a) state["args"] of pre-hydra checkpoints, and state["cfg"]["model"] of every model registered with legacy
    # argparse arguments (roberta_base, ...), are an argparse.Namespace. fairseq 0.12 saves the rest of the cfg
    # as plain dicts/lists (OmegaConf.to_container), so this is the only extra global of a current checkpoint.
    argparse.Namespace,
    # (b) a pickled DictConfig: the containers, their metadata, and the node types of typed (structured) values.
    omegaconf.DictConfig,
    omegaconf.ListConfig,
    omegaconf.base.ContainerMetadata,
    omegaconf.base.Metadata,
    omegaconf.nodes.AnyNode,
    omegaconf.nodes.StringNode,
    omegaconf.nodes.IntegerNode,
    omegaconf.nodes.FloatNode,
    omegaconf.nodes.BooleanNode,
    # ... the metadata records key / element / reference types as type objects, and its flags as a defaultdict.
    typing.Any,
    dict,
    list,
    int,
    float,
    str,
    bool,
    collections.defaultdict,
    # Not in a file but in the in-memory copy of one: on a distributed resume rank 0 reads checkpoint_last.pt and
    # broadcasts it with torch.save, tensors replaced by these index placeholders; the other ranks torch.load it
    # (weights_only by default) and fail without this entry. A frozen dataclass holding one int.
    fairseq.distributed.utils._TensorPlaceholder,
]
torch.serialization.add_safe_globals(FAIRSEQ_CHECKPOINT_GLOBALS)

_trust_requested = contextvars.ContextVar("xmlm_trust_checkpoints", default=False)


@contextlib.contextmanager
def trusted_checkpoints():
    """Within this block, checkpoints read by fairseq are fully unpickled (`weights_only=False`).

    Only for legacy checkpoints from a source you trust: a crafted file runs arbitrary code when unpickled.
    """
    token = _trust_requested.set(True)
    try:
        yield
    finally:
        _trust_requested.reset(token)


def _trusted():
    return _trust_requested.get() or os.environ.get(TRUST_ENV, "") == "1"


def _file_name(f):
    return os.fspath(f) if isinstance(f, (str, os.PathLike)) else getattr(f, "name", repr(f))


def _refused_global(err):
    """The global that torch's weights-only unpickler refused, if that is why it failed."""
    refused = re.search(r"GLOBAL (\S+)", str(err))
    return refused.group(1) if refused else None


def _short_reason(err):
    """One informative line out of torch's multi-line loading error."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    detail = next((line for line in lines if "Unsupported" in line), lines[0] if lines else "empty or truncated")
    return f"{type(err).__name__}: {detail.split('. ')[0]}"


def safe_torch_load(f, map_location=None, **kwargs):
    """`torch.load` for fairseq checkpoints: weights_only=True + allowlist, one clear XmlmError on failure.

    A file that is missing, unreadable (empty, truncated, random bytes: torch raises one of a dozen types), refused
    by the allowlist, or a torch file without a model (a knn table, a bare state dict) is an XmlmError naming it."""
    name = _file_name(f)
    if isinstance(f, (str, os.PathLike)) and not os.path.isfile(f):
        raise XmlmError(f"checkpoint {name} does not exist" if not os.path.exists(f) else
                        f"checkpoint {name} is not a file")
    if _trusted():
        print(f"warning: loading checkpoint {name} with weights_only=False ({TRUST_ENV}=1 or trust=True): "
              "only do this for files from a trusted source", file=sys.stderr)
        return torch.load(f, map_location=map_location, weights_only=False, **kwargs)
    try:
        state = torch.load(f, map_location=map_location, weights_only=True, **kwargs)
    except Exception as err:  # noqa: BLE001 (whatever a damaged file makes torch raise, it is this file's fault)
        refused = _refused_global(err) if isinstance(err, pickle.UnpicklingError) else None
        if refused:
            raise XmlmError(f"refusing to load checkpoint {name}: it contains the global {refused}, which is not "
                            f"on the checkpoint allowlist (set {TRUST_ENV}=1 only if you trust this file)") from None
        raise XmlmError(f"cannot read checkpoint {name}: corrupt, truncated or not a torch.save checkpoint "
                        f"({_short_reason(err)})") from None
    if not isinstance(state, dict) or "model" not in state:
        found = f"keys {', '.join(map(str, list(state)[:5]))}" if isinstance(state, dict) else type(state).__name__
        raise XmlmError(f"{name} is a torch file but not a fairseq checkpoint (no model weights; it holds {found})")
    return state


class _TorchWithSafeLoad(types.ModuleType):
    """`torch` as fairseq.checkpoint_utils sees it: the real module, except that `load` is `safe_torch_load`."""

    load = staticmethod(safe_torch_load)

    def __getattr__(self, name):
        return getattr(torch, name)


# Why replace the name `torch` inside fairseq.checkpoint_utils (and nowhere else): load_checkpoint_to_cpu calls
# `torch.load(f, map_location=...)` without `weights_only`. torch >= 2.6 defaults that to True, but the
# process-wide TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 silently flips such calls back to full unpickling; pinning
# weights_only=True at fairseq's own call site keeps checkpoints safe regardless, without re-implementing
# load_checkpoint_to_cpu's cfg upgrading, and it is the one place that knows the file name for the error.
# Assigning a fresh wrapper each import is idempotent (it never wraps an earlier wrapper).
checkpoint_utils.torch = _TorchWithSafeLoad("torch")


def load_checkpoint(path, device="cpu", data=None, trust=False):
    """Load one fairseq checkpoint for evaluation / analysis -> (model in eval mode on `device`, task, cfg).

    `data` overrides the checkpoint's task data directory (where the task finds its dictionary) when the
    checkpoint was trained elsewhere. `trust=True` is the opt-in for trusted legacy checkpoints (see module doc).
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise XmlmError(f"checkpoint {path} does not exist")
    if data is not None and not os.path.isdir(data):
        raise XmlmError(f"data directory {data} does not exist")
    overrides = {"data": os.fspath(data)} if data is not None else None
    with trusted_checkpoints() if trust else contextlib.nullcontext():
        try:
            models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
        except FileNotFoundError as err:
            raise XmlmError(f"cannot set up the task of checkpoint {path}: {err} "
                            "(pass data=DIR if the data directory moved)") from None
    # in fp32 whatever the training precision (--bf16-params builds a bf16 model): analyses read the states as floats
    return models[0].float().to(device).eval(), task, cfg
