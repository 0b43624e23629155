"""The decoding worker behind `s2s serve`: requests queue, and one thread decodes them in batches.

Requests arrive on the server's event loop and wait in a queue per client, served in turn. A
single worker thread owns the model: it takes the oldest request of the client whose turn it is,
adds the waiting requests of every client for the same member and the same wanted outputs
(`Wanted`: the n best, or n drawn) while their source tokens fit the token budget, and decodes
them together through `s2s generate`'s path (`decode.batched.outputs`, with
the task's post-processing), so that a sentence gets the output `s2s generate` writes for it,
whatever it was batched with (drawn samples too: each sentence draws from its own generator).
Each request gets its own outputs back with their scores and the time it waited and was
decoded.

A score is the model's log-probability of the decoded target (as the task encodes it), EOS
included, divided by the search's length penalty lp(Y) = ((5 + |Y|) / 6)^alpha: the figure beam
search ranks hypotheses by (a constraint only narrows the choice; it does not change the figure).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch

from ...data.members import decode_settings
from ...tokenizers.pieces import choose_languages
from ...decode.batched import Decoder, Forced, source_batch
from ...decode.search import Wanted, search
from ...contract.task import DecodeDefaults
from ...tokenizers import BOS, EOS, SPECIALS
from ..attention_maps import source_tokens, target_tokens

log = logging.getLogger("s2s")


def one_line(text: str) -> str:
    """An output as one line: line breaks a post-processing wrote become spaces."""
    return text.replace("\r", " ").replace("\n", " ")


@dataclass
class Job:
    """One request: the sentences of one member (`attention`: one sentence, the weights of
    `layer`)."""

    member: object
    sources: list[str]
    tokens: int  # source tokens, what the budget counts
    attention_layer: int | None = None
    wanted: Wanted = Wanted()  # the n best, or n drawn; jobs batch with those that want alike
    prefixes: list[str] | None = None  # a target prefix for each sentence
    terms: list | None = None  # for each sentence, its terms' target spellings (terminology)
    targets: list[list[int]] | None = None  # given outputs to score (target ids), no search
    client: str = ""  # who asked (the address): each client's jobs are served in turn
    langs: tuple = ("", "")  # a multilingual model's source and target language ("": the run's)
    future: Future = field(default_factory=Future)
    queued: float = field(default_factory=time.perf_counter)


@contextlib.contextmanager
def languages(member, langs: tuple):
    """A multilingual model's vocabularies set to a request's languages (checked when it came)
    while its batch decodes (the one worker decodes), then back to the run's."""
    if not any(langs):
        yield
        return
    vocabs = [getattr(member.task, side, None) for side in ("src_vocab", "tgt_vocab")]
    saved = [getattr(v, "lang", None) for v in vocabs]
    try:
        choose_languages([member.task], *langs)
        yield
    finally:
        for vocab, lang in zip(vocabs, saved):
            if lang is not None:
                vocab.lang = lang


class ShuttingDown(Exception):
    """The server is stopping: a job that waited is answered 503."""


def _answer(job: Job, result=None, error: Exception | None = None) -> int:
    """Give a job its result (or error) unless its client has left (its future cancelled);
    1 if it was answered."""
    if job.future.done() or not job.future.set_running_or_notify_cancel():
        return 0
    if error is not None:
        job.future.set_exception(error)
    else:
        job.future.set_result(result)
    return 1


class Batcher:
    """One worker thread decoding queued jobs in batches of at most `budget` source tokens (a
    job larger than the budget is decoded alone); at most `max_queued` jobs wait.

    Jobs wait in one queue per client (its address), served in turn: a batch starts with the
    oldest job of the client served longest ago and takes alike jobs from the heads of the
    other clients' queues, so a client with many heavy requests holds the worker from the
    others for one batch at most."""

    def __init__(self, model, cfg, budget: int, max_queued: int = 1024):
        self.model, self.cfg, self.budget = model, cfg, budget
        # the model whose attention /attention shows: an ensemble's first
        self.attending = getattr(model, "models", [model])[0]
        self.device = next(model.parameters()).device
        self.max_queued = max_queued
        self.queues: OrderedDict[str, deque[Job]] = OrderedDict()  # client -> its jobs, in turn
        self.queued = 0
        self.ready = threading.Condition()
        self.stopping = False  # `stop` was called: no more jobs
        # batches and sentences decoded, jobs passed over because their clients left
        self.decoded = {"batches": 0, "sentences": 0, "dropped": 0}
        self.thread = threading.Thread(target=self._work, name="s2s-decoder", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> Future:
        """Queue a job (queue.Full when `max_queued` already wait, ShuttingDown once `stop`
        was called); its future gets the result. A job whose future is cancelled before the
        worker reaches it (its client left) is passed over."""
        with self.ready:
            if self.stopping:
                raise ShuttingDown()
            if self.queued >= self.max_queued:
                raise queue.Full()
            self.queues.setdefault(job.client, deque()).append(job)
            self.queued += 1
            self.ready.notify()
        return job.future

    def stop(self) -> int:
        """Answer every waiting job with ShuttingDown (the server is stopping); the batch being
        decoded finishes. Returns how many were waiting."""
        with self.ready:
            self.stopping = True
            waiting = [job for jobs in self.queues.values() for job in jobs]
            self.queues.clear()
            self.queued = 0
        return sum(_answer(job, error=ShuttingDown()) for job in waiting)

    def waiting(self) -> int:
        return self.queued

    def settings(self, member) -> DecodeDefaults:
        return decode_settings(member, self.cfg.decode)

    def decoder(self, member) -> Decoder:
        """The served model searched with `member`'s settings."""
        max_sentences = self.cfg.decode.max_sentences
        return Decoder(self.model, member, self.settings(member), self.device, max_sentences)

    # -- the worker ----------------------------------------------------------------------------
    @staticmethod
    def _alike(job: Job, first: Job) -> bool:
        """Whether `job` can be decoded in `first`'s batch: the same member, the same wanted
        outputs, both searched or both scored (attention is computed a request at a time)."""
        return (
            job.attention_layer is None
            and first.attention_layer is None
            and job.member is first.member
            and job.wanted == first.wanted
            and (job.targets is None) == (first.targets is None)
            and job.langs == first.langs
        )

    def _take(self, client: str) -> Job:
        """The oldest job of `client`; the client goes to the back of the turn. Holds `ready`."""
        jobs = self.queues[client]
        job = jobs.popleft()
        self.queued -= 1
        if jobs:
            self.queues.move_to_end(client)
        else:
            del self.queues[client]
        return job

    def _batch(self) -> list[Job]:
        """The next batch: the oldest job of the client whose turn it is, then alike jobs at the
        heads of the other queues, in turn, while their source tokens fit the budget; jobs
        whose clients left are passed over."""
        with self.ready:
            while True:
                while not self.queues:
                    self.ready.wait()
                first = self._take(next(iter(self.queues)))
                if not first.future.cancelled():
                    break
                self.decoded["dropped"] += 1
            batch, tokens = [first], first.tokens
            if first.attention_layer is not None:
                return batch
            progress = True
            while progress and tokens < self.budget:
                progress = False
                for client in list(self.queues):
                    head = self.queues[client][0]
                    if head.future.cancelled():
                        self._take(client)
                        self.decoded["dropped"] += 1
                        progress = True
                    elif self._alike(head, first) and tokens + head.tokens <= self.budget:
                        batch.append(self._take(client))
                        tokens += head.tokens
                        progress = True
            return batch

    def _work(self) -> None:
        while True:
            batch = self._batch()
            first = batch[0]
            try:
                if first.attention_layer is not None:
                    _answer(first, self._attention(first))
                elif first.targets is not None:
                    self._score(batch)
                else:
                    self._generate(batch)
            except Exception as e:  # noqa: BLE001 -- its requests get it; the worker goes on
                log.exception("decoding failed")
                for job in batch:
                    _answer(job, error=e)

    def _generate(self, batch: list[Job]) -> None:
        member, wanted, start = batch[0].member, batch[0].wanted, time.perf_counter()
        sources = [s for job in batch for s in job.sources]
        prefixes = [p for job in batch for p in (job.prefixes or [""] * len(job.sources))]
        terms = [t for job in batch for t in (job.terms or [[]] * len(job.sources))]
        decoder = self.decoder(member)
        forced = Forced(prefixes if any(prefixes) else None, terms if any(terms) else None)
        with languages(member, batch[0].langs):
            found = decoder.outputs(sources, wanted, forced)
            best = [outs[0] for outs in found]
            rated = decoder.target_scores(sources, [o.tokens for o in best])
        scores = [round(r.score, 4) for r in rated]
        scores = [s if o.found else None for s, o in zip(scores, best)]  # no output, no score
        done = time.perf_counter()
        for job, part in self._parts(batch):
            result = {
                "hypotheses": [one_line(o.text) for o in best[part]],
                "scores": scores[part],
                # the sentences for which the search found no output within the length limit
                "no_output": [k for k, o in enumerate(best[part]) if not o.found],
                "timing": self._timing(job, batch, start, done),
            }
            if wanted != Wanted():
                result["nbest"] = [
                    [
                        {
                            "output": one_line(o.text),
                            "score": round(o.score, 4) if o.found else None,
                            **({} if o.utility is None else {"utility": round(o.utility, 4)}),
                        }
                        for o in outs
                    ]
                    for outs in found[part]
                ]
            _answer(job, result)

    def _score(self, batch: list[Job]) -> None:
        """The model's log-probabilities of the given targets of every job in the batch."""
        member, start = batch[0].member, time.perf_counter()
        sources = [s for job in batch for s in job.sources]
        targets = [t for job in batch for t in job.targets]
        rated = self.decoder(member).target_scores(sources, targets)
        done = time.perf_counter()
        for job, part in self._parts(batch):
            scores = [r.as_dict() for r in rated[part]]
            _answer(job, {"scores": scores, "timing": self._timing(job, batch, start, done)})

    def _parts(self, batch: list[Job]):
        """Each job of a decoded batch with the slice of the batch's sentences that are its own;
        the batch is counted in `decoded`."""
        self.decoded["batches"] += 1
        self.decoded["sentences"] += sum(len(job.sources) for job in batch)
        at = 0
        for job in batch:
            yield job, slice(at, at + len(job.sources))
            at += len(job.sources)

    @staticmethod
    def _timing(job: Job, batch: list[Job], start: float, done: float) -> dict:
        """How long `job` waited and its batch took, and what the batch held."""
        return {
            "queued_ms": round(1000 * (start - job.queued), 2),
            "decode_ms": round(1000 * (done - start), 2),
            "batch_sentences": sum(len(j.sources) for j in batch),
            "batch_requests": len(batch),
        }

    @torch.no_grad()
    def _attention(self, job: Job) -> dict:
        """The search's output for one sentence and the encoder-decoder attention weights of one
        layer (every head) in the model's forward pass over (source, output); for an ensemble,
        the first model's weights over the ensemble's output."""
        member, line, start = job.member, job.sources[0], time.perf_counter()
        settings = self.settings(member)
        src = source_batch(member.encode_source([line])).to(self.device)
        (hyp,) = search(self.model, src, settings, member.constraint([line]))
        tgt_in = torch.tensor([[BOS, *hyp.tokens]], device=self.device)
        _, weights = self.attending(src, tgt_in, return_attention=True)
        cross = weights.kinds()["cross"]
        layer = job.attention_layer or len(cross)
        w = cross[layer - 1][0].float().cpu()  # [heads, output tokens, source tokens]
        return {
            "output": member.postprocess(member.decode_target(hyp.tokens), line),
            "source_tokens": source_tokens(member, src[0].tolist()),
            "output_tokens": target_tokens(member, tgt_in[0].tolist())[1:] + [SPECIALS[EOS]],
            "layer": layer,
            "layers": len(cross),
            "heads": w.size(0),
            "weights": [[[round(x, 4) for x in row] for row in head] for head in w.tolist()],
            "timing": {
                "queued_ms": round(1000 * (start - job.queued), 2),
                "decode_ms": round(1000 * (time.perf_counter() - start), 2),
            },
        }
