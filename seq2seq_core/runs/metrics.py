"""RUN_DIR/metrics.jsonl read back: the records a training wrote (`s2s.core.training.runlog`),
for plots, sweeps and a resumed run's log. One JSON object per line: kind (train | valid | test |
stopped), update, elapsed training seconds, then the figures (`MEMBER/FIGURE` keys for a run of
several members)."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(run_dir: Path) -> list[dict]:
    """The run's records, oldest first; a torn last line (a killed run) is passed over."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: not a run directory of `s2s train`")
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and "update" in record:
            records.append(record)
    return records
