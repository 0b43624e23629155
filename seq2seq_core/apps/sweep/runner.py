"""A sweep run: every variant's config loaded and checked before the first trains, SWEEP_DIR
held by one sweep with its manifest (sweep.json), the unfinished variants trained one after
another, then the table and plots (`results`)."""

from __future__ import annotations

import fcntl
import json
import logging
import math
import shlex
from pathlib import Path

from omegaconf import OmegaConf

from ...errors import ConfigError, DataError, S2SError, UsageError
from ...files import atomic_write_text, output_folder
from ...runs.result import read_result
from ...setup.config import load_config
from ...training.trainer import check_before_training, train
from .results import write_results
from .variants import BUDGET_KEYS, LOCK, MANIFEST, NAME, Sweep, Variant, keys

log = logging.getLogger("s2s")


def configs(sweep: Sweep, registry) -> list:
    """Every variant's config, loaded and checked; the first bad one fails naming its variant and
    key."""
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
            not NAME.fullmatch(v.name)
            or v.name in (MANIFEST, LOCK)
            or v.name.startswith(("results", "sweep_"))
        ):
            raise ConfigError(
                f"variant name {v.name!r}: must be a folder name of letters, digits and "
                "_ . , = + - other than sweep.json, results.* and sweep_*"
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
    output_folder(d, "--dir")  # not a file, nor below one, nor a run directory
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
