"""A request's body read and checked, each field against the run and the limits (`bodies`); a bad
one is a 4xx naming the field and value (`bad`), answered before anything is queued."""

from __future__ import annotations

import json
import math

from starlette.exceptions import HTTPException
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from ...decode.batched import prepared_sources, unknown_words
from ...decode.given import checked_terms, model_targets, prefix_problem
from ...decode.sampling import Sampling
from ...decode.search import Wanted
from ...decode.terminology import SAMPLING_REFUSED, line_terms, placeable
from ...tokenizers.pieces import language_problem
from ...errors import DataError, UsageError
from .bodies import BODIES, MAX_BODY, MAX_SAMPLES, MAX_TERMS, complaint, json_shown


def bad(status: int, message: str, retry_after: int | None = None):
    """An HTTP error answered as {"error": message} (with Retry-After seconds, for a 503)."""
    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return HTTPException(status, message, headers=headers)


#: the one media type a request body may have: a browser sends no other cross-site without
#: asking first (a page's "simple" POST is text/plain or a form), so no web page a user visits
#: can drive the server
JSON_TYPE = "application/json"


async def body_json(request) -> dict:
    """The request's JSON object, or a 4xx: not sent as application/json (415), empty, too
    large, not UTF-8, not JSON, a key repeated in an object, not an object."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != JSON_TYPE:
        shown = json.dumps(media)[:60] if media else "none"
        raise bad(
            415,
            f"request body of Content-Type {shown}: send it as {JSON_TYPE} "
            "(curl: -H 'Content-Type: application/json')",
        )
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
        data = json.loads(
            text,
            parse_constant=_not_a_number,
            parse_float=_finite_float,
            object_pairs_hook=_unique_keys,
        )
    except NotANumber as e:
        raise bad(400, f"request body holds {e}, which is not a JSON number: send a finite one")
    except RepeatedKey as e:
        raise bad(400, f"request body repeats the key {e} in one object: send each key once")
    except ValueError as e:
        raise bad(400, f"request body is not JSON: {e}") from None
    except RecursionError:
        raise bad(400, "request body is JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise bad(400, f'request body is {json_shown(data)}, not an object {{"text": [...]}}')
    return data


class NotANumber(ValueError):
    """A number JSON has no room for: Infinity, NaN (which Python's reader takes), 1e999."""


class RepeatedKey(ValueError):
    """A key given twice in one JSON object, whose first value Python's reader would drop."""


def _unique_keys(pairs: list) -> dict:
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise RepeatedKey(json.dumps(key)[:60])
        seen.add(key)
    return dict(pairs)


def _not_a_number(name: str):
    raise NotANumber(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise NotANumber(f"{text[:40]} (beyond a float's range)")
    return value


def parsed(data: dict, endpoint: str):
    """`data` (a request's JSON object) as `endpoint`'s typed body (`bodies`); a 4xx naming the
    field and the value pydantic refused."""
    try:
        return BODIES[endpoint].model_validate(data)
    except ValidationError as e:
        raise bad(*complaint(endpoint, e.errors(include_url=False))) from None


def member_of(service, body):
    """The member of `service` (an `app.Service`) a request names ("task"), else the default;
    a 400 for an unknown one."""
    name = body.task if body.task is not None else service.default
    if name is None:
        raise bad(
            400, f'this run has several tasks ({", ".join(service.members)}): name one with "task"'
        )
    if name not in service.members:
        raise bad(
            400,
            f'"task" {json.dumps(name)[:60]}: this run\'s tasks are {", ".join(service.members)}',
        )
    return service.members[name]


def wanted_of(body, beam: int):
    """The request's "nbest" (at most the beam; drawn: MAX_SAMPLES) and "sampling" (bounded as
    `s2s generate` bounds it), as a `Wanted`; a 400 naming the field and value."""
    n, drawn, mbr = body.nbest, body.sampling, body.mbr
    most = MAX_SAMPLES if drawn is not None else beam
    if n > most:
        why = f"at most {MAX_SAMPLES} drawn" if drawn is not None else f"at most the beam ({beam})"
        raise bad(400, f'"nbest" {n}: {why}')
    if mbr is not None and n < 2:
        raise bad(400, f'"mbr" {json.dumps(mbr)}: needs "nbest" 2 or more (the candidates)')
    method = body.mbr_method
    if method is not None and mbr is None:
        raise bad(400, f'"mbr_method" {json.dumps(method)}: computes "mbr", which is not given')
    if drawn is not None and body.terms:
        raise bad(400, f'"sampling" with "terms": {SAMPLING_REFUSED}')
    method = method or "pairwise"
    if drawn is None:
        return Wanted(n, mbr=mbr, mbr_method=method)
    sampling = Sampling(**drawn.model_dump())
    problem = sampling.problem()  # the bounds `s2s generate` and the Python API check
    if problem:
        raise bad(400, f'"sampling": {problem}')
    return Wanted(n, sampling, mbr=mbr, mbr_method=method)


def prefixes_of(body, member, sources: list[str], settings, max_positions: int):
    """The request's "prefixes": one string a sentence, each usable (`prefix_problem`), or None."""
    prefixes = body.prefixes
    if prefixes is None:
        return None
    if len(prefixes) != len(sources):
        raise bad(
            400,
            f'"prefixes" holds {len(prefixes)} strings: send one a sentence of "text" '
            f'({len(sources)}; "" for none)',
        )
    for i, (source, prefix) in enumerate(zip(sources, prefixes)):
        problem = prefix_problem(member, source, prefix, settings, max_positions)
        if problem:
            raise bad(400, f'"prefixes"[{i}]: {problem}')
    return prefixes


def terms_of(body, member, sources: list[str], settings, max_positions: int):
    """The request's "terms" ([source term, target term] pairs; at most MAX_TERMS once identical
    ones are merged) as each sentence's target spellings, or None; a 400 naming what is wrong
    (`checked_terms`: a special token, an unspellable term, a source term with two targets),
    before any decoding."""
    pairs = body.terms
    if pairs is None:
        return None
    if not member.terminology:
        raise bad(400, f'"terms": task {member.name!r} writes no target words for source terms')
    different = len({(" ".join(s.split()), " ".join(t.split())) for s, t in pairs})
    if different > MAX_TERMS:  # counted before any term is tokenised
        raise bad(400, f'"terms" holds {different} different pairs; at most {MAX_TERMS} a request')
    try:
        pairs = checked_terms(member, pairs, lambda i: f'"terms"[{i}]')
    except UsageError as e:
        raise bad(400, str(e)) from None
    found = line_terms(member, sources, pairs)
    for i, (source, terms) in enumerate(zip(sources, found)):
        if placeable(member, source, terms, settings, max_positions) < len(terms):
            raise bad(400, f'"text"[{i}]: its terms do not fit its output\'s length limit together')
    return [[spellings for _, _, spellings in terms] for terms in found]


def targets_of(body, member, sources: list[str], max_positions: int) -> list[list[int]]:
    """The request's "targets", one output a sentence, as the model writes it (`model_targets`:
    a parser's tree linearised) in target ids (a word the vocabulary lacks scores as <unk>, as
    in `s2s generate --score-targets`); a 400 (413) naming the entry that is not a one-line
    string, not an output of the task, holds a special token, or is too long for the model."""
    targets, count = body.targets, len(sources)
    if len(targets) != count:
        raise bad(
            400,
            f'"targets" holds {len(targets)} strings: send the output to score for each sentence '
            f'of "text" ({count})',
        )
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


def langs_of(body, member) -> tuple[str, str]:
    """The request's "src_lang" and "tgt_lang" ("" where it gives none: the run's), each one a
    language of the model (else a 400 naming the nearest)."""
    langs = []
    for key, side in (("src_lang", "src_vocab"), ("tgt_lang", "tgt_vocab")):
        lang = getattr(body, key, None) or ""
        problem = lang and language_problem(getattr(member.task, side, None), lang)
        if problem:
            raise bad(400, f'"{key}" {lang!r}{problem}')
        langs.append(lang)
    return tuple(langs)


def measured(
    member, lines: list[str], max_positions: int, many: bool = True
) -> tuple[list[str], list[int], list]:
    """(sources as the task prepares them, their token counts, the unknown words of each); a 413
    for a sentence longer than the model's positions."""
    sources = prepared_sources(member, lines)
    try:
        ids = member.encode_source(sources)
    except DataError as e:  # a multilingual model's language code typed into the text
        raise bad(400, f'"text": {e}') from None
    for i, seq in enumerate(ids):
        if len(seq) + 1 > max_positions:
            where = f'"text"[{i}]' if many else '"text"'
            raise bad(
                413,
                f"{where} has {len(seq) + 1} source tokens; the model takes at most "
                f"{max_positions} (model.max_positions)",
            )
    return (
        sources,
        [len(seq) + 1 for seq in ids],
        [unknown_words(member, s, seq) for s, seq in zip(sources, ids)],
    )


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""
