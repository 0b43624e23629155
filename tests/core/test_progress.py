"""Progress bars appear on a terminal only; a log file gets the periodic log lines instead."""

from __future__ import annotations

import io
import sys

from s2s.core.progress import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bars_only_on_a_terminal(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress(total=3, desc="x") as bar:
        assert bar.disable
        bar.update(3)
    assert sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", _Terminal())
    with progress(total=3, desc="x") as bar:
        assert not bar.disable
        bar.update(3)
    assert "3/3" in sys.stderr.getvalue()
    with progress(True, total=3, desc="x") as bar:  # --quiet
        assert bar.disable
