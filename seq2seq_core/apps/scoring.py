"""`s2s score`'s work: a task named on the command line (a task with its defaults, or a preset's
single task), and its metric over files of output and reference lines. A partial score is no
score: the files must have as many lines; a plugin's answer is checked where it comes in."""

from __future__ import annotations

from ..task import Score


def task_named(name: str, overrides, registry):
    """The task `name` stands for, with the command line's `overrides`: a task's defaults
    (`translation task.tgt_lang=fr`), else a preset's one task; else a ConfigError naming both."""
    from ..data.members import build_task
    from ..errors import ConfigError
    from ..setup.config import load_config, preset_names, single_task

    if name in registry.names():  # the task's defaults, with the overrides (e.g. task.tgt_lang=fr)
        cfg = load_config(None, [f"task.name={name}", *overrides], registry=registry)
    elif name in preset_names():
        cfg = single_task(load_config(name, overrides, registry=registry), f"preset {name!r}")
    else:
        raise ConfigError(
            f"{name!r} is neither a task ({', '.join(registry.names())}) nor a preset "
            f"({', '.join(preset_names())})"
        )
    return build_task(cfg.task, registry)


def score_files(task, ref, hyp, src=None) -> Score:
    """`task`'s score of the lines of `hyp` against those of `ref` (with the source lines of
    `src`, for a metric that reads them); a DataError when the two files differ in length."""
    from .. import textio
    from ..errors import DataError
    from ..task import checked_score

    refs, hyps = textio.read_lines(ref), textio.read_lines(hyp)  # lines end at "\n" only
    srcs = textio.read_lines(src) if src else None
    if len(refs) != len(hyps):
        raise DataError(
            f"{hyp} has {len(hyps)} lines but {ref} has {len(refs)}: a partial score is no score"
        )
    return checked_score(task, task.score(hyps, refs, srcs))  # a plugin's answer, checked
