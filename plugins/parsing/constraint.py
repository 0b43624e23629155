"""Tree-constrained search: only well-formed linearised trees over the source's words.

`TreeConstraint` is the parsing task's `s2s.core.contract.task.Constraint`. It admits exactly the
token sequences of linearise.py for some tree over the n source words:

* one top-level phrase; every ")X" closes the innermost open phrase, whose label is X;
* no phrase is empty; exactly n leaves; EOS only once the tree is complete;
* each leaf is what the scheme writes for the next word: XX ("vinyals"), a tag ("tags"), the
  word itself ("words"), a tag then the word ("tags_words"). A word outside the target
  vocabulary is written <unk>. In the tag schemes a punctuation word (`punctuation_tags`) must
  carry its punctuation tag and any other word must not (unless the training trees tag it as
  punctuation somewhere, as the treebank does with a few, e.g. a "'" closing a quote opened in an
  earlier sentence), because EVALB decides from each tree's own tags which words are
  punctuation and deletes them: either mistake would make the sentence a length-mismatch error;
* it always fits the maximum length: with R tokens left before EOS, a phrase may open only if
  the leaves still to come and the phrases then open can all be written in R - 1 tokens, so a
  hypothesis can always finish (given room for the smallest tree, 2 + n tokens, 2 + 2n with
  "tags_words").

The state of a row is a few tensors (sentence, depth, leaves written, flags, the stack of the
closing tokens of the open phrases), updated for all rows at once by vectorised operations.
"""

from __future__ import annotations

from typing import Sequence

import torch
from s2s.core import EOS, PAD, SPECIALS, UNK, Constraint
from torch import Tensor

from .linearise import PLACEHOLDER, PUNCTUATION_TAGS, TAG_SCHEMES, punctuation_tags

OTHER, OPEN, CLOSE = 0, 1, 2  # token kinds


class TokenTables:
    """What the constraint needs to know about a target vocabulary, computed once.

    itos: the target tokens by id; tags: the tokens that are leaf tags in this scheme;
    punct_tagged: the words that may take any tag although `punctuation_tags` does not call them
    punctuation (ParsingTask.punct_tagged: the training trees tag them as punctuation somewhere).
    """

    def __init__(
        self,
        itos: Sequence[str],
        tags: Sequence[str],
        scheme: str,
        punct_tagged: Sequence[str] = (),
    ):
        self.scheme, self.V, self.punct_tagged = scheme, len(itos), frozenset(punct_tagged)
        self.stoi = {t: i for i, t in enumerate(itos)}
        kind = torch.zeros(self.V, dtype=torch.long)
        close_of = torch.full(
            (self.V,), PAD, dtype=torch.long
        )  # PAD: no closing token (never allowed)
        for i, tok in enumerate(itos):
            if i < len(SPECIALS):
                continue
            if tok.startswith("(") and len(tok) > 1:
                kind[i] = OPEN
                close_of[i] = self.stoi.get(")" + tok[1:], PAD)
            elif tok.startswith(")") and len(tok) > 1:
                kind[i] = CLOSE
        self.kind, self.close_of = kind, close_of
        self.open_idx = (
            (kind.eq(OPEN) & close_of.ne(PAD)).nonzero().squeeze(1)
        )  # a phrase opens only if it can close
        # leaf tag columns, and a row of allowed tags for each class of word: row 0 any tag (a
        # word in `punct_tagged`), row 1 a word that is not punctuation: any tag but the punctuation tags,
        # which EVALB would delete with the word; row j > 1 a punctuation word: only punct[j - 2]
        leaf_tags = (
            [PLACEHOLDER] if scheme == "vinyals" else list(tags) if scheme in TAG_SCHEMES else []
        )
        self.tag_idx = torch.tensor(
            sorted({self.stoi[t] for t in leaf_tags if t in self.stoi}), dtype=torch.long
        )
        tag_set = set(self.tag_idx.tolist())
        self.punct = (
            sorted({t for t in PUNCTUATION_TAGS.values() if self.stoi.get(t) in tag_set})
            if scheme in TAG_SCHEMES
            else []
        )
        self.classes = torch.ones(2 + len(self.punct), len(self.tag_idx), dtype=torch.bool)
        for j, t in enumerate(self.punct, 2):
            self.classes[j] = self.tag_idx.eq(self.stoi[t])
            self.classes[1] &= ~self.classes[j]
        self.leaf_cost = 2 if scheme == "tags_words" else 1
        # the word tokens of the word schemes (<unk> included), among which search does not choose
        word = kind.eq(OTHER)
        word[: len(SPECIALS)] = False
        word[UNK] = True
        word[self.tag_idx] = False
        self.word_idx = (
            word.nonzero().squeeze(1)
            if scheme in ("words", "tags_words")
            else torch.zeros(0, dtype=torch.long)
        )

    def to(self, device) -> "TokenTables":
        for name in ("kind", "close_of", "open_idx", "tag_idx", "classes", "word_idx"):
            setattr(self, name, getattr(self, name).to(device))
        return self


class TreeConstraint(Constraint):
    """Linearised trees over the words of each source line (see the module docstring)."""

    def __init__(self, tables: TokenTables, sources: Sequence[str]):
        self.t = tables
        words = [s.split() for s in sources]
        width = max(1, max(map(len, words), default=1))
        self.n_words = torch.tensor([len(w) for w in words], dtype=torch.long)
        self.word_id = torch.full((len(words), width), UNK, dtype=torch.long)
        self.leaf_class = torch.zeros((len(words), width), dtype=torch.long)
        cls = {t: j + 2 for j, t in enumerate(tables.punct)}
        for b, ws in enumerate(words):
            if ws:
                self.word_id[b, : len(ws)] = torch.tensor([tables.stoi.get(w, UNK) for w in ws])
                self.leaf_class[b, : len(ws)] = torch.tensor(
                    [
                        cls.get(p, 0 if w in tables.punct_tagged else 1)
                        for w, p in zip(ws, punctuation_tags(ws))
                    ]
                )

    def initial(self, device) -> tuple:
        if self.t.kind.device != torch.device(device):
            self.t.to(device)
        self.n_words, self.word_id, self.leaf_class = (
            x.to(device) for x in (self.n_words, self.word_id, self.leaf_class)
        )
        B = self.n_words.size(0)
        zeros = torch.zeros(B, dtype=torch.long, device=device)
        false = torch.zeros(B, dtype=torch.bool, device=device)
        stack = torch.zeros((B, 8), dtype=torch.long, device=device)
        # sentence, depth, leaves written, top phrase non-empty, started, tag written (word next), stack
        return torch.arange(B, device=device), zeros, zeros, false, false, false, stack

    def advance(self, state: tuple, tokens: Tensor) -> tuple:
        sent, depth, leaves, nonempty, started, pending, stack = state
        kind = self.t.kind[tokens]
        is_open = kind.eq(OPEN) & ~pending
        is_close = (
            kind.eq(CLOSE) & ~pending & depth.gt(0)
        )  # (rows out of the search take any token)
        is_leaf_tok = kind.eq(OTHER) & tokens.ne(EOS) & ~pending
        scheme = self.t.scheme
        if scheme == "tags_words":
            done_leaf = pending & tokens.ne(EOS)
            pending = is_leaf_tok
        else:
            done_leaf = is_leaf_tok
        if is_open.any():
            if int(depth.max()) >= stack.size(1):
                stack = torch.cat([stack, torch.zeros_like(stack)], dim=1)
            at = depth.clamp(max=stack.size(1) - 1)[:, None]
            stack = stack.scatter(
                1,
                at,
                torch.where(
                    is_open[:, None], self.t.close_of[tokens][:, None], stack.gather(1, at)
                ),
            )
        depth = depth + is_open.long() - is_close.long()
        nonempty = torch.where(is_open, False, nonempty | done_leaf | is_close)
        return sent, depth, leaves + done_leaf.long(), nonempty, started | is_open, pending, stack

    def allowed(self, state: tuple, remaining: Tensor) -> Tensor:
        sent, depth, leaves, nonempty, started, pending, stack = state
        n = sent.size(0)
        rows = torch.arange(n, device=sent.device)
        left = self.n_words[sent] - leaves  # leaves still to write
        pos = leaves.clamp(max=self.word_id.size(1) - 1)
        free = ~pending
        can_open = (
            free
            & (~started | depth.gt(0))
            & left.ge(1)
            & (self.t.leaf_cost * left + depth + 2).le(remaining)
        )
        can_close = free & depth.gt(0) & nonempty & (depth.gt(1) | left.eq(0))
        can_leaf = self._leaf_due(state)
        mask = torch.zeros((n, self.t.V), dtype=torch.bool, device=sent.device)
        mask[:, self.t.open_idx] = can_open[:, None]
        if self.t.scheme == "words":
            word = self.word_id[sent, pos]
            mask[rows, word] |= can_leaf
        else:  # a tag (or XX) first
            mask[:, self.t.tag_idx] = self.t.classes[self.leaf_class[sent, pos]] & can_leaf[:, None]
            if self.t.scheme == "tags_words":
                word = self.word_id[sent, pos]
                mask[rows, word] |= pending
        top = stack.gather(1, (depth - 1).clamp(min=0)[:, None]).squeeze(1)
        mask[rows, top] |= can_close
        mask[:, EOS] = depth.eq(0) & left.eq(0) & (started | self.n_words[sent].eq(0)) & free
        return mask

    def _leaf_due(self, state: tuple) -> Tensor:
        """Rows where a leaf may come next (with "tags_words": its tag; the word follows it)."""
        sent, depth, leaves, _, _, pending, _ = state
        return ~pending & depth.gt(0) & (self.n_words[sent] - leaves).ge(1)

    def score(self, state: tuple, logp: Tensor, remaining: Tensor) -> Tensor:
        """`allowed`'s mask, and, in the word schemes, the leaf's word scored as any word.

        The source fixes which word a leaf writes, so the search has no choice among the word
        tokens: where the word is due, it takes the model's probability of writing a word there
        at all (logsumexp over the word tokens), the probability of the tree's shape. Scored by
        that one word's own probability, a model that cannot yet copy words well prefers to open
        phrase after phrase while the length allows (6x the gold brackets at update 1,000)."""
        scored = logp.masked_fill(~self.allowed(state, remaining), float("-inf"))
        if self.t.word_idx.numel():
            sent, pending = state[0], state[5]
            due = pending if self.t.scheme == "tags_words" else self._leaf_due(state)
            if due.any():  # a due word is allowed: its score becomes the word class's total
                rows = due.nonzero().squeeze(1)
                word = self.word_id[sent[rows], state[2][rows].clamp(max=self.word_id.size(1) - 1)]
                scored[rows, word] = (
                    logp.index_select(0, rows).index_select(1, self.t.word_idx).logsumexp(dim=1)
                )
        return scored


def leaf_tags(target: str, scheme: str) -> list[str]:
    """The leaf tags of one linearised target of a tag scheme, in order."""
    tags, expect_word = [], False
    for tok in target.split():
        if expect_word:
            expect_word = False
        elif not tok.startswith(("(", ")")):
            tags.append(tok)
            expect_word = scheme == "tags_words"
    return tags
