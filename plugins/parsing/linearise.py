"""Trees as token sequences (Vinyals et al. 2015, "Grammar as a Foreign Language") and back.

A tree is written depth first: "(NP" opens a phrase, ")NP" closes it, every pre-terminal is one
token, and the words stay on the source side:

    (TOP (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)))  <->  (S (NP XX XX )NP (VP XX )VP XX )S
    source: The dog barks .

Schemes (the task setting `scheme`):

* "vinyals": every part-of-speech tag becomes the placeholder XX, as in the paper.
  Rebuilt trees tag punctuation from the word (`punctuation_tags`), because EVALB decides which
  tokens are punctuation from each tree's own tags: a comma tagged XX would make the sentence a
  length mismatch, which EVALB counts as an error and leaves out of every total.
* "tags": the tag itself is the token (the tagger is the decoder); rebuilt trees keep the tags
  the model wrote.
* "words": the word itself is the token, "(S (NP The dog )NP (VP barks )VP . )S", so that the
  decoder, fed its own output, sees which word it stands at (and a constrained search writes
  each leaf as the next source word). Tags are dropped and rebuilt as for "vinyals".
* "tags_words": each leaf is two tokens, the tag then the word, "(S (NP DT The NN dog )NP ...":
  the decoder tags and sees the words; rebuilt trees keep the tags the model wrote.

The root bracket (`root_label`, TOP by default, which EVALB ignores) is not written when it
wraps a single phrase; `delinearise` puts it back.

`delinearise` turns ANY token sequence into a well-formed tree over exactly the given words and
says whether it had to repair: stray closing brackets and empty phrases are dropped, a closing
label that does not match closes the innermost open phrase all the same, phrases left open are
closed, surplus leaf tokens are dropped, missing ones are added (to the innermost open phrase,
else to the last top-level phrase if nothing follows it), unknown tokens count as leaves, and
several top-level pieces are gathered under one S. Words must not contain whitespace or
brackets (treebanks write -LRB- / -RRB-).
"""

from __future__ import annotations

from typing import Sequence

from s2s.core import SPECIALS

PLACEHOLDER = "XX"
SCHEMES = ("vinyals", "tags", "words", "tags_words")
WORD_SCHEMES = ("words", "tags_words")  # schemes whose targets carry the words
TAG_SCHEMES = ("tags", "tags_words")  # schemes whose targets carry the tags
UNKNOWN = SPECIALS[3]  # a word outside the target vocabulary, as the model writes it
FALLBACK_LABEL = "S"  # gathers several top-level pieces of a repaired output

# Words whose Penn Treebank tag is punctuation for EVALB (COLLINS.prm deletes , : `` '' .).
PUNCTUATION_TAGS = {
    ",": ",",
    ".": ".",
    "?": ".",
    "!": ".",
    ":": ":",
    ";": ":",
    "--": ":",
    "-": ":",
    "...": ":",
    "``": "``",
    "`": "``",
    "''": "''",
}


def punctuation_tags(words: Sequence[str]) -> list[str | None]:
    """The PTB punctuation tag of each word, or None for a word that is not punctuation.

    Decided from the words alone. "'" is a closing quote ('') after an opening "`" that is
    still open, and otherwise the possessive (POS, not punctuation), as in "investors' money".
    """
    tags: list[str | None] = []
    open_single = False
    for w in words:
        if w == "'":
            tags.append("''" if open_single else None)
            open_single = False
            continue
        tag = PUNCTUATION_TAGS.get(w)
        if w == "`":
            open_single = True
        tags.append(tag)
    return tags


def _is_preterminal(node) -> bool:
    return len(node) == 1 and isinstance(node[0], str)


def linearise(tree, scheme: str = "vinyals", root_label: str = "TOP") -> list[str]:
    """The token sequence of `tree` (an nltk.Tree, or anything with .label() and children).

    Iterative (an explicit stack), so that a tree of any depth can be written.
    """
    _check(scheme)
    if (
        tree.label() == root_label
        and len(tree) == 1
        and not isinstance(tree[0], str)
        and not _is_preterminal(tree[0])
        and tree[0].label() != root_label
    ):
        tree = tree[0]  # delinearise puts the root back
    out: list[str] = []
    todo = [tree]  # nodes to write, and closing tokens (str) to emit, last first
    while todo:
        node = todo.pop()
        if isinstance(node, str):
            out.append(node)
        elif _is_preterminal(node):
            if scheme in TAG_SCHEMES:
                out.append(node.label())
            if scheme in WORD_SCHEMES:
                out.append(node[0])
            elif scheme == "vinyals":
                out.append(PLACEHOLDER)
        else:
            out.append("(" + node.label())
            todo.append(")" + node.label())
            todo.extend(reversed(node))
    return out


class _Node:
    __slots__ = ("label", "children")

    def __init__(self, label: str):
        self.label, self.children = label, []

    def to_string(self, words: Sequence[str], tags: Sequence[str]) -> str:
        """The bracketed tree, written iteratively (any depth)."""
        parts: list[str] = []
        todo: list = [self]  # nodes, word indices, and ")" to emit, last first
        while todo:
            item = todo.pop()
            if isinstance(item, str):
                parts.append(item)
            elif isinstance(item, int):
                parts.append(f" ({tags[item]} {words[item]})")
            else:
                parts.append(("(" if item is self else " (") + item.label)
                todo.append(")")
                todo.extend(reversed(item.children))
        return "".join(parts)


def delinearise(
    tokens: Sequence[str] | str,
    words: Sequence[str] | str,
    scheme: str = "vinyals",
    root_label: str = "TOP",
) -> tuple[str, bool]:
    """A one-line bracketed tree over exactly `words`, and whether `tokens` needed repair."""
    _check(scheme)
    tokens = tokens.split() if isinstance(tokens, str) else list(tokens)
    words = words.split() if isinstance(words, str) else list(words)
    if not words:
        return "", bool(tokens)
    repaired = False
    tags = [PLACEHOLDER] * len(words)
    top: list = []  # top-level pieces: _Node or word index
    stack: list[_Node] = []
    n = 0  # words placed

    def attach(item) -> None:
        (stack[-1].children if stack else top).append(item)

    leaf_word = False  # tags_words: a tag was read, its word comes next
    for tok in tokens:
        if leaf_word:
            leaf_word = False
            repaired |= tok != words[n - 1] and tok != UNKNOWN
            continue
        if tok.startswith("("):
            label = tok[1:]
            if not label or "(" in label or ")" in label:
                repaired = True
                continue
            stack.append(_Node(label))
        elif tok.startswith(")"):
            if not stack:
                repaired = True  # stray closer
                continue
            node = stack.pop()
            if tok[1:] != node.label:
                repaired = True
            if node.children:
                attach(node)
            else:
                repaired = True  # empty phrase
        else:
            if n == len(words):
                repaired = True  # more leaves than words
                continue
            if scheme == "vinyals":
                repaired |= tok != PLACEHOLDER
                tok = PLACEHOLDER
            elif scheme == "words":
                repaired |= tok != words[n] and tok != UNKNOWN
                tok = PLACEHOLDER
            elif "(" in tok or ")" in tok:
                repaired, tok = True, PLACEHOLDER
            leaf_word = scheme == "tags_words"
            tags[n] = tok
            attach(n)
            n += 1
    repaired |= leaf_word  # a tag without its word
    if n < len(words):  # fewer leaves than words
        repaired = True
        home = stack[-1] if stack else top[-1] if top and isinstance(top[-1], _Node) else None
        for i in range(n, len(words)):
            (home.children if home is not None else top).append(i)
    if stack:
        repaired = True
        while stack:
            node = stack.pop()
            if node.children:
                attach(node)
    if len(top) == 1 and isinstance(top[0], _Node):
        tree = top[0]
    else:  # several pieces, or leaves only
        repaired = True
        tree = _Node(FALLBACK_LABEL)
        tree.children = top
    if root_label and tree.label != root_label:
        wrapper = _Node(root_label)
        wrapper.children = [tree]
        tree = wrapper
    if scheme not in TAG_SCHEMES:
        for i, tag in enumerate(punctuation_tags(words)):
            if tag is not None:
                tags[i] = tag
    return tree.to_string(words, tags), repaired


def _check(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown linearisation scheme {scheme!r}; known: {', '.join(SCHEMES)}")
