"""The end of a run written: each member's test outputs and figures, and result.json.

`Trainer.select` chooses the model to test on the dev figure: the average of the last
run.average_last checkpoints (or, without averaging, the model as trained) or the best validated
model (checkpoint_best.pt), whichever scores better on the same dev sentences, in the direction
the task's score declares (section 6.1 averages the last checkpoints). `Trainer.test` tests it, each member with `score_test_split`,
and writes result.json, which names it, with `write_result` (`s2s.core.runs.result` reads it
back). These helpers take what they work
on as arguments; the Trainer holds the model and the run's state.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..data.members import Member, decode_settings
from ..decode.batched import Decoder
from ..files import atomic_write_text
from ..contract.resampling import scored
from ..contract.task import Score


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
    """`chosen` (what `Trainer.select` chose) with the test figures `tested` (member name ->
    figures) under "test" (a single task) or "test" -> member (`several`), written to
    RUN_DIR/result.json; returned."""
    if tested:
        chosen["test"] = tested if several else next(iter(tested.values()))
    atomic_write_text(run_dir / "result.json", json.dumps(chosen, indent=1))
    return chosen
