"""matplotlib for figure files: the Agg backend (no display needed), its import-time DEBUG lines silenced, and PNGs
written atomically with the umask's permissions (`io.replace_atomically`)."""
import logging

from fairseq_xmlm.io import replace_atomically


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported on first use: commands without figures never load it)."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font search would log at DEBUG on import
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(figure, path, dpi=120):
    """Write `figure` to `path` as a PNG (tight bounding box) and close it; returns the path."""
    try:
        return replace_atomically(path, lambda tmp: figure.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight"))
    finally:
        pyplot().close(figure)
