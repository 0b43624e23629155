"""The end of a run: the model to test chosen on dev, tested, and result.json written.

`select` chooses the model to test on the dev figure: the average of the last run.average_last
checkpoints (or, without averaging, the model as trained) or the best validated model
(checkpoint_best.pt), whichever scores better on the same dev sentences, in the direction the
task's score declares (section 6.1 averages the last checkpoints). `test` tests it, each member
with `score_test_split`, and writes result.json, which names it, with `write_result`
(`s2s.core.runs.result` reads it back). `select` and `test` work on the Trainer's model and the
counters of its run (`Trainer.finish` calls them); the helpers take what they work on as
arguments.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..contract.resampling import scored
from ..contract.task import Score, better
from ..data.members import Member, decode_settings
from ..decode.batched import Decoder
from ..files import atomic_write_text
from ..nn import precision
from ..runs import checkpoint
from .validation import bounds


def score_test_split(search_model, member: Member, decode, device, run_dir: Path) -> Score | None:
    """Decode `member`'s test split with `search_model` as the decode section `decode` says,
    write its outputs to RUN_DIR/test{.MEMBER}.hyp.txt, beside them the split's sources and
    references (test{.MEMBER}.src.txt, .ref.txt: what `s2s generate` and `s2s score` take, for a
    task whose data its plugin makes), and return their score, each figure with its 95% interval
    (`s2s.core.contract.resampling`, the defaults); None when the member has no test split."""
    if "test" not in member.data.splits:
        return None
    sources, refs = member.data.texts("test")
    settings = decode_settings(member.task, decode)
    hyps = Decoder(search_model, member, settings, device, decode.max_sentences).generate(
        sources, postprocess=False
    )
    outputs = (member.postprocess(h, s) for h, s in zip(hyps, sources))
    atomic_write_text(run_dir / f"test{member.infix}.hyp.txt", "".join(h + "\n" for h in outputs))
    for kind, lines in (("src", sources), ("ref", refs)):
        atomic_write_text(
            run_dir / f"test{member.infix}.{kind}.txt", "".join(f"{x}\n" for x in lines)
        )
    return scored(member, hyps, refs, sources)  # with 95% intervals where the task can give them


def write_result(run_dir: Path, chosen: dict, tested: dict, several: bool) -> dict:
    """`chosen` (what `select` chose) with the test figures `tested` (member name ->
    figures) under "test" (a single task) or "test" -> member (`several`), written to
    RUN_DIR/result.json; returned."""
    if tested:
        chosen["test"] = tested if several else next(iter(tested.values()))
    atomic_write_text(run_dir / "result.json", json.dumps(chosen, indent=1))
    return chosen


def select(trainer) -> dict:
    """Load the model to test into `trainer.model`: the average of the last run.average_last
    checkpoints (or, without averaging, the model as trained) or the best validated model
    (checkpoint_best.pt), whichever has the better dev figure, in the direction the task's
    score declares (section 6.1 averages the last checkpoints). Every process takes part
    (validation is shared out); rank 0 alone reads checkpoints while the others wait
    (run.wait_minutes), then broadcasts the parameters: k
    checkpoints with their optimiser state are read once, not once per process. Returns
    what result.json records: the checkpoint tested, relative to the run directory, and
    each candidate's dev figure."""
    run_dir, k = trainer.run_dir, trainer.cfg.run.average_last
    paths = checkpoint.listed(run_dir)
    averaged = k > 1 and len(paths) > 1
    if averaged:

        def average():
            avg = checkpoint.average(paths[-k:])
            checkpoint.atomic_save(avg, run_dir / checkpoint.AVERAGE)
            trainer.model.load_state_dict(avg["model"])
            return len(avg["averaged"])

        n = trainer.write(average, str(run_dir / checkpoint.AVERAGE), "the checkpoints are intact")
        _broadcast_model(trainer)
        chosen = {"checkpoint": checkpoint.AVERAGE, "averaged": n}
    else:  # the model as trained, which the last save wrote
        chosen = {"checkpoint": str(paths[-1].relative_to(run_dir)) if paths else None}
    known = (
        not averaged and trainer.validated is not None and trainer.validated[0] == trainer.update
    )
    if known:
        figure, higher = trainer.validated[1:]
    else:
        record, figure = trainer.validate()
        higher = record.get("select_higher_is_better", True)
    chosen["dev_select"] = {chosen["checkpoint"]: figure}
    chosen["select_higher_is_better"] = higher
    # a candidate unless it is the model as trained, or its figure is of another direction
    best = trainer.best
    if (
        best is not None
        and best.get("higher_is_better", True) == higher
        and (averaged or best["update"] != trainer.update)
        and (run_dir / checkpoint.BEST).is_file()
    ):
        chosen["dev_select"][checkpoint.BEST] = best["select"]
        chosen["best_update"] = best["update"]
        if better(best["select"], figure, higher):

            def read_best():
                trainer.model.load_state_dict(checkpoint.load(run_dir / checkpoint.BEST)["model"])

            trainer.group.agreed(read_best, rank0_only=True)
            _broadcast_model(trainer)
            chosen["checkpoint"] = checkpoint.BEST
    return chosen


def _broadcast_model(trainer) -> None:
    """Rank 0's parameters and buffers into every process's model."""
    model = trainer.model
    trainer.group.broadcast([t.detach() for t in (*model.parameters(), *model.buffers())])


def test(trainer, chosen: dict) -> dict:
    """Decode each member's test split with the model in `trainer.model` (the selected one), write
    its outputs to test{.MEMBER}.hyp.txt and record its figure at the update of the model
    tested; then result.json: `chosen`
    (what `select` returned) with the test figures (`write_result`). Rank 0's."""
    search_model = precision.for_inference(trainer.model, trainer.search_precision)
    # the update of the model tested: the best validated one's, else the last (the average
    # of the checkpoints up to it, or the model as trained)
    update = (
        chosen["best_update"] if chosen.get("checkpoint") == checkpoint.BEST else trainer.update
    )
    tested = {}
    for m in trainer.members:
        score = score_test_split(
            search_model, m, trainer.cfg.decode, trainer.device, trainer.run_dir
        )
        if score is None:
            continue
        tested[m.name] = score.as_dict()
        figures = {score.name: score.value, **bounds(score)}
        trainer.record(
            {
                "kind": "test",
                "update": update,
                **{f"{m.prefix}{k}": v for k, v in figures.items()},
            }
        )
    return write_result(trainer.run_dir, chosen, tested, bool(trainer.members[0].prefix))
