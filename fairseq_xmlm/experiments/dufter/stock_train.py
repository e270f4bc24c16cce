"""Stock `fairseq-train`, unchanged, for the stock comparison (stock_compare.py): `python -m
fairseq_xmlm.experiments.dufter.stock_train ARGS` is `fairseq-train ARGS` with numpy's `np.compat.long` alias
restored where numpy (>= 2.5) removed it, because fairseq 0.12's TokenBlockDataset calls it under
`--sample-break-mode eos`. Nothing else of fairseq is touched: the data-loader workers keep their stock behaviour.
"""
import logging
import os
import sys
import types

import numpy as np

from fairseq_xmlm.errors import XmlmError, cli_errors


def restore_numpy_compat():
    try:
        np.compat.long  # noqa: B018  (present in numpy < 2.5)
    except AttributeError:
        np.compat = types.SimpleNamespace(long=int)  # what numpy 1.x defined it as


@cli_errors
def main():
    data = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    if data is None or not os.path.isfile(os.path.join(data, "dict.txt")):
        raise XmlmError(f"{data or 'no data directory given'}: no dict.txt, not a data-bin of fairseq-preprocess "
                        "(stock_compare.prepare_stock_data writes one)")
    restore_numpy_compat()
    from fairseq_cli.train import cli_main

    sys.argv[0] = "fairseq-train"
    cli_main()
    # Trained and saved. Stock fairseq-train on the CPU at times aborts in the interpreter's teardown ("terminate
    # called without an active exception", a thread of torch's) after that, which would fail a finished run.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
