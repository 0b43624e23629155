"""The end of a run: the model to test, chosen on the dev figure, and each member's test figures.

The candidates are the average of the last run.average_last checkpoints (or, without
averaging, the model as trained) and the best validated model (checkpoint_best.pt); the one
that scores higher on the same dev sentences is tested (section 6.1 averages the last
checkpoints). result.json names it.
"""

from __future__ import annotations

import json

from ..data.members import decode_settings
from ..decode.batched import hypotheses
from ..files import atomic_write_text
from ..nn import precision
from ..task import checked_score
from . import checkpoint


def select(trainer) -> dict:
    """Load the model to test into `trainer.model`; every process takes part (validation is
    shared out). Rank 0 alone reads checkpoints (it averages the last run.average_last, or reads
    the best model) while the others wait (run.wait_minutes), then broadcasts the parameters:
    k checkpoints with their optimiser state are read once, not once per process. Returns what
    result.json records: the checkpoint tested, relative to the run directory, and each
    candidate's dev figure."""
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
    figure = trainer.validated[1] if known else trainer.validate()[1]
    chosen["dev_select"] = {chosen["checkpoint"]: figure}
    best = trainer.best  # a candidate unless it is the model as trained
    if (
        best is not None
        and (averaged or best["update"] != trainer.update)
        and (run_dir / checkpoint.BEST).is_file()
    ):
        chosen["dev_select"][checkpoint.BEST] = best["select"]
        chosen["best_update"] = best["update"]
        if best["select"] > figure:

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


def test(trainer, result: dict) -> dict:
    """Decode each member's test split with the selected model (rank 0), write its outputs to
    test{.MEMBER}.hyp.txt, and result.json: the test figures under "test" (a single task) or
    "test" -> member (several)."""
    cfg, run_dir = trainer.cfg, trainer.run_dir
    search_model = precision.for_inference(trainer.model, trainer.search_precision)
    tested = {}
    for m in trainer.members:
        if "test" not in m.data.splits:
            continue
        sources, refs = m.data.texts("test")
        hyps = hypotheses(
            search_model,
            m,
            sources,
            decode_settings(m.task, cfg.decode),
            trainer.device,
            cfg.decode.max_sentences,
        )
        outputs = (m.postprocess(h, s) for h, s in zip(hyps, sources))
        atomic_write_text(run_dir / f"test{m.infix}.hyp.txt", "".join(h + "\n" for h in outputs))
        score = checked_score(m, m.score(hyps, refs, sources))
        tested[m.name] = score.as_dict()
        trainer.record(
            {"kind": "test", "update": trainer.update, f"{m.prefix}{score.name}": score.value}
        )
    if tested:
        result["test"] = tested if trainer.members[0].prefix else next(iter(tested.values()))
    atomic_write_text(run_dir / "result.json", json.dumps(result, indent=1))
    return result
