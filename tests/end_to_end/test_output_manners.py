"""How s2s's output reads: secondary figures rounded as the primary is (`cer 39.64`), a
validation line that shows them, a command whose reader stops early (`s2s tasks | head`) ending
without a "Broken pipe" error, and the unknown pieces of a word named where a task's tokens are
characters."""

from __future__ import annotations

import subprocess
import sys

from s2s.core import Score
from s2s.core.decode.batched import unknown_words
from s2s.core.setup.config import load_config
from s2s.core.setup.registry import Registry
from s2s.core.training.runlog import shown

from test_hints_run import PLUGIN


def test_secondary_figures_print_rounded():
    score = Score("exact", 12.0, {"cer": 39.6354955164784, "sentences": 300}, "chars")
    assert score.lines() == ["exact      12.00  (chars)", "cer        39.64", "sentences  300"]


def test_a_validation_line_shows_the_secondary_figures():
    record = {
        "kind": "valid",
        "update": 400,
        "loss": 1.23456,
        "nll": 1.1,
        "ppl": 3.0,
        "select": 12.0,
        "exact": 12.0,
        "cer": 39.6354955164784,
        "seconds": 2.5,
    }
    assert shown(record) == (
        "valid update 400: select 12 | exact 12 cer 39.64 loss 1.235 | seconds 2.5"
    )


def test_a_reader_that_stops_early_gets_no_broken_pipe_error():
    proc = subprocess.Popen(
        [sys.executable, "-m", "s2s.core.apps.cli", "tasks"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    proc.stdout.close()  # as `| head` does once it has its lines: s2s writes into a closed pipe
    err = proc.stderr.read()
    assert proc.wait() == 141 and err == ""


def test_unknown_pieces_of_a_character_task_are_named(tmp_path):
    path = tmp_path / "spelled.py"
    path.write_text(PLUGIN)
    registry = Registry.installed([str(path)])
    cfg = load_config(None, ["task.name=spelled"], registry=registry)
    task = registry.get("spelled")(cfg.task)
    task.build_vocab([("the cat sat", "cat the sat")])
    line = "the çat sät"
    (ids,) = task.encode_source([line])
    assert unknown_words(task, line, ids) == ["ç", "ä"]  # not "çat" and "sät"
    # a word-level task still names the whole word
    demo = registry.get("demo")(load_config(None, ["task.name=demo"], registry=registry).task)
    demo.build_vocab([("the cat sat", "cat the sat")])
    (ids,) = demo.encode_source(["the dog sat"])
    assert unknown_words(demo, "the dog sat", ids) == ["dog"]


def test_a_multi_task_run_is_given_only_hints_that_run():
    """A multi-task run's next steps: generate names a member and its test sources; no score
    line (score takes one task) and no export line (the formats take single-task runs)."""
    from pathlib import Path

    from s2s.core.apps.summary import train_lines

    result = {
        "update": 8,
        "checkpoint": "checkpoint_average.pt",
        "averaged": 2,
        "test": {"parse": {"f1": 50.0, "signature": ""}, "translate": {"bleu": 20.0}},
    }
    lines = train_lines(result, Path("runs/mt"), "multitask_demo")
    assert lines[lines.index("next:") + 1 :] == [
        "  s2s generate runs/mt --input runs/mt/test.parse.src.txt --task parse     # or your own "
        "lines",
        "  s2s plot runs/mt     # learning curves as PNG files",
        "  s2s serve runs/mt     # a page and a JSON endpoint on 127.0.0.1:8000",
    ]
