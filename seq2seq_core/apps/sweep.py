"""A sweep: variants of one preset, each a list of overrides trained to the same budget in its own
run directory SWEEP_DIR/NAME, one after another, then one table and one plot per varied setting.

The variants are a grid (the cartesian product of `KEY=V1,V2` options) or a YAML list of override
mappings, each optionally named. SWEEP_DIR/sweep.json (the manifest: preset, common overrides,
budget, variants and their state) makes the sweep resumable: the same command again skips the
variants that have a result.json, resumes an interrupted one through its run directory (bit for bit,
`s2s.core.training.trainer`) and trains the rest; a finished sweep only rewrites results.md,
results.json and the plots. Another sweep in the same folder is an error naming sweep.json. Every
variant's config is loaded and checked before the first one trains.
"""

from __future__ import annotations

import argparse
import fcntl
import itertools
import json
import logging
import math
import re
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from ..errors import ConfigError, DataError, S2SError, UsageError
from ..files import atomic_write_text

log = logging.getLogger("s2s")

MANIFEST, LOCK = "sweep.json", ".lock"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.,=+-]*")
_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]+")
BUDGET_KEYS = {"updates": "optim.max_updates", "minutes": "run.max_minutes"}
#: the other key of each budget, lifted so that only the budget stops training (a common override
#: wins)
LIFTED = {"updates": ("run.max_minutes", "0"), "minutes": ("optim.max_updates", "10000000")}


@dataclass
class Variant:
    name: str
    overrides: list[str]  # KEY=VALUE, as `s2s train` takes them


@dataclass
class Sweep:
    preset: str
    variants: list[Variant]
    budget: dict  # {"updates": N} or {"minutes": M}
    directory: Path
    common: list[str] = field(default_factory=list)
    plugins: list[str] = field(default_factory=list)
    seeds: int = 1  # runs of each variant, with run.seed 1..seeds (SWEEP_DIR/NAME/seedS)
    # each trained run's settings as loaded (the preset's content, not its name): `configs`
    resolved: dict = field(default_factory=dict)

    def run_dir(self, variant: Variant) -> Path:
        return Path(self.directory) / variant.name

    def trained(self) -> list[Variant]:
        """The runs the sweep trains: each variant, or with seeds each variant's seed runs
        (named NAME/seedS, `run.seed=S` added)."""
        if self.seeds == 1:
            return list(self.variants)
        return [
            Variant(f"{v.name}/seed{s}", [*v.overrides, f"run.seed={s}"])
            for v in self.variants
            for s in range(1, self.seeds + 1)
        ]

    def seed_runs(self, variant: Variant) -> list[Variant]:
        """The runs of one of the user's variants (itself without seeds)."""
        return [t for t in self.trained() if t.name.partition("/seed")[0] == variant.name]

    def overrides(self, variant: Variant) -> list[str]:
        """What `s2s train` gets for `variant`: common, budget, the variant's own, run.dir."""
        ((kind, value),) = self.budget.items()
        lifted_key, lifted = LIFTED[kind]
        lift = [] if lifted_key in keys(self.common) else [f"{lifted_key}={lifted}"]
        return [
            *self.common,
            *lift,
            f"{BUDGET_KEYS[kind]}={value}",
            *variant.overrides,
            f"run.dir={self.run_dir(variant)}",
        ]

    def manifest(self) -> dict:
        return {
            "preset": self.preset,
            "common": list(self.common),
            "budget": dict(self.budget),
            "seeds": self.seeds,
            "variants": [{"name": v.name, "overrides": list(v.overrides)} for v in self.variants],
            "resolved": self.resolved,
        }


def keys(overrides) -> list[str]:
    return [o.partition("=")[0] for o in overrides]


# -- the variants ---------------------------------------------------------------------------
def _derived_names(variants: list[list[str]]) -> list[str]:
    """Filesystem-safe names from the overrides: `heads-1_dropout-0` (the keys' last parts, or
    the whole keys where those collide), `base` for no overrides; made unique with a suffix."""

    def name(overrides, whole):
        parts = [
            f"{k if whole else k.rpartition('.')[2]}-{v}"
            for k, _, v in (o.partition("=") for o in overrides)
        ]
        text = _UNSAFE.sub("_", "_".join(parts)).lstrip("._-")[:80]
        return text or "base"

    names = [name(o, False) for o in variants]
    if len(set(names)) < len(names):
        names = [name(o, True) for o in variants]
    counts, seen = Counter(names), Counter()
    for i, n in enumerate(names):
        seen[n] += 1
        names[i] = f"{n}-{seen[n]}" if counts[n] > 1 else n
    return names


def grid(options: list[str]) -> list[Variant]:
    """The cartesian product of `--grid KEY=V1,V2,...` options (the first key varies slowest)."""
    axes = []
    for option in options:
        key, sep, text = option.partition("=")
        values = text.split(",")
        if not sep or not key or not all(values):
            raise UsageError(
                f"--grid {option}: write KEY=V1,V2,... (e.g. --grid model.heads=1,2,4)"
            )
        if key in (k for k, _ in axes):
            raise UsageError(
                f"--grid {option}: {key} is varied twice; give its values in one --grid"
            )
        if len(set(values)) < len(values):
            raise UsageError(f"--grid {option}: a value is given twice")
        axes.append((key, values))
    combos = [
        [f"{k}={v}" for (k, _), v in zip(axes, combo)]
        for combo in itertools.product(*(v for _, v in axes))
    ]
    return [Variant(n, o) for n, o in zip(_derived_names(combos), combos)]


def _text(value) -> str:
    """A YAML value as the command line would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return json.dumps(value) if isinstance(value, list) else str(value)


def _flat(mapping: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={_text(value)}")
    return out


def read_variants(path: str | Path) -> list[Variant]:
    """A YAML list of override mappings (`- {name: heads1, model.heads: 1}`; nested sections work
    too)."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--variants {path}: no such file")
    from .. import textio

    try:
        items = yaml.safe_load("\n".join(textio.read_lines(path)))  # invalid UTF-8: file, line
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise ConfigError(
            f"{path}{f', line {mark.line + 1}' if mark else ''}: not YAML "
            f"({getattr(e, 'problem', None) or 'cannot parse'})"
        ) from None
    if not isinstance(items, list) or not items:
        raise ConfigError(
            f"{path}: must be a YAML list of variants (mappings of KEY: VALUE, each with an "
            "optional name)"
        )
    given, overrides = [], []
    for i, item in enumerate(items, 1):
        item = {} if item is None else item  # `- ` alone: the preset as it is
        if not isinstance(item, dict):
            raise ConfigError(f"{path}: variant {i} must be a mapping of KEY: VALUE, got {item!r}")
        item = dict(item)
        name = item.pop("name", None)
        if name is not None and not _NAME.fullmatch(str(name)):
            raise ConfigError(
                f"{path}: variant {i} name {name!r}: letters, digits and _ . , = + - only (it "
                "names a folder)"
            )
        given.append(None if name is None else str(name))
        overrides.append(_flat(item))
    derived = _derived_names(overrides)
    names = [g or d for g, d in zip(given, derived)]
    for n in names:
        if names.count(n) > 1:
            raise ConfigError(f"{path}: two variants are named {n!r}; name them apart (name: ...)")
    return [Variant(n, o) for n, o in zip(names, overrides)]


# -- checks before any training -------------------------------------------------------------
def configs(sweep: Sweep, registry) -> list:
    """Every variant's config, loaded and checked; the first bad one fails naming its variant and
    key."""
    from ..setup.config import load_config

    taken = {"run.dir", *BUDGET_KEYS.values()}
    ((kind, value),) = sweep.budget.items()
    if not (value > 0 and math.isfinite(value)):  # run.max_minutes=0 would mean no budget
        raise UsageError(f"--budget-{kind} {value}: must be a finite number > 0")
    for key in keys(sweep.common):
        if key == "run.dir" or key == BUDGET_KEYS[kind]:
            raise UsageError(
                f"common override {key}: the sweep sets it (run.dir=SWEEP_DIR/NAME; the budget "
                "option)"
            )
    if not 1 <= sweep.seeds <= 100:
        raise UsageError(f"--seeds {sweep.seeds}: from 1 to 100 runs of each variant")
    if sweep.seeds > 1:
        taken.add("run.seed")
        if "run.seed" in keys(sweep.common):
            raise UsageError("common override run.seed: --seeds sets it (1 to N) for every run")
    for v in sweep.variants:
        if (
            not _NAME.fullmatch(v.name)
            or v.name in (MANIFEST, LOCK)
            or v.name.startswith(("results", "sweep_"))
        ):
            raise ConfigError(
                f"variant name {v.name!r}: must be a folder name of letters, digits and _ . , = + "
                "- "
                "other than sweep.json, results.* and sweep_*"
            )
        for key in keys(v.overrides):
            if key in taken:
                raise UsageError(
                    f"variant {v.name}: {key} is set by the sweep (run.dir, the budget, "
                    "run.seed with --seeds) for every variant"
                )
    load_config(
        sweep.preset, sweep.overrides(Variant("", [])), registry=registry
    )  # the common part alone
    out, seen = [], {}
    for v in sweep.trained():
        try:
            cfg = load_config(sweep.preset, sweep.overrides(v), registry=registry)
        except ConfigError as e:
            raise ConfigError(f"variant {v.name}: {e}") from None
        settings = _flat_settings(cfg)
        same = json.dumps({k: x for k, x in settings.items() if k != "run.dir"}, sort_keys=True)
        if same in seen:  # variants compared by value: "2" and "02" are one setting
            raise UsageError(
                f"variants {seen[same]} and {v.name} have the same settings "
                f"({' '.join(v.overrides) or 'the preset'}): give each value once"
            )
        seen[same] = v.name
        sweep.resolved[v.name] = settings
        out.append(cfg)
    return out


def _flat_settings(cfg) -> dict:
    """A config as {"section.key": value}, resolved (what a run trains with)."""
    found = {}

    def walk(node, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            else:
                found[f"{prefix}{key}"] = (
                    value
                    if isinstance(value, (int, float, bool, str, type(None), list))
                    else str(value)
                )

    walk(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True), "")
    return found


def commands(sweep: Sweep, registry) -> list[str]:
    """One `s2s train` command per variant (shell-quoted), for a scheduler of one's own."""
    configs(sweep, registry)
    plugins = [a for p in sweep.plugins for a in ("--plugin", p)]
    return [
        shlex.join(["s2s", "train", *plugins, sweep.preset, *sweep.overrides(v)])
        for v in sweep.trained()
    ]


def _claim(sweep: Sweep):
    """SWEEP_DIR, held by this sweep, with its manifest: a new one, or the same sweep's."""
    d = Path(sweep.directory)
    path, wanted = d / MANIFEST, sweep.manifest()
    if d.is_dir() and not path.is_file():  # no sweep began here: every entry is the user's
        foreign = sorted(p.name for p in d.iterdir() if p.name != LOCK)
        if foreign:
            raise UsageError(
                f"--dir {d} holds files s2s sweep did not write ({', '.join(foreign[:3])}): "
                "use a new or empty folder"
            )
    d.mkdir(parents=True, exist_ok=True)
    lock = open(d / LOCK, "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise UsageError(
            f"--dir {d} is being swept by another process (it holds {d / LOCK})"
        ) from None
    if path.is_file():
        try:
            old = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            lock.close()
            raise UsageError(
                f"{path} cannot be read ({e}); move the folder aside or use another --dir"
            ) from None
        for key in ("preset", "budget", "common", "variants", "seeds"):
            was = old.get(key, 1 if key == "seeds" else None)  # a sweep from before --seeds
            if key == "variants" and isinstance(was, list):
                was = [
                    {"name": v.get("name"), "overrides": v.get("overrides")}
                    for v in was
                    if isinstance(v, dict)
                ]
            if was != wanted[key]:
                lock.close()
                raise UsageError(
                    f"{path} holds another sweep: its {key} was {json.dumps(was)[:200]}, now "
                    f"{json.dumps(wanted[key])[:200]}; run the command it was made with, or use "
                    "another --dir"
                )
        changed = _changed(old.get("resolved") or {}, wanted["resolved"])
        if changed:
            lock.close()
            raise UsageError(
                f"{path} holds this sweep with other settings: {changed}; the preset or an "
                "override changed since it began: run it as it was, or use another --dir"
            )
    return lock


def _changed(was: dict, now: dict) -> str | None:
    """The first setting of a run that differs between a sweep's manifest and now, said in
    words, or None (a manifest from before settings were recorded says nothing)."""
    for name in sorted(set(was) & set(now)):
        for key in sorted(set(was[name]) & set(now[name])):  # a setting added since: its default
            if key != "run.dir" and was[name][key] != now[name][key]:
                return (
                    f"variant {name}'s {key} was {json.dumps(was[name][key])}, now "
                    f"{json.dumps(now[name][key])}"
                )
    return None


def _trained(run_dir: Path) -> int | None:
    """The updates a finished run trained (its result.json's), or None: not finished, or it
    trained none (a budget too small: an untrained model's figures are no variant's), or its
    result.json is damaged (said in the log: resuming the run tests it again and rewrites it)."""
    from ..runs.result import read_result

    try:
        result = read_result(run_dir)
    except DataError as e:
        log.warning("%s: the variant is resumed, which tests it again", e)
        return None
    return result["update"] if result and result["update"] > 0 else None


def _save_states(sweep: Sweep, states: dict) -> None:
    manifest = sweep.manifest()
    for entry, v in zip(manifest["variants"], sweep.variants):
        found = [states[t.name] for t in sweep.seed_runs(v)]
        entry["state"] = found[0] if sweep.seeds == 1 else found
    atomic_write_text(Path(sweep.directory) / MANIFEST, json.dumps(manifest, indent=1) + "\n")


def run(sweep: Sweep, registry, quiet: bool = False) -> dict:
    """Train every variant not yet finished, one after another, then write the table and plots.
    Every unfinished variant passes the checks `s2s train` makes before training (its data
    prepared and fitting the model: `check_before_training`) before the first trains."""
    from ..training.trainer import check_before_training, train

    cfgs = configs(sweep, registry)
    lock = _claim(sweep)
    try:
        done = lambda v: _trained(sweep.run_dir(v)) is not None  # noqa: E731
        states = {v.name: "done" if done(v) else "pending" for v in sweep.trained()}
        for v, cfg in zip(sweep.trained(), cfgs):
            if states[v.name] == "pending":
                try:
                    check_before_training(cfg, registry, quiet=quiet)
                except S2SError as e:
                    raise type(e)(f"variant {v.name}: {e}") from None
        _save_states(sweep, states)
        for i, (v, cfg) in enumerate(zip(sweep.trained(), cfgs), 1):
            if states[v.name] == "done":
                log.info(
                    "sweep %s: variant %d/%d %s is finished", sweep.directory, i, len(cfgs), v.name
                )
                continue
            log.info(
                "sweep %s: variant %d/%d %s: %s",
                sweep.directory,
                i,
                len(cfgs),
                v.name,
                " ".join(v.overrides) or "(the preset)",
            )
            states[v.name] = "running"
            _save_states(sweep, states)
            train(cfg, registry, quiet=quiet)
            if not _trained(sweep.run_dir(v)):
                ((kind, value),) = sweep.budget.items()
                raise UsageError(
                    f"--budget-{kind} {value:g}: variant {v.name} trained no update in it; a "
                    "budget must train at least one: give a larger one"
                )
            states[v.name] = "done"
            _save_states(sweep, states)
        return write_results(sweep, cfgs, registry)
    finally:
        lock.close()


# -- the table and the plots ----------------------------------------------------------------
def _count_parameters(run_dir: Path) -> int | None:
    """Parameters of the model as trained (the newest rolling checkpoint); a tied matrix once."""
    from ..runs import checkpoint

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
    interval of the primary figure (`pooled`, `pooled_interval`)."""
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
    return {**sweep.manifest(), "varied": varied, "metric": metric, "rows": rows}


def _run_row(sweep: Sweep, v: Variant, cfg, varied: list[str]) -> dict:
    """One run's settings and figures, from its result.json and metrics.jsonl."""
    from ..runs.result import read_result
    from ..runs.metrics import read_metrics

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
        "checkpoint": result.get("checkpoint"),
        "test": tests,
    }


def _over_seeds(seeds: list[dict]) -> dict:
    """A variant's row from its seed runs' rows: means, and the sample standard deviations of
    the dev and test figures."""
    import numpy as np

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
        "test": {label: mean for label, (mean, _) in tests.items()},
        "test_sd": {label: sd for label, (_, sd) in tests.items()},
    }


def _pooled(sweep: Sweep, v: Variant, cfg, registry) -> dict:
    """The primary test figure of the variant's seed runs pooled (every seed's output of a
    sentence counted together, `s2s.core.resampling`), with its 95% interval from resampling
    the test sentences; {} for a multi-task run or a task without per-sentence statistics."""
    from ..data.members import build_members, data_config
    from ..data.prepared import prepare_data
    from ..resampling import SentenceStatistics, intervals

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
        return _text(value)
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else str(value)


def table(results: dict) -> str:
    """results.md's Markdown table."""
    labels = list(dict.fromkeys(k for r in results["rows"] for k in r["test"]))
    seeds = results.get("seeds", 1)
    pooled = list(dict.fromkeys(k for r in results["rows"] for k in r.get("pooled_interval", {})))
    dev_names = list(dict.fromkeys(r.get("dev_name", results["metric"]) for r in results["rows"]))
    head = [
        "variant",
        *results["varied"],
        "params",
        "updates",
        "dev ppl",
        *(f"dev {name}" for name in dev_names),  # each metric its own column
        *(f"test {label}" for label in labels),
        *(f"pooled test {label} [95%]" for label in pooled),
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
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if seeds > 1:
        lines.append(
            f"\n{seeds} seeds a variant: mean ± the seeds' standard deviation; pooled: every "
            "seed's test output together, its 95% interval from resampling the test sentences"
        )
    return "\n".join(lines) + "\n"


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot(results: dict, key: str, path: Path) -> Path:
    """Dev and test metric against setting `key`: one line per combination of the other varied
    settings that varies `key` (every point alone when none does); a categorical axis unless
    every value is a number."""
    from matplotlib.figure import Figure

    rows, others = results["rows"], [k for k in results["varied"] if k != key]
    values = [r["settings"][key] for r in rows]
    numeric = all(_number(v) for v in values)
    categories = list(dict.fromkeys(map(_text, values)))
    x = (lambda v: v) if numeric else (lambda v: categories.index(_text(v)))  # noqa: E731
    groups: dict[tuple, list] = {}
    for r in rows:
        groups.setdefault(tuple(str(r["settings"][k]) for k in others), []).append(r)
    lines = [g for g in groups.values() if len(g) > 1] or list(groups.values())
    labels = list(dict.fromkeys(k for r in rows for k in r["test"]))
    dev_names = list(dict.fromkeys(r.get("dev_name", results["metric"]) for r in rows))
    fig = Figure(figsize=(11, 4), layout="constrained")
    dev, test = fig.subplots(1, 2)
    panels = (
        (
            dev,
            f"dev {results['metric']}",
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
                f"{k.rpartition('.')[2]} {_text(group[0]['settings'][k])}" for k in others
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
        str(plot(results, key, d / f"sweep_{_UNSAFE.sub('_', key)}.png"))
        for key in results["varied"]
    ]
    atomic_write_text(d / "results.md", table(results))
    atomic_write_text(d / "results.json", json.dumps(results, indent=1) + "\n")
    return results


def grid_item(text: str) -> str:
    """A --grid value: KEY=V1,V2 (argparse names the flag when this refuses one)."""
    key, eq, values = text.partition("=")
    if not (key and eq and values):
        raise argparse.ArgumentTypeError(
            f"takes KEY=V1,V2 (e.g. --grid model.heads=1,2), got {text!r}"
        )
    return text
