"""Terminology: when a source line holds a source term of a term list, its target term appears in
the output, as a constraint of the search (`s2s.core.contract.task.Constraint`).

A term list is a UTF-8 file of lines `source term<TAB>target term` (`read_terms`). A line's terms
are those whose source side occurs in the line as whole words (`holds_term`): at the start of
the line or after a space, and followed by the line's end or a character that is no letter or
digit, so `cat` is not in "catalog", `bike` not in "motorbike", `dog` not in "hotdog". Their
target sides are met by the task's target ids of the term in either of its two spellings,
inside a sentence (after a space) or at its start, which subword vocabularies spell apart, and
only as whole words there too: a spelling followed by a token that continues its word (`Katze`
then `n`: "Katzen"; `word_glue`) has not met its term.

The constraint (`Terms`) tracks for every hypothesis and spelling the longest beginning of it
that the output ends with (a Knuth-Morris-Pratt automaton: after a mismatch it falls back to
the longest beginning that is still an ending, so `a a b` is seen in "a a a b") and whether it
has appeared. A hypothesis may end only once every term has appeared, and may take a token only
if the terms still missing fit in what remains of its length limit afterwards: their shortest
spellings, less what the most advanced spelling has already written (finishing that one and
then writing the others whole always fits, so the search can always finish). Beam search
divides its beam among hypotheses by the number of terms they have met (`Terms.met`): dynamic
beam allocation (Post and Vilar 2018), vectorised over the batch as Hu et al. (2019) do
(`s2s.core.decode.banks`). Every score is the model's own: a term is written where the model's
probabilities place it best, and the best output that holds every term wins.

Terms are a beam search's constraint: sampling draws each token without looking ahead, so a
term it has not drawn by itself gets forced in only when the length limit leaves no other
room, after whatever the draws wrote while the end was banned; `SAMPLING_REFUSED` is the one
line every caller gives instead.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from .. import textio
from ..errors import DataError
from ..contract.task import Constraint
from ..tokenizers import EOS, PAD, SPECIALS


#: the one line the command line, the server and the Python API give for terms with sampling
SAMPLING_REFUSED = (
    "terms are placed by beam search only: sampling draws each token without looking ahead, "
    "so a term it does not draw by itself is forced in at the length limit after whatever it "
    "drew meanwhile; decode with terms without sampling"
)


def read_terms(path: str | Path) -> list[tuple[str, str]]:
    """The (source term, target term) pairs of a term file; a line that is not two non-empty
    fields separated by one TAB is a DataError naming the file and line."""
    pairs = []
    for number, line in enumerate(textio.iter_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2 or not fields[0].strip() or not fields[1].strip():
            raise DataError(
                f"{path}, line {number}: {line[:60]!r} is not `source term<TAB>target term` "
                "(one TAB, both sides non-empty)"
            )
        pairs.append((fields[0].strip(), fields[1].strip()))
    if not pairs:
        raise DataError(f"{path}: no terms (one `source term<TAB>target term` a line)")
    return pairs


def line_terms(task, sources: Sequence[str], pairs: Sequence[tuple[str, str]]):
    """For each (prepared) source line, the terms it holds as whole words (`holds_term`): a list
    of (source term, target term, its target spellings: the ids of the term within a sentence
    and at its start, which subword vocabularies spell apart). `task` is a task or a run's
    member (its target ids); only the terms some line holds are tokenised."""
    patterns = [(source, target, *_term_pattern(source)) for source, target in pairs]
    spelled: dict[str, list[Spelling]] = {}
    found = []
    for line in sources:
        line = " ".join(line.split())
        here = []
        for source, target, words, pattern in patterns:
            if words in line and pattern.search(line):
                if target not in spelled:
                    spelled[target] = target_spellings(task, target)
                here.append((source, target, spelled[target]))
        found.append(here)
    return found


def holds_term(line: str, term: str) -> bool:
    """Whether `line` holds `term` as whole words: at the line's start or after a space, and
    followed by the line's end or a character that is no letter, digit or underscore (runs of
    whitespace count as one space on both sides)."""
    return bool(_term_pattern(term)[1].search(" ".join(line.split())))


def _term_pattern(term: str) -> tuple[str, re.Pattern]:
    """The term with its whitespace made single spaces, and the pattern of it as whole words
    in a line whose whitespace is single spaces."""
    words = " ".join(term.split())
    end = r"(?!\w)" if re.match(r"\w", words[-1:]) else ""
    return words, re.compile(r"(?:^|(?<= ))" + re.escape(words) + end)


def target_spellings(task, target_term: str) -> list["Spelling"]:
    """A target term's ids within a sentence (after a space) and, where a subword vocabulary
    spells it apart, at the output's start."""
    inside, start = (tuple(t) for t in task.encode_target([" " + target_term, target_term]))
    return [Spelling(inside)] + ([Spelling(start, first=True)] if start != inside else [])


def placeable(task, source: str, terms: Sequence[tuple], settings, max_positions: int) -> int:
    """How many of a line's terms (`line_terms`' triples, in order) fit its output's length
    limit together: the first k whose shortest spellings add up to at most int(max_len_a * |x|
    + max_len_b) (within the model's positions); the rest cannot be placed."""
    src = len(task.encode_source([source])[0]) + 1
    limit = max(0, min(int(settings.max_len_a * src + settings.max_len_b), max_positions - 1))
    total = 0
    for k, (_, _, targets) in enumerate(terms):
        total += min(len(x.ids) for x in targets)
        if total > limit:
            return k
    return len(terms)


@dataclass(frozen=True)
class Spelling:
    """A term's target ids in one spelling; `first`: a spelling that only begins an output (a
    word at the start of a sentence, which a subword vocabulary spells without its space)."""

    ids: tuple[int, ...]
    first: bool = False

    @staticmethod
    def of(x) -> "Spelling":
        return x if isinstance(x, Spelling) else Spelling(tuple(x))


def word_glue(task) -> torch.Tensor:
    """[V] bool: the target tokens that continue the word before them (`n` after `Katze` makes
    "Katzen"): written after a word the vocabulary spells (" a"), a token's text follows the
    word's with nothing between and begins with a letter, digit or underscore. A term's spelling
    followed by one of them has not met its term. One pass over the vocabulary, once a task."""
    cached = _GLUE.get(id(task))
    if cached is not None and cached[0]() is task:
        return cached[1]
    glued = []
    word = list(task.encode_target([" a"])[0][-1:])
    before = task.decode_target(word) if word and word[0] >= len(SPECIALS) else ""
    if re.search(r"\w$", before):  # else no word to test against: no token glues
        for token in range(len(SPECIALS), task.tgt_vocab_size):
            try:
                alone = task.decode_target([token])
                if re.match(r"\w", alone) and task.decode_target(word + [token]) == before + alone:
                    glued.append(token)
            except Exception:  # noqa: BLE001 -- an id outside a member's own range
                continue
    glue = torch.zeros(task.tgt_vocab_size, dtype=torch.bool)
    glue[glued] = True
    with contextlib.suppress(TypeError):  # a task that takes no weak reference: not kept
        _GLUE[id(task)] = (weakref.ref(task), glue)
    return glue


_GLUE: dict[int, tuple] = {}  # id(task): (a weak reference to it, its word_glue)


#: where a term's spelling may begin (`Terms`' state)
ANYWHERE, START, LATER = 0, 1, 2


class Terms(Constraint):
    """Every output holds each of its source's target terms, a term in any of its spellings
    (`Spelling`s, or lists of target ids; see the module), each as whole words: a spelling
    followed by a token of `glue` ([V] bool, `word_glue`; None: no token continues a word)
    has not appeared. State, S spellings a row: (ids [n, S, L], PAD-padded; lengths [n, S], 0
    where a row has fewer; same [n, S, S]: spellings of one term; first [n, S]: the first
    spelling of its term; place [n, S]: where a spelling may begin (ANYWHERE; START: only as
    the output's first tokens; LATER: not there, the spelling inside a sentence of a term that
    has one for the start); step [n]: tokens written; written [n, S]: the longest beginning of
    each spelling that the output ends with, its length when the spelling is complete and
    waits for the next token to show that its word ends; seen [n, S]: the spellings that have
    appeared; sentence [n]: the row's sentence, whose spellings' Knuth-Morris-Pratt transitions
    the constraint keeps (`_delta`))."""

    def __init__(self, terms: Sequence[Sequence[Sequence]], vocab: int, glue=None):
        self.terms = [[[Spelling.of(x) for x in t] for t in ts] for ts in terms]
        self.vocab, self.glue = vocab, glue

    def initial(self, device) -> tuple:
        n = len(self.terms)
        S = max([1] + [sum(len(t) for t in ts) for ts in self.terms])
        L = max([1] + [len(x.ids) for ts in self.terms for t in ts for x in t])
        ids = torch.full((n, S, L), PAD, dtype=torch.long)
        lengths = torch.zeros(n, S, dtype=torch.long)
        place = torch.full((n, S), ANYWHERE, dtype=torch.long)
        term = torch.arange(S).repeat(n, 1) + S  # each empty slot a term of its own
        delta = torch.zeros(n, S, L + 1, L, dtype=torch.long)
        for row, ts in enumerate(self.terms):
            slot = 0
            for k, spellings in enumerate(ts):
                has_start = any(x.first for x in spellings)
                for x in spellings:
                    ids[row, slot, : len(x.ids)] = torch.tensor(x.ids, dtype=torch.long)
                    lengths[row, slot], term[row, slot] = len(x.ids), k
                    place[row, slot] = START if x.first else LATER if has_start else ANYWHERE
                    delta[row, slot, : len(x.ids) + 1, : len(x.ids)] = _transitions(x.ids)
                    slot += 1
        same = term[:, :, None].eq(term[:, None, :])
        first = same.long().argmax(-1).eq(torch.arange(S))
        seen = lengths.eq(0)  # an empty slot is a term met
        written, step = torch.zeros_like(lengths), torch.zeros(n, dtype=torch.long)
        self._delta = delta.view(-1, L).to(device)
        self._glue = None if self.glue is None else self.glue.to(device)
        sentence = torch.arange(n)
        state = (ids, lengths, same, first, place, step, written, seen, sentence)
        return tuple(x.to(device) for x in state)

    def _after(self, state: tuple, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(written, seen) [n, K, S] after each row takes each of its K tokens [n, K]."""
        ids, lengths, _, _, place, step, written, seen, sentence = state
        n, S, L = ids.shape
        # the Knuth-Morris-Pratt transition of each spelling on each token: the rows of _delta
        # give the next state from `written` when the token is the spelling's m-th
        at = (sentence[:, None] * S + torch.arange(S, device=ids.device)) * (L + 1) + written
        moves = self._delta[at]  # [n, S, L]
        hits = tokens[:, :, None, None].eq(ids[:, None])  # [n, K, S, L]
        grown = torch.where(hits, moves[:, None], 0).amax(-1)  # [n, K, S]
        # a first-only spelling grows only from the output's first token, one token a step; a
        # spelling inside a sentence of a term that has one for the start does not begin there
        from_start = written.eq(step[:, None])[:, None] & grown.eq(written[:, None] + 1)
        grown = torch.where(place.eq(START)[:, None] & ~from_start, 0, grown)
        grown = torch.where(place.eq(LATER)[:, None] & step.eq(0)[:, None, None], 0, grown)
        # a complete spelling has appeared once the next token does not continue its word
        waiting = written.eq(lengths) & ~seen  # [n, S]
        glued = (
            torch.zeros_like(tokens, dtype=torch.bool) if self._glue is None else self._glue[tokens]
        )
        seen_after = seen[:, None, :] | (waiting[:, None, :] & ~glued[:, :, None])
        return torch.where(seen_after, 0, grown), seen_after

    @staticmethod
    def _met(same: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """[n, K, S]: whether each spelling's term has appeared (in any spelling)."""
        return (same[:, None, :, :] & seen[:, :, None, :]).any(-1)

    @staticmethod
    def _done(state: tuple, written: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """[n, K, S]: the spellings that have appeared, or are complete and appear unless the
        next token continues their word (an end, say)."""
        return seen | written.eq(state[1][:, None, :])

    def _need(self, state: tuple, written: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        """[n, K]: tokens the missing terms still take at most, after a token that leaves
        `written` and `seen` [n, K, S]: each one's shortest spelling that can still begin (a
        first-only one no longer can), less what the most advanced spelling of a missing term
        saves (finishing it, then writing the others whole, always fits)."""
        _, lengths, same, first, place = state[:5]
        never = 1 << 20  # the length of a spelling that can no longer begin
        usable = place.ne(START)[:, None, :] | written.gt(0)  # [n, K, S]
        ways = torch.where(usable, lengths[:, None, :], never)  # [n, K, S]
        shortest = torch.where(same[:, None], ways[:, :, None, :], never).amin(-1)
        missing = ~self._met(same, self._done(state, written, seen))
        whole = (shortest * (first[:, None, :] & missing)).sum(-1)
        saved = (shortest - lengths[:, None, :] + written) * (missing & written.gt(0))
        return whole - saved.amax(-1).clamp(min=0)

    def advance(self, state: tuple, tokens) -> tuple:
        written, seen = self._after(state, tokens[:, None])
        return (*state[:5], state[5] + 1, written[:, 0], seen[:, 0], state[8])

    def candidates(self, state: tuple) -> torch.Tensor:
        """[n, 2S]: the tokens that move a spelling on, each spelling's next token and its first
        one (a PAD for an empty slot)."""
        ids, written = state[0], state[6]
        next_id = ids.gather(2, written.clamp(max=ids.size(2) - 1)[..., None])[..., 0]
        return torch.cat([next_id, ids[:, :, 0]], dim=1)

    def _mask(self, state: tuple, remaining) -> torch.Tensor:
        ids, lengths, same, _, _, _, written, seen, _ = state
        n = ids.size(0)
        # every token of a spelling may leave one in progress (after a mismatch, the longest
        # beginning that is still an ending): those exactly; any other token leaves none, and
        # ends the word of a complete spelling unless it continues it (`glue`)
        moving = ids.view(n, -1)
        w, d = self._after(state, moving)
        ok = self._need(state, w, d).le(remaining[:, None] - 1)
        fresh = torch.zeros_like(written)[:, None, :].expand(n, 2, -1)
        ended = torch.stack([self._done(state, written[:, None], seen[:, None])[:, 0], seen], 1)
        base = self._need(state, fresh, ended).le(remaining[:, None] - 1)  # [n, 2]
        if self._glue is None:
            mask = base[:, :1].expand(n, self.vocab).clone()
        else:
            mask = torch.where(self._glue[None], base[:, 1:], base[:, :1])
        mask.scatter_(1, moving, ok)  # a PAD among them (an empty slot) is banned anyway
        done = self._done(state, written[:, None], seen[:, None])
        mask[:, EOS] = self._met(same, done)[:, 0].all(1)
        return mask

    def allowed(self, state: tuple, remaining) -> torch.Tensor:
        return self._mask(state, remaining)

    banked = True

    def met(self, state: tuple, tokens) -> torch.Tensor:
        """[n, K]: the terms each row has met after each of its tokens [n, K] (a term begun is
        not yet met; the beam's banks, `s2s.core.decode.banks`, are these counts)."""
        written, seen = self._after(state, tokens)
        lengths, same, first = state[1:4]
        real = first & lengths.gt(0)  # a term's first spelling, no empty slot
        return (self._met(same, self._done(state, written, seen)) & real[:, None, :]).sum(-1)


def _transitions(ids: Sequence[int]) -> torch.Tensor:
    """[L + 1, L]: the Knuth-Morris-Pratt automaton of a spelling of L tokens: from j tokens
    matched (0..L), the tokens matched after its m-th token comes (the longest beginning of the
    spelling that the text then ends with). Any token not in the spelling leads to 0."""
    L = len(ids)
    border = [0] * (L + 1)  # border[j]: the longest proper beginning of ids[:j] that ends it
    for j in range(2, L + 1):
        b = border[j - 1]
        while b and ids[b] != ids[j - 1]:
            b = border[b]
        border[j] = b + 1 if ids[b] == ids[j - 1] else 0
    table = torch.zeros(L + 1, L, dtype=torch.long)
    for j in range(L + 1):
        for m, token in enumerate(ids):
            b = j
            while b and (b == L or ids[b] != token):
                b = border[b]
            table[j, m] = b + 1 if ids[b] == token else 0
    return table
