"""`s2s sweep`: a grid or a list of variants of one preset, each a run directory, resumable,
with one table and one plot per varied setting; every variant checked before any trains."""

import hashlib
import json
import shutil
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from s2s.core.apps.sweep.runner import configs
from s2s.core.apps.sweep.variants import Sweep, read_variants
from s2s.core.apps.cli import build_parser, main
from s2s.core.errors import ConfigError, UsageError
from s2s.core.setup.config import load_config
from s2s.core.runs import checkpoint
from s2s.core.training.trainer import Trainer, train

GRID = ["--grid", "model.heads=1,2"]


def _tiny(cache: Path, *extra: str) -> list[str]:
    """The conftest `tiny` settings (without run.dir: the sweep sets it) on a small demo corpus."""
    return [
        "model.layers=1",
        "model.d_model=32",
        "model.d_ff=64",
        f"data.cache_dir={cache}",
        "task.train_size=400",
        "task.valid_size=20",
        "task.test_size=20",
        "data.max_tokens=600",
        "optim.warmup=5",
        "run.log_interval=5",
        "run.quiet=true",
        "run.threads=1",
        "run.device=cpu",
        *extra,
    ]


def _sweep(directory: Path, cache: Path, *options: str, budget: int = 4, extra=()) -> list[str]:
    return [
        "sweep",
        "demo",
        "-q",
        *(options or GRID),
        "--budget-updates",
        str(budget),
        "--dir",
        str(directory),
        *_tiny(cache, *extra),
    ]


def _digest(path: Path) -> tuple:
    return path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest()


def _files(run_dir: Path) -> dict:
    """mtime and hash of every file of a finished run directory (the lock and marker aside)."""
    return {
        p.relative_to(run_dir): _digest(p)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and p.name not in (".lock", ".s2s-run")
    }


def _model(run_dir: Path) -> dict:
    return checkpoint.load(checkpoint.listed(run_dir)[-1])["model"]


def _same_model(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def grid(tmp_path_factory):
    """A finished tiny grid (model.heads=1,2, 4 updates each), run through the command line."""
    root = tmp_path_factory.mktemp("sweep")
    assert main(_sweep(root / "grid", root / "cache")) == 0
    return root / "grid", root / "cache"


def test_a_tiny_grid_writes_a_row_per_variant_and_a_plot(grid):
    directory, _ = grid
    results = json.loads((directory / "results.json").read_text())
    assert [r["name"] for r in results["rows"]] == ["heads-1", "heads-2"]
    assert results["varied"] == ["model.heads"] and results["metric"] == "bleu"
    for row, heads in zip(results["rows"], (1, 2)):
        assert row["settings"] == {"model.heads": heads}
        assert row["updates"] == 4 and row["params"] > 0
        assert row["dev_ppl"] > 1 and isinstance(row["dev_metric"], float) and "bleu" in row["test"]
        assert (directory / row["name"] / "result.json").is_file()
    table = (directory / "results.md").read_text().splitlines()
    assert table[0].startswith(
        "| variant | model.heads | params | updates | dev ppl | dev bleu | test bleu"
    )
    assert len(table) == 4 and table[2].startswith("| heads-1 | 1 |")
    manifest = json.loads((directory / "sweep.json").read_text())
    assert manifest["budget"] == {"updates": 4} and [v["state"] for v in manifest["variants"]] == [
        "done",
        "done",
    ]
    png = directory / "sweep_model.heads.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread

    pixels = imread(png)
    assert pixels.shape[0] > 100 and pixels[..., :3].std() > 0.05  # drawn on, not blank


def test_the_same_command_after_completion_rewrites_the_table_and_trains_nothing(grid):
    directory, cache = grid
    before = {v: _files(directory / v) for v in ("heads-1", "heads-2")}
    (directory / "results.md").unlink()
    assert main(_sweep(directory, cache)) == 0
    assert (directory / "results.md").is_file()
    assert {v: _files(directory / v) for v in ("heads-1", "heads-2")} == before


@pytest.mark.parametrize("damage", ["[]", '{"update": 4, "test": "x"}', '{"update": 4'])
def test_a_damaged_variant_result_is_tested_again_not_an_internal_error(
    grid, tmp_path, caplog, damage
):
    """A variant's result.json that is not what `s2s train` writes: a warning naming the file,
    the run resumed at its last update and tested again, its checkpoints untouched."""
    directory, cache = grid
    copy = tmp_path / "grid"
    shutil.copytree(directory, copy)
    good = json.loads((copy / "heads-1" / "result.json").read_text())
    checkpoints = _files(copy / "heads-1" / "checkpoints")
    (copy / "heads-1" / "result.json").write_text(damage)
    assert main(_sweep(copy, cache)) == 0
    assert f"{copy / 'heads-1' / 'result.json'}" in caplog.text and "tests it again" in caplog.text
    again = json.loads((copy / "heads-1" / "result.json").read_text())
    assert again["update"] == 4 and again["test"]["bleu"] == good["test"]["bleu"]
    assert _files(copy / "heads-1" / "checkpoints") == checkpoints


@pytest.mark.parametrize(
    "options, budget, named", [(["--grid", "model.heads=1,4"], 4, "variants"), (GRID, 8, "budget")]
)
def test_another_sweep_in_the_same_folder_fails_naming_sweep_json(
    grid, capsys, options, budget, named
):
    directory, cache = grid
    argv = _sweep(directory, cache, *options, budget=budget)
    before = _digest(directory / "sweep.json")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sweep.json" in err and named in err, err
    assert _digest(directory / "sweep.json") == before


def test_print_commands_prints_train_commands_that_s2s_train_parses(tmp_path, capsys, registry):
    directory = tmp_path / "sw"
    argv = _sweep(
        directory,
        tmp_path / "cache",
        "--grid",
        "model.heads=1,2",
        "--grid",
        "model.dropout=0,0.1",
        extra=["task.seed=3"],
    )
    assert main([*argv, "--print-commands"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4 and not directory.exists()  # runs nothing, writes nothing
    dirs = set()
    for line in lines:
        words = shlex.split(line)
        assert words[:3] == ["s2s", "train", "demo"]
        args = build_parser().parse_args(words[1:])
        cfg = load_config(args.preset, args.overrides, registry=registry)
        assert (
            cfg.optim.max_updates == 4
            and cfg.task.seed == 3
            and Path(cfg.run.dir).parent == directory
        )
        dirs.add((cfg.model.heads, cfg.model.dropout, Path(cfg.run.dir).name))
    assert {d[:2] for d in dirs} == {(1, 0.0), (1, 0.1), (2, 0.0), (2, 0.1)} and len(
        {d[2] for d in dirs}
    ) == 4


def test_every_variant_is_checked_before_the_first_trains(tmp_path, capsys):
    directory = tmp_path / "sw"
    assert main(_sweep(directory, tmp_path / "cache", "--grid", "model.heads=1,3")) == 2
    err = capsys.readouterr().err.strip()
    assert "variant heads-3" in err and "model.heads=3" in err and len(err.splitlines()) == 1
    assert not directory.exists()
    assert main(_sweep(directory, tmp_path / "cache", "--grid", "model.haeds=1")) == 2
    assert "'model.haeds'" in capsys.readouterr().err
    assert main(_sweep(directory, tmp_path / "cache", "--grid", "optim.max_updates=5,6")) == 2
    assert "optim.max_updates" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:  # argparse refuses the shape, naming the flag
        main(_sweep(directory, tmp_path / "cache", "--grid", "model.heads"))
    assert refused.value.code == 2 and "argument --grid: takes KEY=V1,V2" in capsys.readouterr().err
    assert main([*_sweep(directory, tmp_path / "cache"), "run.dir=elsewhere"]) == 2
    assert "run.dir" in capsys.readouterr().err
    assert main(_sweep(directory, tmp_path / "cache", budget=0)) == 2
    assert "--budget-updates 0: must be a finite number > 0" in capsys.readouterr().err
    minutes = [
        x if x != "--budget-updates" else "--budget-minutes"
        for x in _sweep(directory, tmp_path / "cache")
    ]
    minutes[minutes.index("--budget-minutes") + 1] = "inf"
    assert main(minutes) == 2
    assert "--budget-minutes inf: must be a finite number > 0" in capsys.readouterr().err
    assert not directory.exists()
    directory.mkdir()
    (directory / "notes.txt").write_text("mine")
    assert main(_sweep(directory, tmp_path / "cache")) == 2
    assert "notes.txt" in capsys.readouterr().err and sorted(os.listdir(directory)) == ["notes.txt"]


def test_a_variant_whose_dev_pairs_do_not_fit_stops_the_sweep_before_any_trains(tmp_path, capsys):
    """The checks `s2s train` makes before training (here: dev pairs against
    model.max_positions) run for every variant first: nothing trains, the pair is quoted."""
    directory = tmp_path / "sw"
    grid = ["--grid", "model.max_positions=64,8"]
    argv = _sweep(directory, tmp_path / "cache", *grid, extra=["data.max_len=8"])
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "variant max_positions-8: valid split, the pair '" in err
    assert "do not fit model.max_positions=8" in err
    assert not any(directory.glob("*/checkpoints"))


def test_a_variants_file_names_and_nests_overrides(tmp_path, registry):
    path = tmp_path / "variants.yaml"
    path.write_text(
        "- name: base\n- {model.heads: 1, model.pre_norm: true}\n"
        "- model: {dropout: 0.0}\n  optim: {label_smoothing: 0}\n"
    )
    variants = read_variants(path)
    assert [v.name for v in variants] == [
        "base",
        "heads-1_pre_norm-true",
        "dropout-0.0_label_smoothing-0",
    ]
    assert variants[1].overrides == ["model.heads=1", "model.pre_norm=true"]
    assert variants[2].overrides == ["model.dropout=0.0", "optim.label_smoothing=0"]
    plan = Sweep("demo", variants, {"minutes": 2.5}, tmp_path / "sw")
    cfgs = configs(plan, registry)
    assert cfgs[0].run.max_minutes == 2.5 and cfgs[0].optim.max_updates == 10_000_000
    assert cfgs[1].model.pre_norm is True and cfgs[2].model.dropout == 0.0
    path.write_text("- name: a\n- name: a\n  model.heads: 1\n")
    with pytest.raises(ConfigError, match="variants.yaml.*'a'"):
        read_variants(path)
    path.write_text("model.heads: 1\n")
    with pytest.raises(ConfigError, match="variants.yaml: must be a YAML list"):
        read_variants(path)
    with pytest.raises(UsageError, match="nothing.yaml: no such file"):
        read_variants(tmp_path / "nothing.yaml")


def test_a_sweep_stopped_mid_variant_resumes_it_bitwise_and_skips_the_finished_one(
    tmp_path, monkeypatch, registry
):
    """Stop the second variant after its checkpoint of update 4 (as a kill would), run the same
    command again: the first is untouched, the second ends equal to a run never stopped."""
    directory, cache = tmp_path / "sw", tmp_path / "cache"
    argv = _sweep(
        directory, cache, budget=10, extra=["run.save_interval=4", "run.valid_interval=5"]
    )
    step = Trainer.step

    def stopping_step(self, *args, **kwargs):
        if self.run_dir.name == "heads-2" and self.update == 6:
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "step", stopping_step)
    assert main(argv) == 130
    monkeypatch.setattr(Trainer, "step", step)
    assert [p.name for p in checkpoint.listed(directory / "heads-2")] == ["checkpoint_00000004.pt"]
    assert not (directory / "heads-2" / "result.json").exists()
    states = [v["state"] for v in json.loads((directory / "sweep.json").read_text())["variants"]]
    assert states == ["done", "running"]
    first = _files(directory / "heads-1")
    assert main(argv) == 0
    assert _files(directory / "heads-1") == first
    assert json.loads((directory / "heads-2" / "result.json").read_text())["update"] == 10
    cfg = load_config(
        "demo",
        [
            *_tiny(cache, "run.save_interval=4", "run.valid_interval=5"),
            "model.heads=2",
            "optim.max_updates=10",
            f"run.dir={tmp_path / 'never_stopped'}",
        ],
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    assert _same_model(_model(directory / "heads-2"), _model(tmp_path / "never_stopped"))


@pytest.mark.slow
def test_a_sigkilled_sweep_process_resumes(tmp_path, registry):
    """SIGKILL `python -m s2s.core.apps.cli sweep` once the first variant is finished and the second
    has a checkpoint; the same command finishes it, equal to a run never stopped."""
    directory, cache = tmp_path / "sw", tmp_path / "cache"
    extra = ["run.save_interval=5", "run.valid_interval=100", "run.log_interval=1"]
    cmd = [
        sys.executable,
        "-m",
        "s2s.core.apps.cli",
        *_sweep(directory, cache, budget=200, extra=extra),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "sweep.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if (directory / "heads-1" / "result.json").is_file() and checkpoint.listed(
            directory / "heads-2"
        ):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "sweep.log").read_text()[-3000:]
    assert not (directory / "heads-2" / "result.json").exists(), (
        "the second variant finished before the kill"
    )
    first = _files(directory / "heads-1")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| heads-2 | 2 |" in done.stdout
    assert _files(directory / "heads-1") == first
    cfg = load_config(
        "demo",
        [
            *_tiny(cache, *extra),
            "model.heads=2",
            "optim.max_updates=200",
            f"run.dir={tmp_path / 'never_stopped'}",
        ],
        registry=registry,
    )
    train(cfg, registry, quiet=True)
    assert _same_model(_model(directory / "heads-2"), _model(tmp_path / "never_stopped"))


def test_seeds_train_each_variant_several_times_and_report_their_spread(tmp_path, capsys):
    """--seeds 2: each variant twice (run.seed 1 and 2, NAME/seed1 and NAME/seed2), a row with
    the seeds' mean and standard deviation and the pooled test interval; the same command again
    trains nothing; run.seed is the sweep's to set."""
    directory, cache = tmp_path / "seeds", tmp_path / "cache"
    argv = _sweep(directory, cache, "--grid", "model.heads=1,2", "--seeds", "2")
    assert main(argv) == 0
    capsys.readouterr()
    results = json.loads((directory / "results.json").read_text())
    assert results["seeds"] == 2
    for row in results["rows"]:
        runs = row["seed_runs"]
        assert [Path(r["run_dir"]).name for r in runs] == ["seed1", "seed2"]
        values = [r["test"]["bleu"] for r in runs]
        assert row["test"]["bleu"] == pytest.approx(sum(values) / 2)
        if values[0] != values[1]:
            assert row["test_sd"]["bleu"] > 0
        interval = row["pooled_interval"]["bleu"]
        assert interval["low"] <= interval["value"] <= interval["high"]
        configs = [json.loads((Path(r["run_dir"]) / "result.json").read_text()) for r in runs]
        assert all(c["update"] == 4 for c in configs)
    config = (directory / "heads-1" / "seed2" / "config.yaml").read_text()
    assert "seed: 2" in config
    table = (directory / "results.md").read_text()
    assert "±" in table and "pooled test bleu [95%]" in table and "2 seeds a variant" in table
    before = _files(directory / "heads-1" / "seed2")
    assert main(argv) == 0  # resumes: both finished, nothing trained again
    assert _files(directory / "heads-1" / "seed2") == before
    capsys.readouterr()
    for bad, needle in [
        (["--seeds", "0"], "--seeds 0: from 1 to 100"),
        (["--seeds", "2", "run.seed=3"], "common override run.seed"),
    ]:
        code = main(_sweep(tmp_path / "bad", cache, "--grid", "model.heads=1,2", *bad))
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and needle in err[0], err


def test_a_sweep_resumed_with_other_settings_and_one_value_twice_are_refused(tmp_path, capsys):
    """The manifest records each run's settings as loaded: a resume after the preset file was
    edited is refused naming the setting; two spellings of one value (2 and 02) are one
    variant, refused before any training (issue 43)."""
    preset = tmp_path / "mine.yaml"
    preset.write_text((Path(__file__).resolve().parents[3] / "tasks" / "demo.yaml").read_text())
    directory, cache = tmp_path / "sweep", tmp_path / "cache"
    argv = _sweep(directory, cache, "--grid", "model.heads=1,2")
    argv[1] = str(preset)
    assert main(argv) == 0
    capsys.readouterr()
    manifest = json.loads((directory / "sweep.json").read_text())
    assert manifest["resolved"]["heads-1"]["model.heads"] == 1
    preset.write_text(preset.read_text().replace("dropout: 0.1", "dropout: 0.2"))
    before = _files(directory)
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "model.dropout was 0.1, now 0.2" in err[0], err
    assert _files(directory) == before
    code = main(_sweep(tmp_path / "twice", cache, "--grid", "model.heads=2,02"))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "have the same settings" in err[0], err
    assert not (tmp_path / "twice" / "heads-2").exists()


def test_metrics_get_their_own_columns_and_no_folder_or_empty_budget_is_adopted(tmp_path, capsys):
    """Variants of different metrics (the demo translated: bleu; parsed: f1) each get their own
    dev column; a folder of the user's bearing a variant's name is not adopted as its result;
    a budget that trains no update is refused, not reported (issue 43)."""
    cache = tmp_path / "cache"
    directory = tmp_path / "modes"
    assert main(_sweep(directory, cache, "--grid", "task.mode=translate,parse")) == 0
    capsys.readouterr()
    head = (directory / "results.md").read_text().splitlines()[0]
    assert "| dev bleu | dev f1 |" in head, head
    rows = json.loads((directory / "results.json").read_text())["rows"]
    assert [r["dev_name"] for r in rows] == ["bleu", "f1"]
    mine = tmp_path / "mine"
    (mine / "heads-1").mkdir(parents=True)
    (mine / "heads-1" / "result.json").write_text('{"update": 4, "test": {"bleu": 99.0}}')
    before = _files(mine)
    assert main(_sweep(mine, cache)) == 2
    assert "holds files s2s sweep did not write (heads-1)" in capsys.readouterr().err
    assert _files(mine) == before
    tiny = [x for x in _sweep(tmp_path / "tiny", cache)]
    tiny[tiny.index("--budget-updates") : tiny.index("--budget-updates") + 2] = [
        "--budget-minutes",
        "0.000001",
    ]
    assert main(tiny) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "variant heads-1 trained no update in it" in err[-1], err
    manifest = json.loads((tmp_path / "tiny" / "sweep.json").read_text())
    assert manifest["variants"][0]["state"] != "done"


def test_a_sweep_over_an_error_rate_ranks_the_lowest_first(tmp_path, capsys, monkeypatch):
    """A grid of the demo with task.metric=ter (better lower), each variant's dev TER scripted
    (heads 1: 30, heads 2: 10): heads-2 ranks first, the table's dev column says lower is
    better, and the command names heads-2 the best."""
    import s2s.core.training.trainer as train_module

    real = train_module.evaluate_dev

    def scripted(models, members, group, cfg, update):
        record, _ = real(models, members, group, cfg, update)
        record["select"] = {1: 30.0, 2: 10.0}[cfg.model.heads]
        return record, record["select"]

    monkeypatch.setattr(train_module, "evaluate_dev", scripted)
    directory = tmp_path / "ter"
    assert main(_sweep(directory, tmp_path / "cache", extra=["task.metric=ter"])) == 0
    out = capsys.readouterr().out
    results = json.loads((directory / "results.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    assert results["metric"] == "ter" and results["ranking"] == {"ter": ["heads-2", "heads-1"]}
    assert (rows["heads-2"]["dev_rank"], rows["heads-1"]["dev_rank"]) == (1, 2)
    assert (
        rows["heads-2"]["dev_metric"] == 10.0 and rows["heads-1"]["dev_higher_is_better"] is False
    )
    table = (directory / "results.md").read_text().splitlines()
    assert "| dev ter (lower is better) |" in table[0] and table[0].endswith("| rank (dev) |")
    assert table[2].startswith("| heads-1 |") and table[2].endswith("| 2 |")
    assert "best on dev ter (lower is better): heads-2" in out
