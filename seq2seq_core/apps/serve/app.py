"""The Starlette application: the endpoints, each a request typed (`bodies`) and checked
(`requests`), queued for the one decoding worker (`batcher`) and answered as JSON; every error
answered as {"error": "..."}. The body's size and counts are bounded while it is read and typed;
the checks that tokenise (sources, prefixes, terms, targets) run on a worker thread, so that
the event loop answers /health and other clients meanwhile."""

from __future__ import annotations

import asyncio
import logging
import queue
import time
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from .batcher import Job, ShuttingDown
from .bodies import MAX_WEIGHTS
from .requests import (
    ClientGone,
    bad,
    body_json,
    langs_of,
    measured,
    member_of,
    parsed,
    prefixes_of,
    targets_of,
    terms_of,
    wanted_of,
)
from .treesvg import parse, svg

log = logging.getLogger("s2s")

PAGE = Path(__file__).resolve().parent / "page"


class Service:
    """What the endpoints share: the members, the default one, the worker, the run's facts."""

    def __init__(self, batcher, members: dict, default: str | None, info: dict, hosts: list[str]):
        self.batcher, self.members, self.default, self.info = batcher, members, default, info
        self.hosts = hosts  # the Host header values answered (`allowed_hosts`)
        self.started = time.time()


def client_of(request) -> str:
    """Who sent a request, for taking turns: its address (behind a reverse proxy, the proxy's)."""
    return request.client.host if request.client else ""


async def _left(request) -> None:
    """Returns once the client has closed its connection (after its whole body was read)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def decoded(service: Service, job, request):
    """The worker's answer to `job`; a 503 (with Retry-After) when the queue is full or the
    server is stopping. When the client leaves first its job is dropped: the worker passes it
    over, or throws its part of a batch away."""
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


def answer(member, result: dict, sources, unknown, start: float, **more) -> JSONResponse:
    """A decoded request's answer: the task, the batcher's result, the sources as prepared, their
    unknown words, `more` (a parse's trees), and the timing with the request's total."""
    total_ms = round(1000 * (time.perf_counter() - start), 2)
    return JSONResponse(
        {
            "task": member.name,
            **result,
            "sources": sources,
            "unknown_words": unknown,
            **more,
            "timing": {**result["timing"], "total_ms": total_ms},
        }
    )


def build_app(service: Service):
    """The Starlette application serving `service`."""
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

    def generate_job(body, client: str):
        """The checked job of a /generate body (tokenising: CPU work, run off the event loop)."""
        member = member_of(service, body)
        settings = service.batcher.settings(member)
        wanted = wanted_of(body, settings.beam)
        langs = langs_of(body, member)
        sources, tokens, unknown = measured(member, body.text, max_positions)
        prefixes = prefixes_of(body, member, sources, settings, max_positions)
        terms = terms_of(body, member, sources, settings, max_positions)
        job = Job(
            member,
            sources,
            sum(tokens),
            wanted=wanted,
            prefixes=prefixes,
            terms=terms,
            client=client,
            langs=langs,
        )
        return member, job, sources, unknown

    async def generate(request):
        body = parsed(await body_json(request), "/generate")
        start = time.perf_counter()
        member, job, sources, unknown = await run_in_threadpool(
            generate_job, body, client_of(request)
        )
        result = await decoded(service, job, request)
        trees = [parse(h) for h in result["hypotheses"]]
        trees = [svg(t) if t else None for t in trees]
        return answer(member, result, sources, unknown, start, trees=trees)

    def score_job(body, client: str):
        """The checked job of a /score body (tokenising, off the event loop)."""
        member = member_of(service, body)
        sources, tokens, unknown = measured(member, body.text, max_positions)
        targets = targets_of(body, member, sources, max_positions)
        job = Job(member, sources, sum(tokens), targets=targets, client=client)
        return member, job, sources, unknown

    async def score(request):
        body = parsed(await body_json(request), "/score")
        start = time.perf_counter()
        member, job, sources, unknown = await run_in_threadpool(score_job, body, client_of(request))
        result = await decoded(service, job, request)
        return answer(member, result, sources, unknown, start)

    def attention_job(body, client: str):
        """The checked job of an /attention body (tokenising, off the event loop)."""
        member = member_of(service, body)
        layers = len(service.batcher.attending.decoder)
        layer = body.layer if body.layer is not None else layers
        if layer > layers:
            raise bad(
                400, f'"layer" {layer}: this model has {layers} layers (numbered 1 to {layers})'
            )
        sources, tokens, _ = measured(member, [body.text], max_positions, many=False)
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
        return Job(member, sources, tokens[0], attention_layer=layer, client=client)

    async def attention(request):
        body = parsed(await body_json(request), "/attention")
        job = await run_in_threadpool(attention_job, body, client_of(request))
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
    hosts = Middleware(TrustedHostMiddleware, allowed_hosts=service.hosts, www_redirect=False)
    return Starlette(
        routes=routes,
        middleware=[hosts],
        exception_handlers={HTTPException: error, ClientGone: gone, Exception: failed},
    )
