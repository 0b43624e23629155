"""Search: greedy decoding and batched beam search with the GNMT length penalty.

The paper decodes with beam size 4 and length penalty alpha = 0.6 (section 6.1), the penalty of
Wu et al. (2016): lp(Y) = ((5 + |Y|) / 6)^alpha. A hypothesis scores sum_i log p(y_i) / lp(Y),
where Y counts the output tokens including the final EOS (so an empty output has |Y| = 1 and
every hypothesis, even one stopped at the maximum length, is scored the same way: one ending
there is forced to EOS, whose log-probability it pays).

The maximum output length of a sentence is int(max_len_a * |x| + max_len_b) tokens before EOS,
|x| counting the source's non-pad tokens (its EOS included), and at most what the model's
positions allow. PAD and BOS are never generated.

A constraint (`s2s.core.contract.task.Constraint`, from `Task.constraint`) narrows the search to the
outputs a task admits: its state rides along with every hypothesis as rows of tensors, advanced
by the token each row takes and moved with the rows when the beam is reordered, and at each step
the tokens it does not allow get log-probability -inf (the others keep the model's own).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..contract.checks import shown
from ..setup.settings import Stop
from ..contract.task import DecodeDefaults
from ..tokenizers import EOS, PAD
from .beam import beam_search, greedy
from .mbr import METHODS, UTILITIES
from .sampling import Sampling, sample, sentence_generators
from .steps import Stepper, penalty


@dataclass
class Hypothesis:
    tokens: list[int]  # without BOS and EOS
    score: float  # sum of log-probabilities (EOS included) / lp(Y)


@dataclass(frozen=True)
class Wanted:
    """What a caller asks of a search beyond the task's settings (`DecodeDefaults`): `n`
    outputs a source, the n best of the beam search (n at most the beam) or, with `sampling`,
    n drawn ones; with `mbr` (a utility: chrf, bleu, or the task's metric) ranked by their
    expected utility against each other (minimum Bayes risk), not by score, computed by
    `mbr_method` (pairwise: exact; aggregate: reference aggregation, s2s.core.decode.mbr; the
    task's metric is always pairwise). `incremental=False` recomputes the decoder
    over the whole prefix at each step instead of keeping its cache (the same outputs, slower:
    what tests and the speed benchmark compare the cache with)."""

    n: int = 1
    sampling: Sampling | None = None
    incremental: bool = True
    mbr: str | None = None  # rank the n outputs by expected utility (s2s.core.decode.mbr)
    mbr_method: str = "pairwise"  # how the expectation is computed (mbr.METHODS)

    def problem(self, beam: int) -> str | None:
        """What is wrong with what is asked of a search with this beam, as `option value: why`
        (the sampling settings', `Sampling.problem`), or None."""
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            return f"nbest {shown(self.n)}: must be a whole number, 1 or more"
        if self.mbr is not None and self.mbr not in UTILITIES:
            return f"mbr {shown(self.mbr)}: one of {', '.join(UTILITIES)}"
        if self.mbr_method not in METHODS:
            return f"mbr-method {shown(self.mbr_method)}: one of {', '.join(METHODS)}"
        if self.sampling is None and self.n > beam:
            return (
                f"nbest {self.n}: above the beam ({beam}); a beam search keeps at most its beam "
                "of outputs (raise the beam, or draw them with sampling)"
            )
        return None if self.sampling is None else self.sampling.problem()

    def rows(self, beam: int) -> int:
        """The rows (hypotheses) a sentence takes in the search: n drawn outputs, else the
        beam."""
        return self.n if self.sampling is not None else beam


STOPS = tuple(str(s) for s in Stop)  # beam search's stopping rules (DecodeDefaults.stop)


SENTENCES = {
    "cpu": 128
}  # decode.max_sentences=0: sentences decoded together, by device type (others: 1,024)


def sentences_per_batch(max_sentences: int, device) -> int:
    """decode.max_sentences as set, or for 0 the device's own: 128 on a CPU (more only grows the
    cache a step reads), 1,024 on a GPU (whose products need many rows to keep it busy)."""
    return max_sentences or SENTENCES.get(torch.device(device).type, 1024)


ROWS_PER_SEARCH = {"cpu": 512}  # hypotheses searched at once, by device type (none given: all)


def sentences_per_search(width: int, sentences: int, device) -> int:
    """How many of `sentences` one search takes at once with `width` rows (hypotheses) a
    sentence: at most ROWS_PER_SEARCH rows on the device, all the sentences where it sets none."""
    limit = ROWS_PER_SEARCH.get(torch.device(device).type, width * sentences)
    return max(1, limit // width)


def search(
    model,
    src: Tensor,
    settings: DecodeDefaults,
    constraint=None,
    incremental: bool = True,
) -> list[Hypothesis]:
    """The best hypothesis for each source row of src [B, S]: the first of `nbest`'s lists."""
    found = nbest(model, src, settings, Wanted(incremental=incremental), constraint)
    return [best for best, *_ in found]


def nbest(
    model,
    src: Tensor,
    settings: DecodeDefaults,
    wanted: Wanted = Wanted(),
    constraint=None,
) -> list[list[Hypothesis]]:
    """The `wanted.n` best hypotheses for each source row of src [B, S] (ids + EOS,
    right-padded), best first, in the order of the rows (fewer where the search finished fewer:
    a maximum length of 0 admits one output), searched with the beam, length penalty, maximum
    length and stopping rule of `settings`.

    settings.beam == 1 is greedy search (n must be 1); beam > 1 beam search, n at most the
    beam, whose first hypothesis does not depend on n. With `wanted.sampling`, n outputs are
    drawn for each source instead (`sample`; the beam plays no part), ranked by score. The
    model is put in eval mode for the search and given back in the mode it came in.
    `settings.stop` is beam search's stopping rule, "bound" or "beam" (see
    s2s.core.contract.task.DecodeDefaults). Any model with the
    Transformer's encode / decode / init_cache / decode_step / reorder_cache and
    `max_positions` will do (an `s2s.core.decode.ensemble.Ensemble` does); when its init_cache
    takes `capacity` it is told the number of steps, and when its reorder_cache takes `keep`,
    sentences leave the batch as soon as their search is over. `constraint` (a
    `s2s.core.contract.task.Constraint` for these B sources) limits the tokens each step may take.

    On a CPU at most ROWS_PER_SEARCH hypotheses (beam x sentences) are searched at once, the
    sentences in order: the self-attention cache of a search grows with its rows times its
    steps (beam 21 over 128 parsing sentences: gigabytes), while products of 1,024 rows already
    run at the machine's rate. A GPU searches the whole batch at once.
    """
    beam, n, sampling = settings.beam, wanted.n, wanted.sampling
    if settings.stop not in STOPS:
        raise ValueError(f"stop must be one of {', '.join(STOPS)}, not {settings.stop!r}")
    if sampling is None and not 1 <= n <= beam:
        raise ValueError(f"n must be between 1 and the beam ({beam}), not {n}")
    width = wanted.rows(beam)
    was_training = model.training
    model.eval()
    B = src.size(0)
    per = sentences_per_search(width, B, src.device)
    try:
        with torch.inference_mode():
            state = (
                None if constraint is None else constraint.initial(src.device)
            )  # one row per sentence
            found = []
            for lo in range(0, B, per):
                part = src[lo : lo + per]
                part = part[:, : int(part.ne(PAD).sum(1).max())]  # its own padding only
                rows = None if state is None else tuple(x[lo : lo + per] for x in state)
                memory, src_pad = model.encode(part)
                src_len = (~src_pad).sum(1)
                max_len = (settings.max_len_a * src_len.double() + settings.max_len_b).long()
                max_len = max_len.clamp(0, model.max_positions - 1)
                stepper = Stepper(
                    model,
                    (memory, src_pad),
                    int(max_len.max()) + 1,
                    wanted.incremental,
                    None if constraint is None else (constraint, rows),
                    truncate=settings.stop == "transformers",
                    min_len=settings.min_len,
                )
                if sampling is not None:
                    generators = sentence_generators(sampling.seed, part)
                    seqs, scores = sample(
                        stepper, max_len, penalty(settings), n, sampling, generators
                    )
                elif beam == 1:
                    seqs, scores = greedy(stepper, max_len, penalty(settings))
                    seqs, scores = seqs[:, None], scores[:, None]
                else:
                    seqs, scores = beam_search(stepper, max_len, settings, n)
                stepper.release()
                found += _hypotheses(seqs, scores)
    finally:
        model.train(was_training)
    return found


def _hypotheses(seqs: Tensor, scores: Tensor) -> list[list[Hypothesis]]:
    """Rows [B, n, L] (BOS, outputs, EOS, PAD) with scores [B, n] as hypotheses, those that
    finished (a score above -inf) only."""
    found = []
    for row_seqs, row_scores in zip(seqs.tolist(), scores.tolist()):
        hyps = []
        for seq, score in zip(row_seqs, row_scores):
            if score == -torch.inf and hyps:
                continue
            out = [x for x in seq[1:] if x != PAD]  # drop BOS; keep what precedes the first EOS
            hyps.append(Hypothesis(out[: out.index(EOS)] if EOS in out else out, score))
        found.append(hyps)
    return found
