"""The quickstart: the offline demo trained end to end, its test split decoded by the trained
run, and the score of those outputs next to the copy baseline's (each source line as its own
output). A newcomer's first check that training learns something: the trained score must beat
copying."""

from __future__ import annotations

import time
from dataclasses import dataclass

from ..data.members import decode_settings
from ..data.nodes import prepare_data
from ..decode.batched import Decoder
from ..inference import load_for_inference
from ..contract.task import Score
from ..training.trainer import train


@dataclass(frozen=True)
class QuickstartResult:
    """What the quickstart reached, for `s2s quickstart` to print."""

    mode: str  # the demo's task.mode
    sentences: int  # held-out (test) sentences decoded and scored
    seconds: float  # training, loading, decoding and scoring
    trained: Score  # the trained run's outputs against the references
    baseline: Score  # the sources themselves against the references


def quickstart(cfg, registry, quiet: bool = False) -> QuickstartResult:
    """Train `cfg` (the demo preset with any overrides), load the run as `s2s generate` would,
    decode its test split and score it against the references beside the copy baseline."""
    t0 = time.time()
    train(cfg, registry, quiet=quiet)
    cfg, member, model = load_for_inference(cfg.run.dir, registry)
    sources, refs = prepare_data(member.task, cfg.data, quiet=True).texts("test")
    device = next(model.parameters()).device
    decoder = Decoder(model, member, decode_settings(member, cfg.decode), device)
    hyps = decoder.generate(sources)
    trained = member.score(hyps, refs, sources)
    baseline = member.score(sources, refs, sources)
    return QuickstartResult(
        mode=cfg.task.mode,
        sentences=len(sources),
        seconds=time.time() - t0,
        trained=trained,
        baseline=baseline,
    )
