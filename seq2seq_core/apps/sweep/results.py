"""A sweep's results: one row per variant (its settings and figures; with seeds, their mean,
spread and pooled interval), ranked by the dev figure in the direction the task's score declares
(`Score.higher_is_better`: a BLEU sweep ranks the highest first, an error rate the lowest), the
table (results.md, results.json) and a plot per varied setting."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from omegaconf import OmegaConf

from ...data.members import build_members, data_config
from ...data.nodes import prepare_data
from ...errors import DataError
from ...files import atomic_write_text
from ...contract.resampling import SentenceStatistics, intervals
from ...contract.task import better
from ...runs import checkpoint
from ...runs.metrics import read_metrics
from ...runs.result import read_result
from .variants import UNSAFE, Sweep, Variant, keys, spelled


def _count_parameters(run_dir: Path) -> int | None:
    """Parameters of the model as trained (the newest rolling checkpoint); a tied matrix once."""
    paths = checkpoint.listed(run_dir)
    if not paths:
        return None
    tensors = checkpoint.load(paths[-1])["model"].values()
    return sum(
        t.numel()
        for t in {
            (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape): t for t in tensors
        }.values()
    )


def _plain(value):
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return value if isinstance(value, (int, float, bool, type(None), list, dict)) else str(value)


def collect(sweep: Sweep, cfgs: list, registry=None) -> dict:
    """One row per variant: varied settings, parameters, updates, dev ppl, dev and test metric.
    With seeds, a row's figures are the mean over the variant's seed runs, with their standard
    deviation (`dev_sd`, `test_sd`), each seed's figures (`seed_runs`) and the pooled test
    interval of the primary figure (`pooled`, `pooled_interval`). Each row's `dev_rank` is its
    place among the variants of its dev metric (1: the best; `ranking`: their names, best
    first)."""
    varied = list(dict.fromkeys(k for v in sweep.variants for k in keys(v.overrides)))
    rows, metric = [], None
    runs = dict(zip((t.name for t in sweep.trained()), zip(sweep.trained(), cfgs)))
    for v in sweep.variants:
        seeds = [_run_row(sweep, t, runs[t.name][1], varied) for t in sweep.seed_runs(v)]
        if sweep.seeds == 1:
            rows.append({"name": v.name, **seeds[0]})
            continue
        cfg = runs[sweep.seed_runs(v)[0].name][1]
        rows.append(
            {
                "name": v.name,
                "dev_name": seeds[0]["dev_name"],
                **_over_seeds(seeds),
                **_pooled(sweep, v, cfg, registry),
            }
        )
        rows[-1]["seed_runs"] = seeds
    metrics = list(dict.fromkeys(r["dev_name"] for r in rows))  # variants may differ (task.mode)
    metric = metrics[0] if len(metrics) == 1 else "several"
    ranking = _rank(rows)
    return {
        **sweep.manifest(),
        "varied": varied,
        "metric": metric,
        "rows": rows,
        "ranking": ranking,
    }


def _rank(rows: list[dict]) -> dict[str, list[str]]:
    """Set each row's `dev_rank` among the rows of its dev metric and direction (1: the best,
    better as the run's `select_higher_is_better` says; tied figures share a place; None: no dev
    figure); returns each metric's variant names, best first."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        r["dev_rank"] = None
        if _number(r.get("dev_metric")):
            groups.setdefault((r["dev_name"], r.get("dev_higher_is_better", True)), []).append(r)
    ranking = {}
    for (name, higher), group in groups.items():
        ordered = sorted(group, key=lambda r: -r["dev_metric"] if higher else r["dev_metric"])
        for r in ordered:
            r["dev_rank"] = 1 + sum(better(o["dev_metric"], r["dev_metric"], higher) for o in group)
        label = name if (name, not higher) not in groups else f"{name} ({direction(higher)})"
        ranking[label] = [r["name"] for r in ordered]
    return ranking


def direction(higher: bool) -> str:
    return "higher is better" if higher else "lower is better"


def _run_row(sweep: Sweep, v: Variant, cfg, varied: list[str]) -> dict:
    """One run's settings and figures, from its result.json and metrics.jsonl."""
    run_dir = sweep.run_dir(v)
    result = read_result(run_dir)  # checked when the sweep started; a DataError names it
    if result is None:
        raise DataError(f"{run_dir / 'result.json'} is gone: run the sweep again to test it")
    valid = [r for r in read_metrics(run_dir) if r.get("kind") == "valid"]
    test = result.get("test") or {}
    single = bool(test) and "signature" in test  # else member -> figures
    scores = {"": test} if single else test
    tests = {
        f"{m}/{next(iter(s))}" if m else next(iter(s)): next(iter(s.values()))
        for m, s in scores.items()
        if s
    }
    return {
        "dev_name": next(iter(test)) if single else "select",  # what dev_metric is
        "settings": {k: _plain(OmegaConf.select(cfg, k)) for k in varied},
        "overrides": v.overrides,
        "run_dir": str(run_dir),
        "params": _count_parameters(run_dir),
        "updates": result.get("update"),
        "elapsed_s": valid[-1].get("elapsed") if valid else None,
        "dev_ppl": valid[-1].get("ppl") if valid else None,
        "dev_metric": (result.get("dev_select") or {}).get(result.get("checkpoint")),
        # which way dev_metric is better (the task's Score.higher_is_better); True before it
        "dev_higher_is_better": result.get("select_higher_is_better", True),
        "checkpoint": result.get("checkpoint"),
        "test": tests,
    }


def _over_seeds(seeds: list[dict]) -> dict:
    """A variant's row from its seed runs' rows: means, and the sample standard deviations of
    the dev and test figures."""

    def spread(values: list) -> tuple[float | None, float | None]:
        values = [x for x in values if _number(x)]
        if not values:
            return None, None
        sd = float(np.std(values, ddof=1)) if len(values) > 1 else None
        return float(np.mean(values)), sd

    labels = list(dict.fromkeys(k for r in seeds for k in r["test"]))
    tests = {label: spread([r["test"].get(label) for r in seeds]) for label in labels}
    first = seeds[0]
    return {
        "settings": first["settings"],
        "overrides": first["overrides"][:-1],  # without the seed's run.seed
        "run_dir": str(Path(first["run_dir"]).parent),
        "params": first["params"],
        "updates": spread([r["updates"] for r in seeds])[0],
        "elapsed_s": spread([r["elapsed_s"] for r in seeds])[0],
        "dev_ppl": spread([r["dev_ppl"] for r in seeds])[0],
        "dev_metric": spread([r["dev_metric"] for r in seeds])[0],
        "dev_sd": spread([r["dev_metric"] for r in seeds])[1],
        "dev_higher_is_better": first["dev_higher_is_better"],
        "test": {label: mean for label, (mean, _) in tests.items()},
        "test_sd": {label: sd for label, (_, sd) in tests.items()},
    }


def _pooled(sweep: Sweep, v: Variant, cfg, registry) -> dict:
    """The primary test figure of the variant's seed runs pooled (every seed's output of a
    sentence counted together, `s2s.core.contract.resampling`), with its 95% interval from
    resampling the test sentences; {} for a multi-task run or a task without per-sentence
    statistics."""
    if registry is None or cfg.tasks is not None:
        return {}
    (member,) = build_members(cfg, registry)
    member.data = prepare_data(member.task, data_config(cfg), quiet=True)
    sources, refs = member.data.texts("test")
    parts = []
    for t in sweep.seed_runs(v):
        hyps = (sweep.run_dir(t) / "test.hyp.txt").read_text(encoding="utf-8").splitlines()
        stats = member.statistics(hyps, refs, sources)
        if stats is None:
            return {}
        parts.append(stats)
    pooled = SentenceStatistics(sum(p.rows for p in parts), parts[0].figures)
    name, found = next(iter(intervals(pooled).items()))
    return {"pooled": {name: found.value}, "pooled_interval": {name: found.as_dict()}}


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return spelled(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def table(results: dict) -> str:
    """results.md's Markdown table."""
    labels = list(dict.fromkeys(k for r in results["rows"] for k in r["test"]))
    seeds = results.get("seeds", 1)
    pooled = list(dict.fromkeys(k for r in results["rows"] for k in r.get("pooled_interval", {})))
    dev_names = list(dict.fromkeys(r.get("dev_name", results["metric"]) for r in results["rows"]))
    lower = {r.get("dev_name") for r in results["rows"] if r.get("dev_higher_is_better") is False}
    head = [
        "variant",
        *results["varied"],
        "params",
        "updates",
        "dev ppl",
        *(  # each metric its own column
            f"dev {name}" + (" (lower is better)" if name in lower else "") for name in dev_names
        ),
        *(f"test {label}" for label in labels),
        *(f"pooled test {label} [95%]" for label in pooled),
        "rank (dev)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def spread(mean, sd) -> str:  # mean +- the seeds' standard deviation
        return _cell(mean) + (f" ± {sd:.2f}" if _number(sd) else "")

    for r in results["rows"]:
        sds = r.get("test_sd", {})
        intervals = r.get("pooled_interval", {})
        cells = [
            r["name"],
            *(_cell(r["settings"][k]) for k in results["varied"]),
            _cell(r["params"]),
            _cell(r["updates"], 0),
            _cell(r["dev_ppl"], 3),
            *(
                spread(r["dev_metric"], r.get("dev_sd"))
                if r.get("dev_name", results["metric"]) == name
                else "-"
                for name in dev_names
            ),
            *(spread(r["test"].get(label), sds.get(label)) for label in labels),
            *(
                f"{i['value']:.2f} [{i['low']:.2f}, {i['high']:.2f}]" if i else "-"
                for i in (intervals.get(label) for label in pooled)
            ),
            _cell(r.get("dev_rank")),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if seeds > 1:
        lines.append(
            f"\n{seeds} seeds a variant: mean ± the seeds' standard deviation; pooled: every "
            "seed's test output together, its 95% interval from resampling the test sentences"
        )
    return "\n".join(lines) + "\n"


def best_lines(results: dict) -> list[str]:
    """The best variant on each dev metric, one a line, saying which way is better: "best on
    dev ter (lower is better): heads-2"."""
    lines = []
    for name, ranked in (results.get("ranking") or {}).items():
        row = next(r for r in results["rows"] if r["name"] == ranked[0])
        how = direction(row.get("dev_higher_is_better", True))
        lines.append(f"best on dev {name.split(' (')[0]} ({how}): {ranked[0]}")
    return lines


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot(results: dict, key: str, path: Path) -> Path:
    """Dev and test metric against setting `key`: one line per combination of the other varied
    settings that varies `key` (every point alone when none does); a categorical axis unless
    every value is a number."""
    rows, others = results["rows"], [k for k in results["varied"] if k != key]
    values = [r["settings"][key] for r in rows]
    numeric = all(_number(v) for v in values)
    categories = list(dict.fromkeys(map(spelled, values)))
    x = (lambda v: v) if numeric else (lambda v: categories.index(spelled(v)))  # noqa: E731
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(str(r["settings"][k]) for k in others), []).append(r)
    lines = [g for g in groups.values() if len(g) > 1] or list(groups.values())
    labels = list(dict.fromkeys(k for r in rows for k in r["test"]))
    dev_names = list(dict.fromkeys(r.get("dev_name", results["metric"]) for r in rows))
    lower = any(r.get("dev_higher_is_better") is False for r in rows)
    fig = Figure(figsize=(11, 4), layout="constrained")
    dev, test = fig.subplots(1, 2)
    panels = (
        (
            dev,
            f"dev {results['metric']}"
            + (f" ({direction(False)})" if lower and len(dev_names) == 1 else ""),
            [
                (  # each metric its own line (variants of different tasks: bleu, f1)
                    name if len(dev_names) > 1 else None,
                    lambda r, name=name: r["dev_metric"] if r.get("dev_name") == name else None,
                    lambda r: r.get("dev_sd"),
                )
                for name in dev_names
            ],
        ),
        (
            test,
            "test" if len(labels) > 1 else f"test {labels[0] if labels else ''}",
            [
                (
                    label,
                    lambda r, label=label: r["test"].get(label),
                    lambda r, label=label: r.get("test_sd", {}).get(label),
                )
                for label in labels
            ],
        ),
    )
    for ax, title, series in panels:
        for group in lines:
            group = sorted(group, key=lambda r: x(r["settings"][key]))
            fixed = ", ".join(
                f"{k.rpartition('.')[2]} {spelled(group[0]['settings'][k])}" for k in others
            )
            for label, figure, sd in series:
                points = [
                    (x(r["settings"][key]), figure(r), sd(r)) for r in group if _number(figure(r))
                ]
                legend = "; ".join(
                    s
                    for s in (label if len(labels) > 1 else None, fixed if len(lines) > 1 else None)
                    if s
                )
                ax.errorbar(  # with seeds: the seeds' standard deviation as error bars
                    [p[0] for p in points],
                    [p[1] for p in points],
                    yerr=[p[2] if _number(p[2]) else 0.0 for p in points],
                    marker="o",
                    capsize=3,
                    label=legend or "_",
                )
        ax.set_title(title)
        ax.set_xlabel(key)
        ax.grid(alpha=0.3)
        if not numeric:
            ax.set_xticks(range(len(categories)), categories)
        elif len(set(values)) <= 12:
            ax.set_xticks(sorted(set(values)))
        if any(not line.get_label().startswith("_") for line in ax.get_lines()):
            ax.legend(fontsize="small")
    ((kind, budget),) = results["budget"].items()
    seeds = results.get("seeds", 1)
    each = f", mean ± sd of {seeds} seeds" if seeds > 1 else ""
    fig.suptitle(f"{results['preset']}: {budget:g} {kind} per variant{each}")
    fig.savefig(path, dpi=100)
    return path


def write_results(sweep: Sweep, cfgs: list, registry=None) -> dict:
    """SWEEP_DIR/results.md, results.json and sweep_KEY.png for each varied setting."""
    d = Path(sweep.directory)
    results = collect(sweep, cfgs, registry)
    results["plots"] = [
        str(plot(results, key, d / f"sweep_{UNSAFE.sub('_', key)}.png"))
        for key in results["varied"]
    ]
    atomic_write_text(d / "results.md", table(results))
    atomic_write_text(d / "results.json", json.dumps(results, indent=1) + "\n")
    return results
