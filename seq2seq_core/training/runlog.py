"""The run's figures: RUN_DIR/metrics.jsonl, TensorBoard events when installed, the console.

metrics.jsonl holds one JSON object per line: kind (train | valid | test | stopped), update,
elapsed training seconds, then the figures. A multi-task run adds each member's figures under
`MEMBER/FIGURE` keys (`parse/loss`, `translate/bleu`); `s2s plot` draws one curve per member.
Only rank 0 writes; `s2s.core.runs.metrics` reads the file back. The console shows a record on
one line (`shown`); a valid record's line names only the figures a person watches (a parser's
EVALB gives dozens), metrics.jsonl has all.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from ..files import atomic_write_text
from ..runs.metrics import read_metrics

log = logging.getLogger("s2s")


#: the figures of a dev record that are the run's, not a member's
_VALID_RUN = ("kind", "update", "elapsed", "select", "select_higher_is_better", "best", "seconds")
#: the per-token figures that open each member's dev figures, before its metric's
_PER_TOKEN = ("loss", "nll", "ppl")
#: how many of a metric's other figures a valid line shows after its primary (EVALB has dozens)
_SECONDARY = 3


def _value(v) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _valid_figures(record: dict) -> str:
    """A valid record's figures for the console: the selection figure (with "lower is better"
    where it is, and "best" when it is the best so far), then each member's metric (its primary
    figure, the first after loss, nll and ppl, and the first `_SECONDARY` of its other figures)
    and dev loss, then the seconds validating took: "select 31.2 (best) | translate bleu 31.2
    chrf 55.1 loss 2.41 | parse f1 88.1 recall 87.9 precision 88.3 loss 0.92 | seconds 41.3". A
    multi-task run's loss over all members' tokens is left out."""
    members: dict[str, list[str]] = {}  # member prefix ("" for a lone one) -> its figures
    for key in record:
        if key not in _VALID_RUN:
            name, _, figure = key.rpartition("/")
            members.setdefault(name, []).append(figure)
    notes = [
        "lower is better" if record.get("select_higher_is_better") is False else "",
        "best" if record.get("best") else "",
    ]
    notes = "; ".join(n for n in notes if n)
    parts = [f"select {_value(record['select'])}" + (f" ({notes})" if notes else "")]
    for name, figures in members.items():
        primary = next((f for f in figures if f not in _PER_TOKEN), None)
        if primary is None:  # the run's loss, nll and ppl over every member's dev tokens
            continue
        prefix = f"{name}/" if name else ""
        part = [name, f"{primary} {_value(record[prefix + primary])}"]
        interval = (f"{primary}_low", f"{primary}_high")
        others = [f for f in figures if f not in (*_PER_TOKEN, primary, *interval)]
        part += [f"{f} {_value(record[prefix + f])}" for f in others[:_SECONDARY]]
        if "loss" in figures:
            part.append(f"loss {_value(record[prefix + 'loss'])}")
        parts.append(" ".join(filter(None, part)))
    if "seconds" in record:
        parts.append(f"seconds {_value(record['seconds'])}")
    return " | ".join(parts)


def shown(record: dict) -> str:
    """A record as a console line: "train update 100: loss 3.214 lr 0.0004 ... elapsed 61.2 s",
    every figure but a valid record's (`_valid_figures`)."""
    if record.get("kind") == "valid" and "select" in record:
        figures = _valid_figures(record)
    else:
        rest = {k: v for k, v in record.items() if k not in ("kind", "update", "elapsed")}
        figures = " ".join(f"{k} {_value(v)}" for k, v in rest.items())
    elapsed = f" elapsed {record['elapsed']:g} s" if "elapsed" in record else ""
    return f"{record.get('kind', '?')} update {record.get('update', '?')}: {figures}{elapsed}"


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
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if key not in ("update", "elapsed") and number:
                    self.tb.add_scalar(f"{record['kind']}/{key}", value, record["update"])
        if not self.quiet or record.get("kind") != "train":
            log.info(shown(record))

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
