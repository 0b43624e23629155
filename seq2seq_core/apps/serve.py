"""`s2s serve RUN_DIR`: a trained run behind HTTP, and a page to try it in a browser.

Built on Starlette (routing, requests, JSON responses) and uvicorn (the HTTP server): two small,
well-kept libraries, pure Python, that pull in no torch of their own. Endpoints:

    GET  /            the page (apps/page: HTML, a script and a style sheet; no build step)
    GET  /health      {"status": "ok", ...} once the model is loaded
    GET  /info        the run: its tasks (members), the checkpoint, decoding settings, limits
    POST /generate    {"text": [sentence, ...], "task": MEMBER?, "nbest": N?, "sampling":
                      {"temperature", "top_k", "top_p", "epsilon", "seed"}?, "mbr": "chrf" |
                      "bleu"?, "prefixes": [...]?, "terms": [[s,
                      t], ...]?} -> {"hypotheses", "scores", "nbest"?, "unknown_words", "trees",
                      "timing"}: `s2s generate`'s output lines (docs/decoding.md has the options)
    POST /score       {"text": [sentence, ...], "targets": [output, ...], "task": MEMBER?} ->
                      {"scores": [{"logprob", "score", "tokens", "token_logprobs"}, ...]}: the
                      model's log-probability of each given output (`s2s generate --score-targets`)
    POST /attention   {"text": sentence, "task": MEMBER?, "layer": L?} -> the encoder-decoder
                      attention weights of layer L (default: the last), every head (an
                      ensemble's: its first model's, over the ensemble's output)

Requests wait in one queue and one worker decodes them in batches up to a token budget
(`batcher`). A bad request gets a 4xx answer {"error": "..."} naming what is wrong, before it is
queued; the server goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, UsageError

log = logging.getLogger("s2s")

PAGE = Path(__file__).resolve().parent / "page"
MAX_SENTENCES = 64  # sentences a request
MAX_SAMPLES = 16  # outputs drawn a sentence ("sampling" with "nbest")
MAX_TERMS = 32  # source/target term pairs a request ("terms")
MAX_CHARS = 2000  # characters a sentence
MAX_BODY = 1 << 20  # bytes a request body
MAX_WEIGHTS = 400_000  # attention weights an /attention answer may hold (about 3 MB of JSON)
SHUTDOWN_SECONDS = 5  # on SIGTERM / SIGINT: the batch being decoded gets this long to finish
BATCH_TOKENS = 4096  # source tokens decoded together, summed over the requests of a batch


class Service:
    """What the endpoints share: the members, the default one, the worker, the run's facts."""

    def __init__(self, batcher, members: dict, default: str | None, info: dict, hosts: list[str]):
        self.batcher, self.members, self.default, self.info = batcher, members, default, info
        self.hosts = hosts  # the Host header values answered (`allowed_hosts`)
        self.started = time.time()


# -- requests ----------------------------------------------------------------------------------
def bad(status: int, message: str, retry_after: int | None = None):
    """An HTTP error answered as {"error": message} (with Retry-After seconds, for a 503)."""
    from starlette.exceptions import HTTPException

    headers = None if retry_after is None else {"Retry-After": str(retry_after)}
    return HTTPException(status, message, headers=headers)


async def body_json(request) -> dict:
    """The request's JSON object, or a 4xx: empty, too large, not UTF-8, not JSON, not an object."""
    from starlette.requests import ClientDisconnect

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
    import difflib

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


def member_of(service: Service, data: dict):
    """The member a request names ("task"), else the default; a 4xx for an unknown one."""
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
    from ..decode.mbr import UTILITIES
    from ..decode.search import Sampling, Wanted

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
    from ..decode.given import prefix_problem

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
    from ..decode.given import checked_terms
    from ..decode.terminology import line_terms, placeable

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
    from ..decode.given import model_targets

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
    from ..decode.batched import prepared_sources, unknown_words

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


def client_of(request) -> str:
    """Who sent a request, for taking turns: its address (behind a reverse proxy, the proxy's)."""
    return request.client.host if request.client else ""


class ClientGone(Exception):
    """The client closed its connection before its answer: nothing is sent."""


async def _left(request) -> None:
    """Returns once the client has closed its connection (after its whole body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def decoded(service: Service, job, request):
    """The worker's answer to `job`; a 503 (with Retry-After) when the queue is full or the
    server is stopping. When the client leaves first its job is dropped: the worker passes it
    over, or throws its part of a batch away."""
    from .batcher import ShuttingDown

    try:
        answer = asyncio.wrap_future(service.batcher.submit(job))
    except queue.Full:
        raise bad(503, "the server is busy (its queue is full): try again shortly", 1) from None
    except ShuttingDown:
        raise bad(503, "the server is stopping", 5) from None
    gone = asyncio.ensure_future(_left(request))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not answer.done():
        answer.cancel()  # the job's future too: the worker passes it over
        raise ClientGone()
    try:
        return answer.result()
    except ShuttingDown:
        raise bad(503, "the server is stopping: try again shortly", 5) from None


# -- endpoints ---------------------------------------------------------------------------------
def build_app(service: Service):
    """The Starlette application serving `service`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.responses import FileResponse, JSONResponse, Response
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from .batcher import Job
    from .treesvg import parse, svg

    max_positions = service.batcher.model.max_positions

    async def page(request):
        return FileResponse(PAGE / "index.html")

    async def health(request):
        return JSONResponse(
            {
                "status": "ok",
                "queued": service.batcher.waiting(),
                "uptime_s": round(time.time() - service.started, 1),
                **service.batcher.decoded,
            }
        )

    async def info(request):
        return JSONResponse(service.info)

    async def generate(request):
        data = await body_json(request)
        known_fields(data, "/generate")
        member = member_of(service, data)
        lines = sentences(data)
        start = time.perf_counter()
        settings = service.batcher.settings(member)
        wanted = wanted_of(data, settings.beam)
        sources, tokens, unknown = measured(member, lines, max_positions)
        prefixes = prefixes_of(data, member, sources, settings, max_positions)
        terms = terms_of(data, member, sources, settings, max_positions)
        job = Job(
            member,
            sources,
            sum(tokens),
            wanted=wanted,
            prefixes=prefixes,
            terms=terms,
            client=client_of(request),
        )
        result = await decoded(service, job, request)
        trees = [parse(h) for h in result["hypotheses"]]
        return JSONResponse(
            {
                "task": member.name,
                **result,
                "sources": sources,
                "unknown_words": unknown,
                "trees": [svg(t) if t else None for t in trees],
                "timing": {
                    **result["timing"],
                    "total_ms": round(1000 * (time.perf_counter() - start), 2),
                },
            }
        )

    async def score(request):
        data = await body_json(request)
        known_fields(data, "/score")
        member = member_of(service, data)
        lines = sentences(data)
        start = time.perf_counter()
        sources, tokens, unknown = measured(member, lines, max_positions)
        targets = targets_of(data, member, sources, max_positions)
        job = Job(member, sources, sum(tokens), targets=targets, client=client_of(request))
        result = await decoded(service, job, request)
        return JSONResponse(
            {
                "task": member.name,
                **result,
                "sources": sources,
                "unknown_words": unknown,
                "timing": {
                    **result["timing"],
                    "total_ms": round(1000 * (time.perf_counter() - start), 2),
                },
            }
        )

    async def attention(request):
        data = await body_json(request)
        known_fields(data, "/attention")
        member = member_of(service, data)
        lines = sentences(data, many=False)
        layers = len(service.batcher.attending.decoder)
        layer = data.get("layer", layers)
        if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= layers:
            raise bad(
                400,
                f'"layer" {json.dumps(layer)[:40]}: this model has {layers} layers (numbered 1 to '
                f"{layers})",
            )
        sources, tokens, _ = measured(member, lines, max_positions, many=False)
        settings = service.batcher.settings(member)
        most = int(settings.max_len_a * tokens[0] + settings.max_len_b) + 1
        weights = service.batcher.cfg.model.heads * tokens[0] * most
        if weights > MAX_WEIGHTS:
            raise bad(
                413,
                f'"text": its attention could hold {weights:,} weights ({tokens[0]} source '
                f"tokens, up to {most} output tokens, every head); at most {MAX_WEIGHTS:,} a "
                "request: send a shorter sentence",
            )
        job = Job(member, sources, tokens[0], attention_layer=layer, client=client_of(request))
        return JSONResponse(await decoded(service, job, request))

    async def error(request, exc: HTTPException):
        return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    async def gone(request, exc: ClientGone):
        log.info(
            "a client left before its answer (%s %s): its work was dropped",
            request.method,
            request.url.path,
        )
        return Response(status_code=499)

    async def failed(request, exc: Exception):
        return JSONResponse(
            {"error": f"internal error: {type(exc).__name__}: {exc}"}, status_code=500
        )

    routes = [
        Route("/", page),
        Route("/health", health),
        Route("/info", info),
        Route("/generate", generate, methods=["POST"]),
        Route("/score", score, methods=["POST"]),
        Route("/attention", attention, methods=["POST"]),
        Mount("/page", StaticFiles(directory=PAGE), name="page"),
    ]
    from starlette.middleware import Middleware
    from starlette.middleware.trustedhost import TrustedHostMiddleware

    hosts = Middleware(TrustedHostMiddleware, allowed_hosts=service.hosts, www_redirect=False)
    return Starlette(
        routes=routes,
        middleware=[hosts],
        exception_handlers={HTTPException: error, ClientGone: gone, Exception: failed},
    )


# -- the command -------------------------------------------------------------------------------
def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port), or a UsageError naming them (taken, not an address here)."""
    if not 0 <= port <= 65535:
        raise UsageError(f"--port {port}: a port is a number from 0 (any free one) to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)  # now: a second server on this port fails here, before its model loads
    except OSError as e:
        sock.close()
        raise UsageError(
            f"--host {host} --port {port}: cannot listen there ({e.strerror or e})"
        ) from None
    return sock


@dataclass(frozen=True)
class ServeOptions:
    """How `s2s serve` serves a run: its command-line options, the defaults being the command's."""

    task: str | None = None  # the member a request gets when it names none (None: the only one)
    host: str = "127.0.0.1"  # the address to listen on
    port: int = 8000  # 0: any free port
    threads: int | None = None  # torch threads for decoding (None: run.threads)
    precision: str | None = None  # decode.precision of the model searched with
    overrides: tuple[str, ...] = ()  # key=value, over the run's config.yaml
    quiet: bool = False  # no access log; uvicorn's warnings only
    allowed_hosts: tuple[str, ...] = ()  # Host header values answered besides this machine's
    ensemble: tuple[str, ...] = ()  # more runs decoded with this one as an ensemble (one member)
    max_connections: int | None = None  # open connections at once (None: `Limits`' default)
    client_seconds: float | None = None  # to send a request, to read an answer (None: default)


def allowed_hosts(host: str, extra: tuple[str, ...]) -> list[str]:
    """The Host header values the server answers (without the port): this machine's loopback
    names, the address it listens on, and `extra` (the names a reverse proxy or a network
    uses; "*": any). Any other Host is refused (400), so that a page of another site, after
    rebinding its own name to this address, cannot read or drive the server."""
    for name in extra:
        problem = host_name_problem(name)
        if problem:
            raise UsageError(f"--allowed-hosts {name!r}: {problem}")
    names = ["localhost", "127.0.0.1", "::1", "[::1]"]
    if host not in ("0.0.0.0", "::", ""):
        names += [host, f"[{host}]" if ":" in host else host]
    return list(dict.fromkeys([*names, *extra]))


def host_name_problem(name: str) -> str | None:
    """What keeps `name` from matching a request's Host header as `--allowed-hosts` compares
    it (the name alone, its port dropped; "*" any, "*.example.org" any below it), or None."""
    import ipaddress

    bare = name.strip("[]")
    example = name.split("://", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0] or "mt.example.org"
    if not name.strip() or any(c.isspace() for c in name):
        return "a host name, not empty and without spaces (e.g. mt.example.org)"
    if "://" in name or "/" in name:
        return f"a host name alone, without a scheme or a path (e.g. {example})"
    if ":" in name:
        try:
            ipaddress.IPv6Address(bare)
        except ValueError:
            return (
                f"a host name without a port (e.g. {example}): the Host header's port is not "
                "compared, so a name with one never matches"
            )
    if "*" in name[1:] or (name.startswith("*") and name != "*" and not name.startswith("*.")):
        return 'a wildcard only as "*" (any host) or "*.example.org" (any name below it)'
    return None


def serve(path, registry, options: ServeOptions) -> None:
    """Load the run at `path` (as `s2s generate` does) and serve it on options.host:options.port
    until interrupted."""
    import torch
    import uvicorn

    from ..data.members import build_members, decode_settings, load_vocabularies
    from ..inference import load_for_inference
    from ..inference.loading import load_ensemble
    from ..nn.precision import resolve_search
    from ..setup.config import load_config
    from ..runs.checkpoint import tested
    from ..runs.distributed import resolve_device
    from ..runs.directory import run_dir_of
    from .batcher import Batcher
    from .connections import Limits, guarded

    if options.threads is not None and options.threads < 1:
        raise UsageError(f"--threads {options.threads}: at least 1")
    if options.max_connections is not None and options.max_connections < 1:
        raise UsageError(f"--max-connections {options.max_connections}: at least 1")
    if options.client_seconds is not None and not 0 < options.client_seconds < float("inf"):
        raise UsageError(f"--client-seconds {options.client_seconds}: a number of seconds > 0")
    hosts = allowed_hosts(options.host, options.allowed_hosts)  # a bad name: before any work
    given = {"connections": options.max_connections, "client_seconds": options.client_seconds}
    limits = Limits(**{k: v for k, v in given.items() if v is not None})
    sock = listening_socket(options.host, options.port)  # a taken port fails before the model loads
    precision = [f"decode.precision={options.precision}"] if options.precision else []
    overrides = [*options.overrides, *precision]
    run_dir = run_dir_of(path)
    cfg = load_config(run_dir / "config.yaml", list(overrides), registry=registry)
    names = list(cfg.tasks) if cfg.tasks is not None else [cfg.task.name]
    task = options.task or names[0]
    if options.ensemble:  # the members an ensemble serves: the one its runs were checked for
        runs = [path, *options.ensemble]
        cfg, member, model = load_ensemble(runs, registry, overrides, task)
        names = [member.name]
    else:
        cfg, member, model = load_for_inference(path, registry, overrides, task)
    members = {member.name: member}
    if len(names) > 1:  # every member, in the run's id space, beside the one loaded with the model
        others = build_members(cfg, registry)
        load_vocabularies(others, run_dir)
        members = {m.name: (member if m.name == member.name else m) for m in others}
    for m in members.values():
        beam = decode_settings(m, cfg.decode).beam
        if beam > m.task.tgt_vocab_size:
            raise ConfigError(
                f"decode.beam={beam}: the beam is larger than task {m.name!r}'s target vocabulary "
                f"({m.task.tgt_vocab_size} tokens)"
            )
    torch.set_num_threads(options.threads or cfg.run.threads or torch.get_num_threads())
    checkpoint = Path(path) if Path(path).is_file() else tested(run_dir)[1]
    batcher = Batcher(model, cfg, BATCH_TOKENS)
    searched_in = resolve_search(cfg.decode.precision, resolve_device(cfg.run.device))
    info = {
        "run_dir": str(run_dir),
        "checkpoint": str(checkpoint),
        "ensemble": [str(run_dir_of(p)) for p in options.ensemble],  # beside run_dir
        "tasks": list(members),
        "default_task": options.task or (names[0] if len(names) == 1 else None),
        "decode": {
            name: {**vars(decode_settings(m, cfg.decode)), "precision": searched_in}
            for name, m in members.items()
        },
        "threads": torch.get_num_threads(),
        "layers": len(batcher.attending.decoder),
        "limits": {
            "sentences": MAX_SENTENCES,
            "characters": MAX_CHARS,
            "tokens": model.max_positions,
            "batch_tokens": BATCH_TOKENS,
            "nbest": {name: decode_settings(m, cfg.decode).beam for name, m in members.items()},
            "samples": MAX_SAMPLES,
            "terms": MAX_TERMS,
            "body_bytes": MAX_BODY,
            "attention_weights": MAX_WEIGHTS,
            "queued_requests": batcher.max_queued,
            **vars(limits),
            "shutdown_seconds": SHUTDOWN_SECONDS,
        },
    }
    info["allowed_hosts"] = hosts
    service = Service(batcher, members, info["default_task"], info, info["allowed_hosts"])
    bound = sock.getsockname()
    address = f"[{bound[0]}]" if ":" in bound[0] else bound[0]  # an IPv6 address, as URLs write it
    with_others = f" + {', '.join(info['ensemble'])}" if options.ensemble else ""
    print(
        f"s2s serve: {run_dir}{with_others} ({', '.join(members)}; {checkpoint.name}) on "
        f"http://{address}:{bound[1]}/",
        file=sys.stderr,
        flush=True,
    )
    config = uvicorn.Config(
        build_app(service),
        http=guarded(limits),  # uvicorn's h11 protocol, its connections bounded
        log_level="warning" if options.quiet else "info",
        access_log=not options.quiet,
        timeout_graceful_shutdown=SHUTDOWN_SECONDS,
    )
    stopping_server(config, batcher).run(sockets=[sock])


def stopping_server(config, batcher):
    """uvicorn's server for `config` that, on SIGTERM or SIGINT, answers every request still
    waiting for the worker with a JSON 503 at once, then stops as uvicorn does (the batch being
    decoded gets SHUTDOWN_SECONDS to finish)."""
    import uvicorn

    class Stopping(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                waiting = batcher.stop()
                log.info("stopping: %d waiting request(s) answered 503", waiting)
            super().handle_exit(sig, frame)

    return Stopping(config)
