"""`s2s serve`'s work: the listening socket and the Host names answered checked first, then the
run loaded as `s2s generate` loads it, its facts (`/info`), and uvicorn serving the application
until SIGTERM or SIGINT."""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import uvicorn

from ...data.members import build_members, decode_settings, load_vocabularies
from ...errors import ConfigError, UsageError
from ...inference import load_for_inference
from ...inference.loading import load_ensemble
from ...nn.precision import resolve_search
from ...runs.checkpoint import task_origins, tested
from ...runs.directory import run_dir_of
from ...runs.distributed import resolve_device
from ...setup.config import load_config
from .app import Service, build_app
from .batcher import Batcher
from .connections import Limits, guarded
from .bodies import (
    MAX_BODY,
    MAX_CHARS,
    MAX_SAMPLES,
    MAX_SENTENCES,
    MAX_TERMS,
    MAX_WEIGHTS,
    MAX_TERM_PAIRS,
)

log = logging.getLogger("s2s")

SHUTDOWN_SECONDS = 5  # on SIGTERM / SIGINT: the batch being decoded gets this long to finish
BATCH_TOKENS = 4096  # source tokens decoded together, summed over the requests of a batch


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
    registry.adopt(task_origins(run_dir), run_dir)  # its tasks, without --plugin
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
            "term_pairs": MAX_TERM_PAIRS,
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

    class Stopping(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            if not self.should_exit:
                waiting = batcher.stop()
                log.info("stopping: %d waiting request(s) answered 503", waiting)
            super().handle_exit(sig, frame)

    return Stopping(config)
