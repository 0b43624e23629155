"""Every error s2s reports to a user: each names the file, line, key or value at fault.

The command line prints an `S2SError` as one line and exits with 2; anything else is an
internal error. Each class also derives from the built-in exception its kind of failure is
(a `DataError` is a ValueError), so that library callers can catch either.
"""


class S2SError(Exception):
    """A failure s2s explains in its message: bad input, a bad setting, an unusable file."""


class ConfigError(S2SError, ValueError):
    """A setting that does not exist or has a value outside its range; names the key."""


class DataError(S2SError, ValueError):
    """Bad or missing input data; the message names the file (and line) at fault."""


class RegistryError(S2SError, LookupError):
    """A task name that no plugin registers, or a plugin that cannot be loaded."""


class TrainingError(S2SError, RuntimeError):
    """A run that cannot start or go on (run directory, splits that do not fit, non-finite
    updates)."""


class CheckpointError(S2SError, ValueError):
    """A checkpoint file that cannot be used; the message names the file."""


class ExportError(S2SError, ValueError):
    """A model that a format cannot express, or an export folder that cannot be written."""


class ImportModelError(S2SError, ValueError):
    """A model `s2s import` cannot read or express; the message names the file and key."""


class UsageError(S2SError):
    """A command line that cannot work (a missing input, an unwritable output, a bad option)."""


class CheckFailed(S2SError, AssertionError):
    """A task that fails a check of the conformance kit (`s2s.core.task_checks`,
    `s2s check-task`); the one line says what broke and where."""


class PluginError(S2SError):
    """A plugin that breaks the task contract; the message names the task, its class and file,
    and the method."""


def plugin_error(task, method: str, what: str) -> PluginError:
    """The error for `task`'s `method` breaking the contract (`task` may be a run's member)."""
    import sys

    cls = type(getattr(task, "task", task))
    where = getattr(sys.modules.get(cls.__module__), "__file__", None) or cls.__module__
    return PluginError(
        f"task {getattr(cls, 'name', '?')!r} ({cls.__qualname__} in {where}): its {method} {what}"
    )


#: what sets memory use, by command: named when memory runs out
MEMORY_SETTINGS = {
    "train": "data.max_tokens (or the model's size)",
    "quickstart": "data.max_tokens",
    "prepare": "data.max_tokens",
    "generate": "decode.max_sentences or --beam",
    "average": "the number of checkpoints averaged",
}


def explain(e: BaseException, command: str) -> tuple[str, int]:
    """The one-line message and exit code for an error: 2 for a known failure, 1 otherwise."""

    def first(x) -> str:
        return (str(x).strip().splitlines() or [type(x).__name__])[0]

    if isinstance(e, S2SError):
        return first(e), 2
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return (
            f"out of memory ({first(e)[:100]}): lower "
            f"{MEMORY_SETTINGS.get(command, 'the batch size')}",
            2,
        )
    if isinstance(e, OSError):
        return (f"{e.filename}: {e.strerror or first(e)}" if e.filename else first(e)), 2
    return f"internal error: {type(e).__name__}: {first(e)} (run with -v for the traceback)", 1
