"""What each command that finishes work says at its end, through the real command line: train's
summary (figures with their signature, the chosen checkpoint and why, the files, the next
commands), score's every figure, the files export / plot / attention / sweep wrote by name with
what to do next, and the errors of a `--grid` without its `=` and of a mistyped run directory."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from s2s.core.apps.cli import main
from conftest import ROOT, TINY_MODEL

TINY = [
    *TINY_MODEL,
    "task.train_size=300",
    "task.valid_size=10",
    "task.test_size=10",
    "optim.max_updates=8",
    "optim.warmup=4",
    "run.valid_interval=4",
    "run.save_interval=4",
    "run.average_last=2",
]


def s2s(*argv, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "s2s.core.apps.cli", *map(str, argv)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`s2s train demo` from the shell, tiny: (folder, its stdout)."""
    root = tmp_path_factory.mktemp("ends")
    out = s2s("train", "demo", "-q", *TINY, "run.dir=runs/demo", "data.cache_dir=cache", cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    return root, out.stdout


def test_train_ends_with_a_summary_for_a_person(trained):
    root, out = trained
    lines = out.strip().splitlines()
    assert lines[0] == "trained demo to update 8; run directory runs/demo", out
    result = json.loads((root / "runs/demo/result.json").read_text(encoding="utf-8"))
    chosen = result["checkpoint"]
    assert lines[1].startswith(f"tested {chosen}") and "dev figure" in lines[1], out
    if chosen == "checkpoint_average.pt":
        assert "the average of the last 2 checkpoints" in lines[1]
    # every test figure, one a line, the primary with its 95% interval and its signature
    assert lines[2] == "test figures:"
    interval = r"  \[[\d.]+, [\d.]+\]"
    assert re.match(rf"  bleu +[\d.]+{interval}  \(nrefs:1\|case:mixed\|.*\|version:", lines[3])
    assert re.match(rf"  exact_match +[\d.]+{interval}$", lines[4]), out
    assert (
        "wrote runs/demo/test.hyp.txt, runs/demo/test.ref.txt, runs/demo/test.src.txt, "
        "runs/demo/result.json, runs/demo/metrics.jsonl"
    ) in lines
    assert all(
        (root / "runs/demo" / name).is_file()
        for name in ("test.hyp.txt", "test.ref.txt", "test.src.txt", "result.json", "metrics.jsonl")
    )
    nexts = lines[lines.index("next:") + 1 :]
    assert [line.split()[1] for line in nexts] == [
        "generate",
        "score",
        "plot",
        "export",
        "serve",
    ], out
    assert "{" not in out  # no JSON line for a person


def test_train_json_is_result_json(trained, tmp_path):
    root, _ = trained
    out = s2s(
        "train",
        "demo",
        "-q",
        "--json",
        *TINY,
        "run.dir=runs/demo",
        "data.cache_dir=cache",
        cwd=root,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == json.loads(
        (root / "runs/demo/result.json").read_text(encoding="utf-8")
    )


def test_score_prints_every_figure_of_the_task(tmp_path, capsys):
    (tmp_path / "ref.txt").write_text(
        "Der Hund sieht eine Katze .\nEin Mann läuft .\n", encoding="utf-8"
    )
    (tmp_path / "hyp.txt").write_text(
        "Der Hund sieht die Katze .\nEin Mann läuft .\n", encoding="utf-8"
    )
    argv = ["score", "translation", "--ref", tmp_path / "ref.txt", "--hyp", tmp_path / "hyp.txt"]
    assert main(list(map(str, argv))) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert main([*map(str, argv), "--json"]) == 0
    figures = json.loads(capsys.readouterr().out)
    shown = [k for k in figures if k not in ("signature", "higher_is_better")]
    assert [line.split()[0] for line in lines] == shown
    assert {"bleu", "bleu_tok", "chrf"} <= {line.split()[0] for line in lines}
    assert figures["signature"] in lines[0]
    by_name = {line.split()[0]: line.split()[1] for line in lines}
    assert float(by_name["chrf"]) == figures["chrf"] and float(by_name["bleu"]) == pytest.approx(
        figures["bleu"]
    )


def _written(out: str) -> list[str]:
    """The files a command's `wrote:` block names."""
    lines = out.splitlines()
    start = lines.index("wrote:") + 1
    return [
        line.strip()
        for line in lines[start:]
        if line.startswith("  ") and "/" in line and " " not in line.strip()
    ]


@pytest.mark.parametrize(
    "to, loads", [("safetensors", "load_safetensors("), ("ctranslate2", "ctranslate2.Translator(")]
)
def test_export_says_what_it_wrote_and_how_to_load_it(trained, to, loads):
    pytest.importorskip("ctranslate2") if to == "ctranslate2" else None
    root, _ = trained
    out = s2s("export", "runs/demo", "--to", to, "--output", f"out_{to}", cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    files = _written(out.stdout)
    assert files and all((root / f).is_file() for f in files), out.stdout
    assert sorted(files) == sorted(
        str(p.relative_to(root)) for p in (root / f"out_{to}").rglob("*") if p.is_file()
    )
    assert "load it in Python with:" in out.stdout and loads in out.stdout


def test_plot_and_attention_name_their_files(trained):
    root, _ = trained
    out = s2s("plot", "runs/demo", cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    plots = _written(out.stdout)
    assert "runs/demo/plots/loss.png" in plots and all((root / p).is_file() for p in plots)
    assert "image viewer" in out.stdout
    (root / "src.txt").write_text("the dog sees a cat\n", encoding="utf-8")
    out = s2s("attention", "runs/demo", "--input", "src.txt", "--output", "maps", "-q", cwd=root)
    assert out.returncode == 0, out.stderr[-2000:]
    maps = _written(out.stdout)
    assert (
        "maps/1.json" in maps
        and any(m.endswith(".png") for m in maps)
        and all((root / m).is_file() for m in maps)
    )
    assert "docs/attention.md" in out.stdout


def test_sweep_names_its_plots(tmp_path):
    common = [o for o in TINY if not o.startswith(("optim.", "run.valid", "run.save"))]
    out = s2s(
        "sweep",
        "demo",
        "-q",
        *common,
        "optim.warmup=2",
        "--grid",
        "model.heads=1,2",
        "--budget-updates",
        "2",
        "--dir",
        "sw",
        "data.cache_dir=cache",
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    files = _written(out.stdout)
    assert files == ["sw/results.md", "sw/results.json", "sw/sweep_model.heads.png"], out.stdout
    assert all((tmp_path / f).is_file() for f in files) and "sweep_*" not in out.stdout


def test_a_grid_without_its_equals_sign_names_the_flag_and_its_shape(tmp_path):
    out = s2s(
        "sweep",
        "demo",
        "--grid",
        "model.heads",
        "1,2",
        "--budget-updates",
        "2",
        "--dir",
        "sw",
        cwd=tmp_path,
    )
    assert out.returncode == 2
    assert (
        "argument --grid: takes KEY=V1,V2 (e.g. --grid model.heads=1,2), got 'model.heads'"
        in out.stderr
    )
    assert "unrecognized arguments" not in out.stderr and not (tmp_path / "sw").exists()


def test_a_mistyped_run_directory_gets_did_you_mean(trained):
    root, _ = trained
    for argv in (
        ["generate", "runs/demoo"],
        ["export", "runs/demoo", "--to", "safetensors", "--output", "x"],
        ["plot", "runs/dem"],
        ["average", "runs/demoo", "--last", "2"],
        ["serve", "runs/Demo"],
    ):
        out = s2s(*argv, cwd=root)
        assert out.returncode == 2, argv
        assert (
            f"{argv[1]}: no such run directory" in out.stderr
            and "(did you mean runs/demo?)" in out.stderr
        ), out.stderr
        assert "Traceback" not in out.stderr


def test_the_skips_are_counted_by_cause():
    """The suite's last lines count every skip under its cause: test_gpu.py's without a GPU."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("needs a CUDA device to be missing")  # then test_gpu.py runs
    root = ROOT
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/core/nn/test_gpu.py",
        ],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    skipped = int(re.search(r"(\d+) skipped", out.splitlines()[-1]).group(1))
    assert f"{skipped} skipped, by cause (-rs lists each):" in out
    assert re.search(
        rf"^ +{skipped}  needs a CUDA device: the -m gpu tests; `bash bench/training/gpu_check.sh`",
        out,
        re.M,
    ), out
