"""Batched decoding, shared by validation, the test at the end of a run, `s2s generate` and the
server: a `Decoder` (a model, its task and settings, the device) encodes source lines with the
task, searches them in batches of similar length and decodes them back to text (`candidates`),
post-processed (`outputs`); `generate` is the single best of either, as `Run.generate` is.
A caller may want the n best or drawn samples (`Wanted`), or outputs that start with a given
prefix or hold given terms (`Forced`; `given` checks them). Input typed by a person goes
through the task's `prepare_source` first (`prepared_sources`); words the vocabulary lacks are
named (`unknown_words`). `Decoder.target_scores` is the model's log-probability of given outputs
(reranking, rating references).
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Sequence

import torch

from ..data.batches import chunks
from ..errors import UsageError, plugin_error
from ..contract.task import DecodeDefaults, Task, checked_score
from ..tokenizers import BOS, EOS, PAD, UNK
from ..tokenizers.pieces import start_ids
from .constraints import Prefix, joined
from .mbr import expected_figures, expected_utilities
from .terminology import SAMPLING_REFUSED, Terms, word_glue
from .search import Wanted, nbest, sentences_per_batch, sentences_per_search
from .steps import penalty

log = logging.getLogger("s2s")


def source_batch(ids: Sequence[Sequence[int]]) -> torch.Tensor:
    """Source rows as the model takes them: ids + EOS, right-padded with PAD, [B, S]."""
    src = torch.full((len(ids), max(map(len, ids)) + 1), PAD, dtype=torch.long)
    for row, seq in enumerate(ids):
        src[row, : len(seq) + 1] = torch.tensor(list(seq) + [EOS])
    return src


def prepared_sources(task: Task, lines: Sequence[str]) -> list[str]:
    """Input lines as the task's sources (`Task.prepare_source`: parsing tokenises raw text);
    `task` is a task or a run's member, which serves as one."""
    out = task.prepare_source(list(lines))
    if (
        not isinstance(out, list)
        or len(out) != len(lines)
        or not all(isinstance(x, str) for x in out)
    ):
        raise plugin_error(
            task,
            "prepare_source",
            f"returned {type(out).__name__}, not a list of {len(lines)} str (one a line)",
        )
    return out


def unknown_words(task: Task, source: str, ids: Sequence[int]) -> list[str]:
    """The words of a (prepared) source line that its ids `ids` read as <unk>: the vocabulary
    never saw them, so the model cannot know what they mean. Where the task's tokens are the
    word's characters (one id each), the characters it lacks are named instead of the word."""
    if UNK not in ids:
        return []
    found: dict[str, None] = {}
    bare = len(task.encode_source([""])[0])  # the ids of an empty line (</s>)
    for word in dict.fromkeys(source.split()):
        encoded = task.encode_source([word])[0]
        if UNK not in encoded:
            continue
        if len(encoded) - bare == len(word) > 1:  # a token a character: name the characters
            found.update((c, None) for c in word if UNK in task.encode_source([c])[0])
        else:
            found[word] = None
    return list(found)


@dataclass(frozen=True)
class Forced:
    """What the outputs of each line must hold beyond the task's own constraint: `prefixes`, a
    target prefix for each line ("" for none) that its outputs start with
    (`constraints.Prefix`); `terms`, for each line the target ids of the terms its outputs must
    hold (`terminology.Terms`)."""

    prefixes: Sequence[str] | None = None
    terms: Sequence[Sequence[Sequence[int]]] | None = None


@dataclass
class Output:
    """One output of an input: its text (after the task's post-processing where asked), its
    target ids in the model's space (without BOS and EOS) and the search's score."""

    text: str
    tokens: list[int]
    score: float
    utility: float | None = None  # with Wanted.mbr: the expected utility against the others

    @property
    def found(self) -> bool:
        """Whether the search found an output its constraint admits within the length limit
        (else its score is -inf, and `text` is empty: no made-up output)."""
        return self.score != float("-inf")


@dataclass
class Decoder:
    """A model (or an `Ensemble`) searched for a task's outputs: `task` is the task, or the
    run's member, whose vocabularies and constraint it uses; `settings` its decoding settings;
    `max_sentences` the sentences a batch holds (decode.max_sentences; 0: the device's own,
    `sentences_per_batch`)."""

    model: object
    task: Task
    settings: DecodeDefaults
    device: torch.device | str = "cpu"
    max_sentences: int = 0

    def generate(
        self, sources: Sequence[str], progress=None, raw: bool = False, postprocess: bool = True
    ) -> list[str]:
        """The single best output line of every source line, in input order: the first of
        `outputs` (of `candidates`, the target string before the task's post-processing, with
        `postprocess=False`: what validation and the test at the end score)."""
        if not postprocess:
            return [first.text for first, *_ in self.candidates(sources, progress=progress)]
        return [first.text for first, *_ in self.outputs(sources, progress=progress, raw=raw)]

    def outputs(
        self,
        sources: Sequence[str],
        wanted: Wanted = Wanted(),
        forced: Forced = Forced(),
        progress=None,
        raw: bool = False,
    ) -> list[list[Output]]:
        """The outputs of every source line, in input order, best first: `candidates`,
        post-processed. `raw`: the lines are input as a person types it (`s2s generate`, the
        server), made into sources first (`prepared_sources`); else they are sources already (a
        split's, say)."""
        task = self.task
        sources = prepared_sources(task, sources) if raw else sources
        found = self.candidates(sources, wanted, forced, progress)
        for outs, source in zip(found, sources):
            for out in outs:
                if not out.found:
                    continue  # stays empty: the task's post-processing would make one up
                out.text = task.postprocess(out.text, source)
                if not isinstance(out.text, str):
                    raise plugin_error(
                        task, "postprocess", f"returned {type(out.text).__name__}, not a str"
                    )
        if wanted.mbr is not None:
            found = [_by_utility(outs, wanted.mbr, wanted.mbr_method, task) for outs in found]
        return found

    @torch.no_grad()
    def candidates(
        self,
        sources: Sequence[str],
        wanted: Wanted = Wanted(),
        forced: Forced = Forced(),
        progress=None,
    ) -> list[list[Output]]:
        """The decoded outputs (target strings before post-processing) of every source line, in
        input order, best first: one, or as `wanted` asks, each holding what `forced` asks.

        A batch holds at most `decode.max_sentences` sentences and at most one search's rows
        (`sentences_per_search`). On a CPU with n > 1 intra-op threads, n batches are searched at
        once, each on one thread, those of the longest sentences first: a step's operations are
        small (a few hundred rows), and splitting each of them over threads pays a
        synchronisation per operation that independent batches do not. On a GPU batches go one
        after the other. Sampling seeds each sentence's generator from the seed and the
        sentence's ids, so a line with the same settings draws the same outputs whatever lines
        are decoded with it.
        """
        if not sources:
            return []
        model, task, settings, device = self.model, self.task, self.settings, self.device
        prefixes, terms = forced.prefixes, forced.terms
        if terms is not None and not any(terms):
            terms = None
        if terms is not None and wanted.sampling is not None:
            raise UsageError(SAMPLING_REFUSED)
        glue = None if terms is None else word_glue(task)  # before the threads share it
        was_training = model.training
        model.eval()
        ids = task.encode_source(list(sources))
        if not hasattr(ids, "__len__") or len(ids) != len(sources):
            got = f"{len(ids)} id lists" if hasattr(ids, "__len__") else type(ids).__name__
            raise plugin_error(
                task,
                "encode_source",
                f"returned {got} for {len(sources)} lines, not one id list a line",
            )
        forced = task.encode_target(list(prefixes)) if prefixes and any(prefixes) else None
        start = start_ids(task)  # a multilingual model's target language: every output's start
        if forced is None and start:
            forced = [start] * len(ids)
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[list[Output]] = [[] for _ in ids]

        def search_batch(batch: list[int]) -> list[list[Output]]:
            src = source_batch([ids[i] for i in batch])
            constraint = task.constraint([sources[i] for i in batch])
            if forced is not None:
                prefix = Prefix([forced[i] for i in batch], task.tgt_vocab_size, len(start))
                constraint = joined(constraint, prefix)
            if terms is not None and any(terms[i] for i in batch):
                here = Terms([terms[i] for i in batch], task.tgt_vocab_size, glue)
                constraint = joined(constraint, here)
            found = nbest(model, src.to(device), settings, wanted, constraint)
            lines = [
                [
                    Output(task.decode_target(h.tokens), h.tokens, h.score)
                    if h.score != float("-inf")
                    else Output("", [], h.score)  # nothing the constraint admits fitted the limit
                    for h in hs
                ]
                for hs in found
            ]
            for hs in lines:
                for h in hs:
                    if not isinstance(h.text, str):
                        raise plugin_error(
                            task, "decode_target", f"returned {type(h.text).__name__}, not a str"
                        )
            return lines

        size = sentences_per_batch(self.max_sentences, device)
        size = sentences_per_search(wanted.rows(settings.beam), size, device)
        batches = list(chunks(order, size))
        threads = torch.get_num_threads()
        workers = min(threads, len(batches)) if torch.device(device).type == "cpu" else 1
        try:
            if workers > 1:
                torch.set_num_threads(1)
            # longest first, when threads share them: the last batch to start is then a short
            # one, and no thread waits long for the others at the end
            ordered = batches[:: -1 if workers > 1 else 1]
            with ThreadPoolExecutor(workers) as pool:
                for batch, found in zip(ordered, pool.map(search_batch, ordered)):
                    for i, hs in zip(batch, found):
                        out[i] = hs
                    if progress is not None:
                        progress.update(len(batch))
        finally:
            torch.set_num_threads(threads)
            model.train(was_training)
        return out

    @torch.no_grad()
    def target_scores(
        self, sources: Sequence[str], targets: Sequence[Sequence[int]]
    ) -> list[TargetScore]:
        """The model's log-probability of each given target (ids in the model's space, without BOS
        and EOS) after its source line: every token's, EOS included, their sum, and the sum over
        the search's length penalty lp(|Y|) with the settings' alpha and form (|Y| counting
        EOS), the figure beam search ranks by; the projection and log-softmax in fp32 whatever
        the search's precision (`log_probs`). The plain model's (or ensemble's) distribution:
        no constraint, no temperature. Sentences go in batches of at most 64."""
        model, task, lp, device = self.model, self.task, penalty(self.settings), self.device
        found: list[TargetScore] = []
        ids = task.encode_source(list(sources))
        was_training = model.training
        model.eval()
        try:
            for lo in range(0, len(ids), 64):
                src = source_batch(ids[lo : lo + 64]).to(device)
                seqs = [list(t) for t in targets[lo : lo + 64]]
                width = max(map(len, seqs)) + 1
                tgt_in = torch.full((len(seqs), width), PAD, dtype=torch.long)
                tgt_out = torch.full((len(seqs), width), PAD, dtype=torch.long)
                for row, seq in enumerate(seqs):
                    tgt_in[row, : len(seq) + 1] = torch.tensor([BOS, *seq])
                    tgt_out[row, : len(seq) + 1] = torch.tensor([*seq, EOS])
                tgt_in, tgt_out = tgt_in.to(device), tgt_out.to(device)
                logp = model.log_probs(src, tgt_in)  # fp32, whatever the search's precision
                picked = logp.gather(-1, tgt_out[..., None])[..., 0]
                for row, seq in enumerate(seqs):
                    each = picked[row, : len(seq) + 1].tolist()
                    total = sum(each)
                    normalised = total / lp(len(each))
                    found.append(TargetScore(each, total, normalised))
        finally:
            model.train(was_training)
        return found


def _by_utility(outs: list[Output], utility: str, method: str, task) -> list[Output]:
    """A line's outputs ranked by their expected utility against each other (the found ones;
    minimum Bayes risk, `s2s.core.decode.mbr`), best first; ties keep the search's order.
    With utility `task`, by the task's own metric in its direction (`utility` is then the
    expected figure: of an error rate, the expected error, the lowest first)."""
    found = [o for o in outs if o.found]
    texts = [o.text for o in found]
    if utility == "task":
        values, higher = expected_figures(texts, lambda h, r: checked_score(task, task.score(h, r)))
    else:
        values, higher = expected_utilities(texts, utility, method), True
    for out, value in zip(found, values):
        out.utility = value
    ranked = sorted(found, key=lambda o: -o.utility if higher else o.utility)
    return ranked + [o for o in outs if not o.found]


@dataclass
class TargetScore:
    """The model's log-probabilities of one target: each token's (EOS last), their sum, and
    the sum over lp(|Y|), the search's score."""

    tokens: list[float]
    logprob: float
    score: float

    def as_dict(self) -> dict:
        """The JSON object `s2s generate --score-targets` writes a line and the server answers."""
        return {
            "logprob": round(self.logprob, 4),
            "score": round(self.score, 4),
            "tokens": len(self.tokens),
            "token_logprobs": [round(x, 4) for x in self.tokens],
        }
