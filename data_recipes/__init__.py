"""How each data set is obtained and turned into (source, target) pairs.

A recipe knows files and formats, nothing about models. Real corpora shipped beside the project
(../shared/data) are found through `shared_data_dir`, which the S2S_SHARED_DATA environment
variable overrides; presets refer to them as `${shared:multi30k}`.
"""
from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    env = os.environ.get("S2S_SHARED_DATA")
    return Path(env) if env else (PROJECT_ROOT.parent / "shared" / "data")
