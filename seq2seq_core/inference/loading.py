"""Inference: a trained model from its run directory, and source lines turned into output lines.

`load_for_inference` reads a run directory (or a checkpoint in one) back into the config, the task
and the model. `hypotheses` is what `s2s generate`, validation and test evaluation share: encode the
sources, decode them in batches of similar length with the task's defaults (overridden by the decode
section) and turn ids back into text. `generate` applies the task's post-processing to them
(`s2s generate`); validation and test hand `Task.score` the hypotheses with their sources, so that a
task counts what its post-processing did there, and `postprocess` keeps no state. Input typed by a
person (`s2s generate`, the server) goes through the task's `prepare_source` first
(`prepared_sources`: parsing tokenises raw text); words the vocabulary lacks are named
(`unknown_words`). `load_run` is the public way to a run's model and decoding settings
(docs/export.md uses it).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Sequence

from ..data.members import (
    Member,
    build_members,
    decode_settings,
    load_vocabularies,
    pick,
)
from ..tokenizers.pieces import choose_languages
from ..decode.batched import Decoder, Forced, Output, TargetScore, prepared_sources
from ..decode.sampling import Sampling
from ..decode.search import Wanted
from ..errors import CheckpointError, UsageError
from ..nn import precision
from ..nn.model import Transformer
from ..setup.config import load_config
from ..contract.task import DecodeDefaults, Task
from ..runs import checkpoint
from ..runs.agreement import Read, check_config, check_members
from ..runs.distributed import resolve_device
from ..runs.directory import run_dir_of

log = logging.getLogger("s2s")


def load_for_inference(path: str | Path, registry, overrides=(), task: str | None = None):
    """(cfg, member, model) from a run directory (the checkpoint its run tested) or a checkpoint
    file inside one. The member is the run's task `task` (None: its only one) in the run's id
    space, which `generate` serves as it serves a task; the model is on the configured device,
    in decode.precision, in eval mode."""
    p = Path(path)
    run_dir = run_dir_of(p)
    registry.adopt(checkpoint.task_origins(run_dir), run_dir)  # its tasks, without --plugin
    # checked against today's schema: settings added since the run was trained take their defaults
    cfg = load_config(run_dir / "config.yaml", list(overrides), registry=registry)
    members = build_members(cfg, registry)
    member = pick(members, task)
    if p.is_dir():
        state, p = checkpoint.tested(run_dir)
        if state is None:
            raise CheckpointError(f"{run_dir} holds no checkpoint")
    else:
        state = checkpoint.load(p)
    # the run directory's files must be those the weights were trained with (issue 24)
    read = Read(state, p, run_dir)
    check_config(cfg, members, read, overrides)
    check_members(members, read)
    checkpoint.check_tokenizer_files(state, run_dir, p)
    sizes = load_vocabularies(members, run_dir)  # the run's id space
    choose_languages([m.task for m in members], cfg.decode.src_lang, cfg.decode.tgt_lang)
    model = Transformer(cfg.model, *sizes)
    try:
        model.load_state_dict(state["model"])
    except (RuntimeError, KeyError) as e:
        raise CheckpointError(
            f"the checkpoint in {p} does not fit {run_dir / 'config.yaml'} "
            f"({(str(e).splitlines() or [''])[0]})"
        ) from None
    device = resolve_device(cfg.run.device)
    model.to(device).eval()
    log.info("loaded %s (%s)", p, checkpoint.described(state))
    return (
        cfg,
        member,
        precision.for_inference(model, precision.resolve_search(cfg.decode.precision, device)),
    )


def load_ensemble(paths: Sequence[str | Path], registry, overrides=(), task: str | None = None):
    """(cfg, member, ensemble) of several runs decoded as one (`s2s.core.decode.ensemble`):
    the first run's config and member; each model loaded as `load_for_inference` loads it, in
    its own precision. Runs whose member (task, tokenisation), whose languages (the task's
    `*_lang` settings: a model and its reverse may share one vocabulary) or whose source or
    target ids differ from the first's are refused in one line naming both; shapes may differ."""
    from ..decode.ensemble import Ensemble

    loaded = [load_for_inference(p, registry, overrides, task) for p in paths]
    cfg, member, _ = loaded[0]
    for path, (_, other, _) in zip(paths[1:], loaded[1:]):
        problem = _differs(member, other)
        if problem:
            raise CheckpointError(
                f"cannot ensemble {path} with {paths[0]} (the first): {problem}; an "
                "ensemble's models must read and write the same ids"
            )
    return cfg, member, Ensemble([model for _, _, model in loaded])


def _differs(first: Member, other: Member) -> str | None:
    """How the other run's member differs from the first's in what an ensemble needs alike
    (the task, its vocabularies, their place among the run's ids), or None."""
    if (first.name, first.task.name) != (other.name, other.task.name):
        return (
            f"it decodes task {other.name!r} ({other.task.name}), the first {first.name!r} "
            f"({first.task.name})"
        )
    for key in sorted(k for k in first.task.cfg if str(k).endswith("_lang")):
        ours, theirs = first.task.cfg.get(key), other.task.cfg.get(key)
        if ours != theirs:  # the same vocabulary read in another direction (a reverse import)
            return f"its task.{key} is {theirs!r}, the first's {ours!r}"
    for side in ("source", "target"):
        a = first.task.src_vocab if side == "source" else first.task.tgt_vocab
        b = other.task.src_vocab if side == "source" else other.task.tgt_vocab
        if len(a) != len(b):
            return f"its {side} vocabulary has {len(b)} ids, the first's {len(a)}"
        for i in range(len(a)):
            if a.decode([i]) != b.decode([i]):
                return (
                    f"the {side} vocabularies differ at id {i} ({b.decode([i])!r} in it, "
                    f"{a.decode([i])!r} in the first)"
                )
    if first.ids != other.ids or first.tgt_vocab != other.tgt_vocab:
        return "its other members place this task's ids elsewhere"
    return None


@dataclasses.dataclass(frozen=True)
class Run:
    """A trained run ready to decode: what `load_run` returns."""

    cfg: object  # the run's config (with the overrides)
    member: (
        Member  # the run's task (of a multi-task run: the member asked for) in the run's id space
    )
    model: Transformer  # on cfg.run.device, in decode.precision, in eval mode
    # beam, alpha, max_len_a, max_len_b, stop: the task's defaults with the decode section's
    settings: DecodeDefaults

    @property
    def task(self) -> Task:
        """The task itself: its tokenisation (`prepare_source`, `encode_source`), its
        `tokenizers()`."""
        return self.member.task

    def max_length(self, source_tokens: int) -> int:
        """The most target tokens `s2s generate` writes (before its </s>) for a source of
        `source_tokens` ids (its </s> included): int(max_len_a * n + max_len_b), at most
        model.max_positions - 1."""
        n = int(self.settings.max_len_a * source_tokens + self.settings.max_len_b)
        return max(0, min(n, self.model.max_positions - 1))

    @property
    def decoder(self) -> Decoder:
        """The run's model searched with its member's settings, on the model's device."""
        return decoder_of(self.cfg, self.member, self.model)

    def generate(self, lines: Sequence[str]) -> list[str]:
        """`s2s generate`'s output lines for input lines (raw text, prepared by the task)."""
        return [first.text for first, *_ in self.outputs(lines)]

    def outputs(
        self,
        lines: Sequence[str],
        n: int = 1,
        sampling: Sampling | None = None,
        prefixes: Sequence[str] | None = None,
        terms: Sequence[tuple[str, str]] | None = None,
        mbr: str | None = None,
        mbr_method: str = "pairwise",
    ) -> list[list[Output]]:
        """Every input line's outputs, best first, post-processed, each with its search score:
        the n best of the beam (n at most the beam), or n drawn with `sampling`; with
        `prefixes` (one a line, "" for none) each output starts with its line's prefix; with
        `terms` ((source term, target term) pairs, as `--terms` reads them) every output of a
        line that holds a source term holds its target term (not with `sampling`); with `mbr`
        (chrf, bleu, task) ranked by their expected utility against each other (minimum Bayes risk),
        computed by `mbr_method` (pairwise: exact; aggregate: reference aggregation). What the
        command line and the server refuse is a UsageError naming the setting, prefix or term:
        settings out of range (`Wanted.problem`), prefixes and terms that cannot be used
        (`decode.given`), terms with sampling."""
        from ..decode.given import checked_terms, prefix_problem

        wanted = Wanted(n, sampling, mbr=mbr, mbr_method=mbr_method)
        problem = wanted.problem(self.settings.beam)
        if problem:
            raise UsageError(problem)
        if terms and sampling is not None:
            from ..decode.terminology import SAMPLING_REFUSED

            raise UsageError(f"sampling with terms: {SAMPLING_REFUSED}")
        sources = prepared_sources(self.member, lines)
        if prefixes is not None:
            if len(prefixes) != len(lines):
                raise UsageError(f"{len(prefixes)} prefixes for {len(lines)} lines: one a line")
            for i, (source, prefix) in enumerate(zip(sources, prefixes)):
                problem = prefix_problem(
                    self.member, source, prefix, self.settings, self.model.max_positions
                )
                if problem:
                    raise UsageError(f"prefixes[{i}]: {problem}")
        spelled = None
        if terms:
            from ..decode.terminology import line_terms

            pairs = checked_terms(self.member, list(terms), lambda i: f"terms[{i}]")
            found = line_terms(self.member, sources, pairs)
            spelled = [[spellings for _, _, spellings in here] for here in found]
        return self.decoder.outputs(sources, wanted, Forced(prefixes, spelled))

    def score(
        self, lines: Sequence[str], targets: Sequence[str], searched: bool = False
    ) -> list[TargetScore]:
        """The model's log-probability of each target line after its input line (raw text):
        each token's, their sum, and the sum over the search's length penalty. A target is read
        as the model writes it (`decode.given.model_targets`: a parser's tree linearised, so
        that an output's score is its `logprob` in `--json`); one that is no output of the task
        or holds a special token is a UsageError naming it. `searched`: the targets are a search's
        outputs (`s2s rerank`'s candidates), whose <unk> is the model's own unknown token, scored
        as such, not refused as a special token a user typed."""
        from ..decode.given import model_targets

        sources = prepared_sources(self.member, lines)
        given = model_targets(
            self.member, sources, list(targets), lambda i: f"targets[{i}]", unknown=searched
        )
        return self.decoder.target_scores(sources, self.member.encode_target(given))


def decoder_of(cfg, member, model) -> Decoder:
    """The model searched with the member's decoding settings (the task's, with what the run's
    decode section sets), on the model's device."""
    device = next(model.parameters()).device
    settings = decode_settings(member, cfg.decode)
    return Decoder(model, member, settings, device, cfg.decode.max_sentences)


def load_run(
    path: str | Path | Sequence[str | Path],
    overrides: Sequence[str] = (),
    task: str | None = None,
    plugins: Sequence[str] = (),
) -> Run:
    """The run at `path` (a run directory of `s2s train`, or a checkpoint file in one) as
    `s2s generate PATH key=value ...` loads it: the checkpoint the run tested, the config with
    `overrides` (e.g. "decode.beam=1", "run.device=cpu"), the member `task` of a multi-task run,
    tasks registered by the installed plugins and `plugins` (as --plugin takes them). A list of
    paths is an ensemble (`load_ensemble`), as `s2s generate PATH --ensemble OTHER ...`."""
    from ..setup.registry import Registry

    registry = Registry.installed(list(plugins))
    if isinstance(path, (str, Path)):
        cfg, member, model = load_for_inference(path, registry, overrides, task)
    else:
        cfg, member, model = load_ensemble(list(path), registry, overrides, task)
    return Run(cfg, member, model, decode_settings(member, cfg.decode))
