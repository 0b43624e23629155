"""How each data set is obtained and turned into (source, target) pairs.

A recipe knows files and formats, nothing about models. Corpora that can be fetched are
downloaded once into the user's data cache (`data_home`) and read from there afterwards;
`python -m s2s.data_recipes` fetches them ahead of time (for a machine that will be offline).

`S2S_SHARED_DATA=DIR` names a folder that holds the corpora already, in the layout
`python -m s2s.data_recipes multi30k treebank --dir DIR` writes (DIR/multi30k,
DIR/nltk_data): with it set, the recipes read them there and never download.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_home() -> Path:
    """Where fetched corpora live: $S2S_DATA_HOME, else $XDG_CACHE_HOME/s2s, else ~/.cache/s2s."""
    if os.environ.get("S2S_DATA_HOME"):
        return Path(os.environ["S2S_DATA_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "s2s"


SHARED_ENV = "S2S_SHARED_DATA"


def shared_data() -> Path | None:
    """$S2S_SHARED_DATA, the folder holding the corpora already (nothing is downloaded), or None."""
    value = os.environ.get(SHARED_ENV, "").strip()
    return Path(value).expanduser() if value else None
