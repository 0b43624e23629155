"""EVALB conformance: every figure EVALB (COLLINS.prm) printed for tests/data/evalb_cases."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf
from s2s.core.errors import DataError
from s2s.plugins.parsing import ParsingTask
from s2s.plugins.parsing.evalb import SHORT_FIELDS, evalb, evalb_files, read_tree
from conftest import ROOT

CASES = ROOT / "tests" / "data" / "evalb_cases"  # public test files, in the repository
EXPECTED = json.loads((CASES / "expected.json").read_text())


def _lines(name: str) -> list[str]:
    return (CASES / name).read_text(encoding="utf-8").splitlines()


def _close(got, want, what: str) -> None:
    if isinstance(want, int) and not isinstance(want, bool) and isinstance(got, int):
        assert got == want, what
    else:
        assert abs(got - want) <= 0.01 + 1e-9, f"{what}: EVALB {want}, here {got}"


@pytest.mark.parametrize("case", sorted(EXPECTED["cases"]))
def test_every_figure_of_every_case(case):
    want = EXPECTED["cases"][case]
    result = evalb_files(CASES / EXPECTED["gold"], CASES / case)
    for key, value in want["summary"].items():
        _close(result.summary[key], value, f"{case} {key}")
    for key, value in want["summary_len_le_40"].items():
        _close(result.summary_len_le_40[key], value, f"{case} {key} (length <= 40)")
    for key, value in want["printed"].items():
        got = result.summary[key]
        assert (str(got) if isinstance(got, int) else f"{got:.2f}") == value, (
            f"{case} {key} as printed"
        )
    assert result.messages == want["evalb_messages"]
    for row, got in zip(want["sentences"], result.sentences):
        assert (got.id, got.length, got.status) == (row["id"], row["length"], row["status"]), case
        if row["status"] == 0:
            assert (got.matched, got.gold, got.test, got.crossing, got.words, got.correct_tags) == (
                row["matched"],
                row["gold"],
                row["test"],
                row["crossing"],
                row["words"],
                row["correct_tags"],
            ), f"{case} line {row['id']}"


def _task() -> ParsingTask:
    return ParsingTask(OmegaConf.structured(ParsingTask.Config))


@pytest.mark.parametrize("case", ["test_mixed.txt", "test_placeholder_tags.txt"])
def test_task_score_reports_evalb_figures(case):
    want = EXPECTED["cases"][case]
    score = _task().score(_lines(case), _lines(EXPECTED["gold"]))  # no vocabulary needed
    figures = score.as_dict()
    assert score.name == "f1"
    for key, value in want["summary"].items():
        _close(figures[key], value, f"{case} {key}")
    for key in SHORT_FIELDS:
        _close(
            figures[f"{key}_len_le_40"], want["summary_len_le_40"][key], f"{case} {key}_len_le_40"
        )
    assert figures["repaired"] == 0
    assert f"errors {want['summary']['error_sentences']}" in score.signature
    assert f"skipped {want['summary']['skipped_sentences']}" in score.signature


def test_cli_score_prints_one_json_object(capsys):
    from s2s.core.apps.cli import main

    rc = main(
        [
            "score",
            "parsing",
            "--ref",
            str(CASES / "gold.txt"),
            "--hyp",
            str(CASES / "test_mixed.txt"),
            "--json",
        ]
    )
    out = json.loads(capsys.readouterr().out)
    want = EXPECTED["cases"]["test_mixed.txt"]["summary"]
    assert rc == 0
    for key in (
        "f1",
        "precision",
        "recall",
        "complete_match",
        "tagging_accuracy",
        "matched_brackets",
        "gold_brackets",
        "test_brackets",
        "error_sentences",
        "skipped_sentences",
    ):
        _close(out[key], want[key], key)


def test_different_numbers_of_trees_is_an_error():
    gold = _lines("gold.txt")
    with pytest.raises(DataError, match="302 gold trees"):
        _task().score(gold[:-1], gold)
    with pytest.raises(ValueError):
        evalb(gold, gold[:10])


def test_inputs_evalb_cannot_score_are_errors_not_crashes():
    gold = "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))"
    tests = [
        "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .))))",  # surplus closer
        "(TOP (S (NP the (NN dog)) (VP (VBZ barks)) (. .)))",  # word outside a pre-terminal
        "(TOP (S (NP (DT The) (NN dog))) (S (VP (VBZ barks))))",  # fine: two phrases under TOP
        "(S (DT The)) (S (NN dog) (VBZ barks))",
    ]  # two trees on a line
    result = evalb([gold] * 4, tests)
    assert [s.status for s in result.sentences] == [1, 1, 0, 1]
    assert result.summary["valid_sentences"] == 1
    assert read_tree("( (S (NN x)))").phrases[-1][0] == ""  # an empty root label is a label


def test_no_valid_sentence_gives_zeros_not_a_division_by_zero():
    result = evalb(["(TOP (S (NN x)))"], [""])
    assert result.summary["skipped_sentences"] == 1
    assert result.summary["f1"] == result.summary["tagging_accuracy"] == 0.0


def test_f1_all_counts_left_out_sentences_as_missed():
    """EVALB's f1 leaves error and skipped sentences out; f1_all counts their gold brackets."""
    from omegaconf import OmegaConf
    from s2s.plugins.parsing import ParsingTask

    task = ParsingTask(OmegaConf.structured(ParsingTask.Config))
    gold = [
        "(TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks))))",
        "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))",
    ]
    assert (
        task.score(gold, gold).value == 100.0 and task.score(gold, gold).figures["f1_all"] == 100.0
    )
    wrong_words = [gold[0], "(TOP (S (NP (NNS Cats)) (VP (VBP bark))))"]  # an error sentence
    for test in (wrong_words, [gold[0], ""]):  # ... and a skipped one
        score = task.score(test, gold)
        assert score.name == "f1" and score.value == 100.0  # s2s score: exactly EVALB
        assert score.figures["error_sentences"] + score.figures["skipped_sentences"] == 1
        assert score.figures["recall_all"] == 50.0 and score.figures["f1_all"] < 100.0
    # over linearised references (training, validation) f1_all is the primary figure
    src = ["The dog barks", "Dogs bark"]
    score = task.score(
        ["(S (NP XX XX )NP (VP XX )VP )S", "(S XX"],
        ["(S (NP XX XX )NP (VP XX )VP )S", "(S (NP XX )NP (VP XX )VP )S"],
        src,
    )
    assert score.name == "f1_all" and score.figures["repaired"] == 1
