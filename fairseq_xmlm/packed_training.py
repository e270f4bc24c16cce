"""The packed-training system's former module name, kept so that `python -m fairseq_xmlm.packed_training` and its
imports keep working: the system is the package `fairseq_xmlm.packed`."""
from fairseq_xmlm.packed.__main__ import SUSPENDED, main, train_packed  # noqa: F401
from fairseq_xmlm.packed.group import GroupData, PackedGroup  # noqa: F401
from fairseq_xmlm.packed.loop import train_group, train_groups  # noqa: F401
from fairseq_xmlm.packed.processes import Job, train_side_by_side  # noqa: F401
from fairseq_xmlm.packed.runs import Run, epoch_batches, parse_run, parse_runs  # noqa: F401

if __name__ == "__main__":
    main()
