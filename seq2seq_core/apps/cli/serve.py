"""`s2s serve RUN_DIR`: serve a trained run over HTTP until interrupted: POST /generate answers
`s2s generate`'s output lines for JSON requests, GET / is a page to try it (docs/serve.md)."""

from __future__ import annotations

from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "serve",
        parents=[common],
        help="serve a run over HTTP: JSON requests and a page (docs/serve.md)",
        description='Serve the model `s2s generate RUN_DIR` uses: POST /generate {"text": [...]} '
        "answers its output lines, GET / is a page to try it. See docs/serve.md.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (or a checkpoint file in one)")
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="e.g. decode.beam=1 run.device=cpu"
    )
    s.add_argument(
        "--task",
        metavar="MEMBER",
        help="the member a request gets when it names none (a multi-task "
        'run serves every member; requests choose with "task")',
    )
    s.add_argument(
        "--ensemble",
        nargs="+",
        default=[],
        metavar="RUN_DIR",
        help="more runs decoded together with RUN_DIR as one model, averaging their "
        "probabilities (one task: --task's; docs/decoding.md)",
    )
    s.add_argument(
        "--host",
        default="127.0.0.1",
        help="the address to listen on (default 127.0.0.1: this machine only)",
    )
    s.add_argument(
        "--allowed-hosts",
        dest="allowed_hosts",
        nargs="+",
        default=[],
        metavar="NAME",
        help="Host header values to answer besides localhost and the --host address, e.g. the "
        'name a reverse proxy forwards ("*": any); other Hosts get 400 (docs/serve.md)',
    )
    s.add_argument(
        "--port", type=int, default=8000, help="default 8000; 0: any free port (printed)"
    )
    s.add_argument(
        "--threads", type=int, metavar="N", help="torch threads for decoding (default: run.threads)"
    )
    s.add_argument(
        "--max-connections",
        dest="max_connections",
        type=int,
        metavar="N",
        help="open connections at once; one more is answered 503 (default 256)",
    )
    s.add_argument(
        "--client-seconds",
        dest="client_seconds",
        type=float,
        metavar="S",
        help="a client's time to send a whole request and to read a buffered answer (default 10)",
    )
    s.add_argument(
        "--precision",
        choices=["auto", "fp32", "bf16", "int8"],
        help="the model searched with (decode.precision; default auto: bf16 where native)",
    )
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ..serve.server import ServeOptions, serve

    options = ServeOptions(
        task=args.task,
        host=args.host,
        port=args.port,
        threads=args.threads,
        precision=args.precision,
        overrides=tuple(args.overrides),
        quiet=args.quiet,
        allowed_hosts=tuple(args.allowed_hosts),
        ensemble=tuple(args.ensemble),
        max_connections=args.max_connections,
        client_seconds=args.client_seconds,
    )
    serve(args.run_dir, registry_of(args), options)
    return 0
