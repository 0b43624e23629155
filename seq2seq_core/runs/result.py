"""RUN_DIR/result.json read back: what a finished training chose and tested
(`s2s.core.training.result.write_result` writes it), checked before a sweep's table or a
command trusts it."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import DataError


def read_result(run_dir: Path) -> dict | None:
    """RUN_DIR/result.json as `write_result` wrote it, or None where the run has none yet.

    Raises DataError naming the file when it is not the object `write_result` writes: not JSON,
    not an object, an update that is not a count, test figures that are not figure -> number
    (one task) or member -> figures (several)."""
    path = Path(run_dir) / "result.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path} cannot be read ({e})") from None
    try:
        result = json.loads(text)
    except ValueError as e:
        raise DataError(f"{path} is not JSON ({e})") from None
    if not isinstance(result, dict):
        raise DataError(f"{path} holds a {type(result).__name__}, not a run's result object")
    update, test = result.get("update"), result.get("test", {})
    if not isinstance(update, int) or isinstance(update, bool) or update < 0:
        raise DataError(f'{path}: "update" is {update!r}, not a count of updates')
    if not isinstance(test, dict):
        raise DataError(f'{path}: "test" is {test!r}, not figures')
    several = test and "signature" not in test
    for member, figures in test.items() if several else [("", test)]:
        first = next(iter(figures.values()), None) if isinstance(figures, dict) else None
        if figures and not isinstance(first, (int, float)):
            where = f'"test" of member {member!r}' if member else '"test"'
            raise DataError(f"{path}: {where} is {figures!r}, not figure -> number")
    return result
