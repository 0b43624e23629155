"""`s2s attention RUN_DIR --input FILE --output DIR`: decode each input line as `s2s generate`
does and draw every attention's weights over (source, hypothesis) as PNG pages, with each
line's weights as JSON (docs/attention.md); then list the files written."""

from __future__ import annotations

import contextlib
import sys

from ..summary import written_lines
from .shared import registry_of


def add(subparsers, common) -> None:
    s = subparsers.add_parser(
        "attention",
        parents=[common],
        help="draw a run's attention weights for input lines (PNG, JSON)",
        description="Decode each line as `s2s generate` does, run the model over (source, "
        "hypothesis) and draw every attention's weights, tokens on both axes. "
        "See docs/attention.md.",
    )
    s.add_argument("run_dir", help="a run directory of `s2s train` (or a checkpoint file in one)")
    s.add_argument("overrides", nargs="*", metavar="key=value", help="e.g. run.device=cpu")
    s.add_argument("--input", required=True, help="source lines")
    s.add_argument("--output", required=True, help="the folder for the PNG and JSON files")
    s.add_argument("--task", metavar="MEMBER", help="the member of a multi-task run")
    s.add_argument("--layer", metavar="L", type=int, help="only layer L (from 1)")
    s.add_argument(
        "--head",
        metavar="H",
        type=int,
        help="a page for head H alone (from 1); default: all heads on a page",
    )
    s.add_argument("--beam", metavar="N", type=int, help="the search's beam")
    s.set_defaults(func=run)


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ..attention_maps import AttentionRequest, draw_attention

    request = AttentionRequest(
        input=args.input,
        output=args.output,
        task=args.task,
        layer=args.layer,
        head=args.head,
        beam=args.beam,
        overrides=tuple(args.overrides),
    )
    stdout = sys.stdout  # the paths written; what a plugin prints meanwhile goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        paths = draw_attention(args.run_dir, registry_of(args), request)
    use = (
        "a PNG per input line, attention and layer; each line's weights as JSON (docs/attention.md)"
    )
    stdout.write("\n".join(written_lines(paths, use)) + "\n")
    return 0
