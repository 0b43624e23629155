"""A request's body read and checked, each field against the run and the limits below; a bad
one is a 4xx naming the field and value (`bad`), answered before anything is queued."""

from __future__ import annotations

import difflib
import json
import math

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from ...decode.batched import prepared_sources, unknown_words
from ...decode.given import checked_terms, model_targets, prefix_problem
from ...decode.mbr import UTILITIES
from ...decode.sampling import Sampling
from ...decode.search import Wanted
from ...decode.terminology import line_terms, placeable
from ...errors import UsageError

MAX_SENTENCES = 64  # sentences a request
MAX_SAMPLES = 16  # outputs drawn a sentence ("sampling" with "nbest")
MAX_TERMS = 32  # source/target term pairs a request ("terms")
MAX_CHARS = 2000  # characters a sentence
MAX_BODY = 1 << 20  # bytes a request body
MAX_WEIGHTS = 400_000  # attention weights an /attention answer may hold (about 3 MB of JSON)


def bad(status: int, message: str, retry_after: int | None = None):
    """An HTTP error answered as {"error": message} (with Retry-After seconds, for a 503)."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return HTTPException(status, message, headers=headers)


async def body_json(request) -> dict:
    """The request's JSON object, or a 4xx: empty, too large, not UTF-8, not JSON, not an object."""
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise bad(413, f"request body over {MAX_BODY} bytes")
    except ClientDisconnect:
        raise ClientGone() from None
    if not body.strip():
        raise bad(400, 'empty request body: send a JSON object, {"text": ["a sentence", ...]}')
    try:
        text = bytes(body).decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad(
            400, f"request body is not valid UTF-8 (byte {e.start}: {body[e.start]:#04x})"
        ) from None
    try:
        data = json.loads(text, parse_constant=_not_a_number, parse_float=_finite_float)
    except NotANumber as e:
        raise bad(400, f"request body holds {e}, which is not a JSON number: send a finite one")
    except ValueError as e:
        raise bad(400, f"request body is not JSON: {e}") from None
    except RecursionError:
        raise bad(400, "request body is JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise bad(
            400, f'request body is a JSON {type(data).__name__}, not an object {{"text": [...]}}'
        )
    return data


class NotANumber(ValueError):
    """A number JSON has no room for: Infinity, NaN (which Python's reader takes), 1e999."""


def _not_a_number(name: str):
    raise NotANumber(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotANumber(f"{text[:40]} (beyond a float's range)")
    return value


#: the fields each endpoint reads; any other is refused, naming the nearest (a misspelt "nbset"
#: would otherwise be ignored and the answer silently not the one asked for)
FIELDS = {
    "/generate": ("text", "task", "nbest", "sampling", "mbr", "prefixes", "terms"),
    "/score": ("text", "targets", "task"),
    "/attention": ("text", "task", "layer"),
    '"sampling"': ("temperature", "top_k", "top_p", "epsilon", "seed"),
}


def known_fields(data: dict, where: str) -> None:
    """A 400 for a field of `data` that `where` (an endpoint, or "sampling") does not read,
    naming the nearest one it does."""
    fields = FIELDS[where]
    for key in data:
        if key not in fields:
            near = difflib.get_close_matches(str(key), fields, n=1, cutoff=0.5)
            hint = f' (did you mean "{near[0]}"?)' if near else ""
            raise bad(
                400,
                f"{json.dumps(key)[:40]} is not a field of {where}{hint}: its fields are "
                f"{', '.join(fields)}",
            )


def member_of(service, data: dict):
    """The member of `service` (an `app.Service`) a request names ("task"), else the default;
    a 4xx for an unknown one."""
    name = data.get("task", service.default)
    if name is None:
        raise bad(
            400, f'this run has several tasks ({", ".join(service.members)}): name one with "task"'
        )
    if not isinstance(name, str) or name not in service.members:
        raise bad(
            400,
            f'"task" {json.dumps(name)[:60]}: this run\'s tasks are {", ".join(service.members)}',
        )
    return service.members[name]


def sentences(data: dict, many: bool = True) -> list[str]:
    """The request's "text": a non-empty list of at most MAX_SENTENCES strings (`many`), or one
    string."""
    if "text" not in data:
        raise bad(400, 'no "text" in the request: send {"text": ["a sentence", ...]}')
    text = data["text"]
    if not many:
        text = [text] if isinstance(text, str) else text
        if not isinstance(text, list) or len(text) != 1:
            raise bad(400, '"text" must be one sentence (a string)')
    if not isinstance(text, list):
        raise bad(
            400, f'"text" is a JSON {type(text).__name__}: send a list of sentences (strings)'
        )
    if not text:
        raise bad(400, '"text" is an empty list: send at least one sentence')
    if len(text) > MAX_SENTENCES:
        raise bad(413, f'"text" holds {len(text)} sentences; at most {MAX_SENTENCES} a request')
    for i, s in enumerate(text):
        where = f'"text"[{i}]' if many else '"text"'
        if not isinstance(s, str):
            raise bad(400, f"{where} is a JSON {type(s).__name__}, not a string")
        if len(s) > MAX_CHARS:
            raise bad(413, f"{where} has {len(s)} characters; at most {MAX_CHARS} a sentence")
        if "\n" in s or "\r" in s:
            raise bad(400, f"{where} holds a line break: send one sentence a string")
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as e:
            raise bad(
                400, f"{where} is not valid UTF-8 text (a lone surrogate at character {e.start})"
            ) from None
    return text


SAMPLING = '"sampling"'


def wanted_of(data: dict, beam: int):
    """The request's "nbest" (1 to the beam; drawn: to MAX_SAMPLES) and "sampling" (an object of
    `Sampling`'s fields), as a `Wanted`; a 400 naming the field and value."""
    n = data.get("nbest", 1)
    drawn = data.get("sampling")
    most = MAX_SAMPLES if drawn is not None else beam
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= most:
        why = f"at most {MAX_SAMPLES} drawn" if drawn is not None else f"at most the beam ({beam})"
        raise bad(400, f'"nbest" {json.dumps(n)[:40]}: a whole number from 1, {why}')
    mbr = data.get("mbr")
    if mbr is not None and (mbr not in UTILITIES or n < 2):
        raise bad(
            400,
            f'"mbr" {json.dumps(mbr)[:40]}: one of {", ".join(map(json.dumps, UTILITIES))}, '
            'with "nbest" 2 or more (the candidates it chooses among)',
        )
    if drawn is None:
        return Wanted(n, mbr=mbr)
    if not isinstance(drawn, dict):
        raise bad(400, f'"sampling" must be an object with some of {", ".join(FIELDS[SAMPLING])}')
    known_fields(drawn, SAMPLING)
    whole = ("top_k", "seed")
    for key, value in drawn.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad(400, f'"sampling"."{key}" {json.dumps(value)[:40]}: a number')
        if key in whole and isinstance(value, float) and value != int(value):
            raise bad(400, f'"sampling"."{key}" {value}: a whole number')
    exact = lambda v: isinstance(v, float) and v.is_integer() and abs(v) <= 2**53  # noqa: E731
    sampling = Sampling(**{k: int(v) if k in whole and exact(v) else v for k, v in drawn.items()})
    problem = sampling.problem()  # the bounds `s2s generate` and the Python API check
    if problem:
        raise bad(400, f'"sampling": {problem}')
    sampling = Sampling(
        float(sampling.temperature),
        sampling.top_k,
        float(sampling.top_p),
        sampling.seed,
        float(sampling.epsilon),
    )
    return Wanted(n, sampling, mbr=mbr)


def prefixes_of(data: dict, member, sources: list[str], settings, max_positions: int):
    """The request's "prefixes": one string a sentence, each usable (`prefix_problem`), or None."""
    prefixes = data.get("prefixes")
    if prefixes is None:
        return None
    if (
        not isinstance(prefixes, list)
        or len(prefixes) != len(sources)
        or not all(isinstance(p, str) and len(p) <= MAX_CHARS for p in prefixes)
    ):
        raise bad(
            400,
            f'"prefixes" must be a list of {len(sources)} strings of at most {MAX_CHARS} '
            'characters, one a sentence ("" for none)',
        )
    for i, (source, prefix) in enumerate(zip(sources, prefixes)):
        problem = prefix_problem(member, source, prefix, settings, max_positions)
        if problem:
            raise bad(400, f'"prefixes"[{i}]: {problem}')
    return prefixes


def terms_of(data: dict, member, sources: list[str], settings, max_positions: int):
    """The request's "terms" ([source term, target term] pairs; at most MAX_TERMS once identical
    ones are merged) as each sentence's target spellings, or None; a 400 naming what is wrong
    (`checked_terms`: a special token, an unspellable term, a source term with two targets),
    before any decoding."""
    pairs = data.get("terms")
    if pairs is None:
        return None
    if not member.terminology:
        raise bad(400, f'"terms": task {member.name!r} writes no target words for source terms')
    if not isinstance(pairs, list) or not all(
        isinstance(p, list)
        and len(p) == 2
        and all(isinstance(x, str) and x.strip() and len(x) <= MAX_CHARS for x in p)
        for p in pairs
    ):
        raise bad(
            400,
            f'"terms" must be a list of at most {MAX_TERMS} [source term, target term] pairs of '
            f"non-empty strings (of at most {MAX_CHARS} characters)",
        )
    try:
        pairs = checked_terms(member, pairs, lambda i: f'"terms"[{i}]')
    except UsageError as e:
        raise bad(400, str(e)) from None
    if len(pairs) > MAX_TERMS:
        raise bad(400, f'"terms" holds {len(pairs)} different pairs; at most {MAX_TERMS} a request')
    found = line_terms(member, sources, pairs)
    for i, (source, terms) in enumerate(zip(sources, found)):
        if placeable(member, source, terms, settings, max_positions) < len(terms):
            raise bad(400, f'"text"[{i}]: its terms do not fit its output\'s length limit together')
    return [[spellings for _, _, spellings in terms] for terms in found]


def targets_of(data: dict, member, sources: list[str], max_positions: int) -> list[list[int]]:
    """The request's "targets", one output a sentence, as the model writes it (`model_targets`:
    a parser's tree linearised) in target ids (a word the vocabulary lacks scores as <unk>, as
    in `s2s generate --score-targets`); a 400 (413) naming the entry that is not a one-line
    string, not an output of the task, holds a special token, or is too long for the model."""
    targets, count = data.get("targets"), len(sources)
    if (
        not isinstance(targets, list)
        or len(targets) != count
        or not all(isinstance(t, str) and len(t) <= MAX_CHARS for t in targets)
    ):
        raise bad(
            400,
            f'"targets" must be a list of {count} strings of at most {MAX_CHARS} characters, '
            'the output to score for each sentence of "text"',
        )
    for i, target in enumerate(targets):
        if "\n" in target or "\r" in target:
            raise bad(400, f'"targets"[{i}] holds a line break: send one output a string')
    try:
        targets = model_targets(member, sources, targets, lambda i: f'"targets"[{i}]')
    except UsageError as e:
        raise bad(400, str(e)) from None
    ids = member.encode_target(targets)
    for i, seq in enumerate(ids):
        if len(seq) + 1 > max_positions:
            raise bad(
                413,
                f'"targets"[{i}] has {len(seq) + 1} target tokens; the model takes at most '
                f"{max_positions} (model.max_positions)",
            )
    return ids


def measured(
    member, lines: list[str], max_positions: int, many: bool = True
) -> tuple[list[str], list[int], list]:
    """(sources as the task prepares them, their token counts, the unknown words of each); a 413
    for a sentence longer than the model's positions."""
    sources = prepared_sources(member, lines)
    ids = member.encode_source(sources)
    for i, seq in enumerate(ids):
        if len(seq) + 1 > max_positions:
            where = f'"text"[{i}]' if many else '"text"'
            raise bad(
                413,
                f"{where} has {len(seq) + 1} source tokens; the model takes at most "
                f"{max_positions} "
                "(model.max_positions)",
            )
    return (
        sources,
        [len(seq) + 1 for seq in ids],
        [unknown_words(member, s, seq) for s, seq in zip(sources, ids)],
    )


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""
