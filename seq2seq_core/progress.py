"""Progress bars on a terminal only: in a log file a bar is hundreds of carriage-return frames,
so there the periodic log lines (`run.log_interval`) are all that is written."""

from __future__ import annotations

import sys


def progress(quiet: bool = False, **kw):
    """A tqdm bar on stderr, disabled when `quiet` or when stderr is not a terminal."""
    from tqdm import tqdm

    return tqdm(disable=quiet or not sys.stderr.isatty(), file=sys.stderr, **kw)
