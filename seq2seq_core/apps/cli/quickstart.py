"""`s2s quickstart [key=value ...]`: train the offline demo end to end (no download), then print
its held-out score next to the copy baseline's, the figure a newcomer checks first."""

from __future__ import annotations

from .shared import config_of


def add(subparsers, common) -> None:
    text = (
        "train the offline demo (no download), then print its held-out BLEU next to the copy "
        "baseline's"
    )
    s = subparsers.add_parser("quickstart", parents=[common], help=text, description=text)
    s.add_argument(
        "overrides", nargs="*", metavar="key=value", help="override any field of the demo preset"
    )
    s.set_defaults(func=run, preset="demo")  # the preset `config_of` loads


def run(args) -> int:
    # the work imports torch: here, when the command runs, not at start-up (tests/test_house.py)
    from ..quickstart import quickstart

    cfg, reg = config_of(args)
    result = quickstart(cfg, reg, quiet=args.quiet)
    print(
        f"\ndemo ({result.mode}) on {result.sentences} held-out sentences, {result.seconds:.0f} s:"
    )
    print(f"  trained model  {result.trained}")
    print(f"  copy baseline  {result.baseline}")
    return 0
