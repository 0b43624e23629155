"""The run's figures: RUN_DIR/metrics.jsonl, TensorBoard events when installed, the console.

metrics.jsonl holds one JSON object per line: kind (train | valid | test | stopped), update,
elapsed training seconds, then the figures. A multi-task run adds each member's figures under
`MEMBER/FIGURE` keys (`parse/loss`, `translate/bleu`); `s2s plot` draws one curve per member.
Only rank 0 writes.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..files import atomic_write_text

log = logging.getLogger("s2s")


def shown(record: dict) -> str:
    """A record as a console line: "train update 100: loss 3.214 lr 0.0004 ... elapsed 61.2 s"."""
    rest = {k: v for k, v in record.items() if k not in ("kind", "update", "elapsed")}
    figures = " ".join(
        f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in rest.items()
    )
    elapsed = f" elapsed {record['elapsed']:g} s" if "elapsed" in record else ""
    return f"{record.get('kind', '?')} update {record.get('update', '?')}: {figures}{elapsed}"


class ConsoleFormat(logging.Formatter):
    """The console's log lines: "12:01:05 train update 100: loss ...", the level named only for
    warnings and errors ("12:01:05 WARNING ...")."""

    def __init__(self):
        super().__init__("%(asctime)s %(message)s", datefmt="%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if record.levelno >= logging.WARNING:
            stamp, _, message = line.partition(" ")
            line = f"{stamp} {record.levelname} {message}"
        return line


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


def tensorboard_writer(run_dir: Path, purge_step: int):
    """A SummaryWriter under run_dir/tensorboard when tensorboard is installed, else None."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # optional: metrics.jsonl holds the same figures
        return None
    return SummaryWriter(str(run_dir / "tensorboard"), purge_step=purge_step)


class RunLog:
    """Appends records to metrics.jsonl (and TensorBoard); shows them unless quiet (train
    records) -- validation, test and stop records are always shown."""

    def __init__(self, run_dir: Path, quiet: bool, writer: bool):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.quiet, self.writer, self.tb = quiet, writer, None

    def start(self, update: int) -> None:
        """Drop records of updates after `update` (a resumed run redoes them) and torn lines,
        then open TensorBoard's writer at the next update."""
        if not self.writer:
            return
        if self.path.is_file():
            kept = [r for r in read_metrics(self.path.parent) if r["update"] <= update]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.tb = tensorboard_writer(self.path.parent, purge_step=update + 1)

    def __call__(self, record: dict, elapsed: float) -> None:
        if not self.writer:
            return
        record["elapsed"] = round(elapsed, 1)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if key not in ("update", "elapsed") and isinstance(value, (int, float)):
                    self.tb.add_scalar(f"{record['kind']}/{key}", value, record["update"])
        if not self.quiet or record.get("kind") != "train":
            log.info(shown(record))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
