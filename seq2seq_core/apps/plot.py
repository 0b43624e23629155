"""Learning curves of a run, drawn from its metrics.jsonl: `s2s plot RUN_DIR`.

One PNG per quantity, each with two panels, against updates and against training time (in
seconds, minutes or hours, whichever suits the run's length: `time_unit`):
loss.png (training loss, dev loss), lr.png (the learning rate of equation 3) and one for each
dev metric the task reports (bleu.png, f1.png, ...), shaded with its 95% interval where the run
recorded one (`bleu_low`, `bleu_high`: the primary figure's, `s2s.core.contract.resampling`). A
multi-task run's figures carry their member's name (`parse/f1`): each PNG then draws one curve
per member, and select.png the selection figure. matplotlib draws off-screen (Agg); no display
is needed.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.figure import Figure

from ..files import no_such_run, output_folder, own_outputs, record_outputs
from ..runs.metrics import read_metrics

NOT_METRICS = {"kind", "update", "elapsed", "loss", "nll", "ppl", "seconds"}


def _number(value) -> bool:
    """A figure to draw: a number, not a flag (a valid record's `best`)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _falling(valid: list[dict]) -> set[str]:
    """The dev figures better lower: where every valid record's selection figure is
    (`select_higher_is_better` false: each member's primary figure is), `select` and each
    member's primary figure (the first after its per-token figures); else none."""
    if not valid or any(r.get("select_higher_is_better", True) for r in valid):
        return set()
    found, skipped = {"select"}, NOT_METRICS | {"select", "select_higher_is_better", "best"}
    for prefix in dict.fromkeys(k.rpartition("/")[0] for k in valid[-1]):
        primary = next(
            (
                figure
                for key, value in valid[-1].items()
                for member, _, figure in [key.rpartition("/")]
                if member == prefix and figure not in skipped and _number(value)
            ),
            None,
        )
        if primary is not None:
            found.add(primary)
    return found


def time_unit(seconds: float) -> tuple[str, float]:
    """(name, seconds per unit) for a time axis that reaches `seconds`: seconds up to 3 minutes,
    minutes up to 3 hours, then hours."""
    return (
        ("seconds", 1.0)
        if seconds <= 180
        else ("minutes", 60.0)
        if seconds <= 3 * 3600
        else ("hours", 3600.0)
    )


def _curves(
    records: list[dict], kind: str, key: str, unit: float = 3600.0
) -> tuple[list, list, list, tuple | None]:
    """(updates, times, values, band) of `key` in the records of `kind`, times in units of
    `unit` seconds (empty if not recorded); band: the confidence interval's (lows, highs) where
    every record holds `key`_low and `key`_high (the run recorded one), else None."""
    rows = [r for r in records if r.get("kind") == kind and _number(r.get(key))]
    times = [r["elapsed"] / unit for r in rows] if all("elapsed" in r for r in rows) else []
    bounded = rows and all(f"{key}_low" in r and f"{key}_high" in r for r in rows)
    band = ([r[f"{key}_low"] for r in rows], [r[f"{key}_high"] for r in rows]) if bounded else None
    return [r["update"] for r in rows], times, [r[key] for r in rows], band


def _figure(
    title: str, series: list[tuple[str, tuple]], ylabel: str, path: Path, unit: str = "hours"
) -> Path:
    fig = Figure(figsize=(11, 4), layout="constrained")
    by_update, by_time = fig.subplots(1, 2, sharey=True)
    for label, (updates, hours, values, band) in series:
        marker = "o" if len(values) < 30 else None
        for ax, xs in ((by_update, updates), (by_time, hours)):
            if not xs:
                continue
            (line,) = ax.plot(xs, values, label=label, marker=marker, markersize=3)
            if band is not None:  # the 95% interval of each dev figure, shaded
                ax.fill_between(xs, *band, color=line.get_color(), alpha=0.2, linewidth=0)
    by_update.set_xlabel("updates")
    by_time.set_xlabel(f"training time ({unit})")
    by_update.set_ylabel(ylabel)
    if not by_time.get_lines():
        by_time.text(
            0.5, 0.5, "no training time in metrics.jsonl", transform=by_time.transAxes, ha="center"
        )
    for ax in (by_update, by_time):
        ax.grid(alpha=0.3)
        if len(series) > 1 and ax.get_lines():
            ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=100)
    return path


def plot_run(run_dir: Path, out_dir: Path | None = None) -> list[Path]:
    """Write the run's learning curves as PNGs into out_dir (default RUN_DIR/plots)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise no_such_run(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} holds no records yet")
    if out_dir is not None:
        output_folder(out_dir, "--output")  # not a file, nor below one, nor a run's own folder
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    name = run_dir.resolve().name
    longest = max(
        (r["elapsed"] for r in records if isinstance(r.get("elapsed"), (int, float))), default=0
    )
    unit, seconds = time_unit(longest)
    curves = lambda kind, key: _curves(records, kind, key, seconds)  # noqa: E731
    figures = []  # (title, series, y label, file name): every figure, before one is drawn
    keys = [k for k in dict.fromkeys(k for r in records for k in r) if isinstance(k, str)]
    members = list(dict.fromkeys(k.split("/")[0] for k in keys if "/" in k))
    loss = [
        (f"{kind} {key}", curves(kind, key))
        for kind in ("train", "valid")
        for key in ["loss", *(f"{m}/loss" for m in members)]
    ]
    loss = [(label, c) for label, c in loss if c[2]]
    if loss:
        figures.append((f"{name}: label-smoothed loss per target token", loss, "loss", "loss.png"))
    lr = curves("train", "lr")
    if lr[2]:
        figures.append((f"{name}: learning rate", [("lr", lr)], "learning rate", "lr.png"))
    falling = _falling([r for r in records if r.get("kind") == "valid"])
    # metric -> its keys, one per member (or the one of a single task)
    metrics: dict[str, list[str]] = {}
    for key in sorted(
        k for k in keys if any(r.get("kind") == "valid" and _number(r.get(k)) for r in records)
    ):
        metric = key.rpartition("/")[2]
        bound = metric.endswith(("_low", "_high")) and metric.rpartition("_")[0] in keys
        if metric not in NOT_METRICS and not bound:
            metrics.setdefault(metric, []).append(key)
    for metric, series in metrics.items():
        drawn = [(f"dev {key}", curves("valid", key)) for key in series]
        shaded = any(c[3] is not None for _, c in drawn)
        label = f"{metric} (shaded: 95% interval)" if shaded else metric
        lower = " (lower is better)" if metric in falling else ""
        figures.append((f"{name}: dev {metric}{lower}", drawn, label, f"{metric}.png"))
    own_outputs(out_dir, [f[3] for f in figures], "--output")  # never over a user's file
    out_dir.mkdir(parents=True, exist_ok=True)
    written = [_figure(*f[:3], out_dir / f[3], unit=unit) for f in figures]
    record_outputs(out_dir, [p.name for p in written])
    return written
