"""What a user gives the search besides source lines, checked one way for `s2s generate`, the
server and the Python API: target prefixes, terms (source term, target term), target lines to
score (read as the model writes them, `Task.output_target`: a parser's tree linearised).

A given token sequence is text, never the vocabulary's special tokens
(`s2s.core.SPECIALS` as the vocabulary reads them: </s> in a prefix ended the output
after its first part, <pad> emptied the line, a </s> target line was scored as the end token): each
is refused, naming it. Identical term pairs are merged (each copy counted against the length limit
and the server's bound before); one source term with two different targets is refused, since both
would be forced into every output. Each check returns what is wrong as text (or raises `UsageError`
whose message starts with where, `where(i)`), for the caller to name its file and line or its
request field.
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..errors import DataError, UsageError, plugin_error
from ..contract.task import DecodeDefaults, Task
from ..tokenizers import BOS, EOS, PAD, SPECIALS, UNK


def special_tokens(encode, text: str, unknown: bool = False) -> list[str]:
    """The special tokens `text` holds where `encode` (a task's `encode_source` or
    `encode_target`) reads them as such: <pad>, <s>, </s> by their ids, <unk> where the text
    writes it as a word (an unknown word also reads as <unk>, and is no special token), unless
    `unknown` (text a search wrote, whose <unk> is the model's unknown token)."""
    ids = encode([text])[0]
    found = [SPECIALS[i] for i in dict.fromkeys(ids) if i in (PAD, BOS, EOS)]
    if unknown:
        return found
    # a special's name written as a word, which the vocabulary reads as <unk> (s2s's own
    # tokenizers never read a special's name in text as the special itself)
    words = text.split()
    for name in SPECIALS:
        if name in words and name not in found and UNK in ids and encode([name])[0] == [UNK]:
            found.append(name)
    return found


def special_problem(encode, text: str, what: str, unknown: bool = False) -> str | None:
    """What is wrong with `text` (`what`: "the prefix", "the target term", ...) if it holds a
    special token (`unknown`: <unk> aside, `special_tokens`), or None."""
    found = special_tokens(encode, text, unknown)
    if not found:
        return None
    return (
        f"{what} {text[:60]!r} holds {', '.join(found)}: a special token of the vocabulary "
        f"({', '.join(SPECIALS)}), which no given text may hold"
    )


def prefix_problem(
    task: Task, source: str, prefix: str, settings: DecodeDefaults, max_positions: int
) -> str | None:
    """What makes `prefix` unusable for the outputs of `source` (a prepared source line), or
    None: a special token, a token the target vocabulary cannot spell (it reads as <unk>), or
    more tokens than the line's output may have (int(max_len_a * |x| + max_len_b), within the
    model's positions)."""
    if not prefix:
        return None
    special = special_problem(task.encode_target, prefix, "the prefix")
    if special:
        return special
    tokens = task.encode_target([prefix])[0]
    if UNK in tokens:
        return f"the target vocabulary cannot spell the prefix {prefix!r} (a token reads as <unk>)"
    src = len(task.encode_source([source])[0]) + 1
    limit = int(settings.max_len_a * src + settings.max_len_b)
    limit = max(0, min(limit, max_positions - 1))
    if len(tokens) > limit:
        return (
            f"the prefix has {len(tokens)} target tokens, but this line's output may have at "
            f"most {limit} (decode.max_len_a, max_len_b)"
        )
    return None


def model_targets(
    task: Task,
    sources: Sequence[str],
    targets: Sequence[str],
    where: Callable[[int], str],
    unknown: bool = False,
) -> list[str]:
    """The given target lines (outputs, as `s2s generate` writes them) as the model writes them
    (`Task.output_target`: a parser's trees linearised), to be scored; a UsageError starting
    with `where(i)` for a line that is no output of the task or holds a special token (a word
    the vocabulary lacks is scored as <unk>, as the model writes it; with `unknown`, a <unk>
    written as a word too: a search's own output)."""
    out = []
    for i, (source, target) in enumerate(zip(sources, targets)):
        try:
            line = task.output_target(target, source)
        except DataError as e:
            raise UsageError(f"{where(i)}: not an output of the task: {e}") from None
        if not isinstance(line, str):
            raise plugin_error(task, "output_target", f"returned {type(line).__name__}, not a str")
        problem = special_problem(task.encode_target, line, "the target", unknown)
        if problem:
            raise UsageError(f"{where(i)}: {problem}")
        out.append(line)
    return out


def checked_terms(
    task: Task, pairs: Sequence[tuple[str, str]], where: Callable[[int], str]
) -> list[tuple[str, str]]:
    """The (source term, target term) pairs, stripped, identical pairs merged (the first kept,
    spacing aside); a UsageError starting with `where(i)` for pair i when its source term was
    given another target at an earlier pair, or when a side holds a special token or a token
    its vocabulary cannot spell."""
    kept: dict[str, tuple[int, str]] = {}  # source term -> (its first pair, its target)
    out = []
    for i, (source, target) in enumerate(pairs):
        source, target = " ".join(source.split()), " ".join(target.split())
        if source in kept:
            first, before = kept[source]
            if before != target:
                raise UsageError(
                    f"{where(i)}: the source term {source!r} is given the target {target!r} "
                    f"here and {before!r} at {where(first)}: one target a source term (both "
                    "would be forced into every output)"
                )
            continue  # the same pair again: once is enough
        for side, term in (("source", source), ("target", target)):
            problem = term_problem(task, side, term)
            if problem:
                raise UsageError(f"{where(i)}: {problem}")
        kept[source] = (i, target)
        out.append((source, target))
    return out


def term_problem(task: Task, side: str, term: str) -> str | None:
    """What makes a term of `side` ("source" or "target") unusable, or None: a special token,
    or a token its vocabulary cannot spell."""
    encode = task.encode_source if side == "source" else task.encode_target
    problem = special_problem(encode, term, f"the {side} term")
    if problem:
        return problem
    if UNK in encode([term if side == "source" else " " + term])[0]:
        return f"the {side} vocabulary cannot spell {term!r} (a token reads as <unk>)"
    return None


def line_targets(task: Task, line: str) -> list[str] | str:
    """The target terms of one line of a `--line-terms` file (TAB-separated, spacing within a
    term aside; a term given twice counts once; an empty line: none), or what is wrong."""
    terms = list(dict.fromkeys(" ".join(t.split()) for t in line.split("\t")))
    terms = [t for t in terms if t]
    for term in terms:
        problem = term_problem(task, "target", term)
        if problem:
            return problem
    return terms
