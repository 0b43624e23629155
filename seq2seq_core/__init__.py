"""s2s: a task-agnostic Transformer engine (Vaswani et al. 2017) and its task-plugin interface.

The public interface for plugin authors is what this module exports (`__all__`), and a plugin
imports from here alone: the task contract (`Task`, see its docstring), the allowed values of
its settings (`setting`, `one_of`, ...), per-sentence statistics of its metric
(`SentenceStatistics`), the tokenizers it may use (`WordTokenizer`, `CharTokenizer`,
`Subwords`, `Pieces`, `MosesBPE`, or its own on `Tokenizer`), the special ids, the errors it
raises, and the one way to read and write text (`read_lines`, `atomic_write_text`).

Importing s2s sets three defaults of the CPU runtime in the environment (`RUNTIME_ENV`; a value
already set wins). They take effect only when set before torch is first imported, so the `s2s`
command, the tests and the benchmarks import s2s first:
* GOMP_SPINCOUNT=1000: libgomp's threads spin for about 300,000 iterations at every barrier
  before they sleep; on a machine shared with other processes a spinning thread holds the core
  its partner needs, and each of the hundreds of small parallel regions of an update can then
  wait a whole scheduler time slice (measured: training 3.4x, beam search 12x slower on a busy
  2-core machine). A short spin keeps the benefit when the machine is idle.
* ONEDNN_PRIMITIVE_CACHE_CAPACITY=64: oneDNN keeps up to 1,024 compiled primitives, one per
  shape of a bf16 product, each holding buffers in proportion to its rows, so a full cache
  grows bf16 training's memory by hundreds of megabytes. 64 still holds the shapes that recur
  within a search and most of a training update's, whose row counts are padded to few
  (s2s.core.nn.precision.RowPaddedLinear).
* LRU_CACHE_CAPACITY=1: torch's bridge to oneDNN (ideep) keeps a cache of its own in front of
  oneDNN's, 1,024 entries by default, again one per bf16 product shape. Its entries are small
  but long-lived blocks allocated in the middle of each update, and they pin the heap: glibc
  can reuse the freed activations around them less and less, so bf16 training's peak grew
  update by update, and its updates slowed with the fresh pages they faulted in. oneDNN's own
  cache above still spares the compilation.
It also sets two parameters of glibc's malloc (`MALLOC_SETTINGS`, by mallopt: glibc reads its
environment only when a process starts), so that the memory an update frees serves the next:
* M_MMAP_THRESHOLD 32 MiB: blocks up to 32 MiB come from the heap. glibc starts at 128 KiB and
  slides the threshold up to 32 MiB as mapped blocks are freed.
* M_TRIM_THRESHOLD 1 GiB: the free top of the heap is kept, not handed back to the system
  whenever it exceeds twice the sliding threshold.
Otherwise an update's large tensors (a gradient of the shared embedding is 8 MiB) fault fresh
pages in, one fault per 4 KiB, every update; in a virtual machine a fault costs microseconds.
MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_ or GLIBC_TUNABLES set at start win.
The figures of each: docs/training-at-scale.md, "CPU runtime defaults".
"""

import os as _os

RUNTIME_ENV = {
    "GOMP_SPINCOUNT": "1000",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY": "64",
    "LRU_CACHE_CAPACITY": "1",
}
for _name, _value in RUNTIME_ENV.items():
    _os.environ.setdefault(_name, _value)

#: glibc's malloc parameters set at import: the environment variable glibc reads for each at a
#: process's start -> (mallopt's parameter number, value)
MALLOC_SETTINGS = {
    "MALLOC_MMAP_THRESHOLD_": (-3, 32 << 20),  # M_MMAP_THRESHOLD
    "MALLOC_TRIM_THRESHOLD_": (-1, 1 << 30),  # M_TRIM_THRESHOLD
}


def _keep_freed_memory() -> list[str]:
    """Set MALLOC_SETTINGS where glibc is the allocator and the environment has not set them
    at start; returns the names set."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no C library to load, or not glibc's (macOS)
        return []
    tunables = _os.environ.get("GLIBC_TUNABLES", "")
    done = []
    for name, (param, value) in MALLOC_SETTINGS.items():
        tunable = "glibc.malloc." + name.removeprefix("MALLOC_").rstrip("_").lower()
        if name not in _os.environ and tunable not in tunables and mallopt(param, value) == 1:
            done.append(name)
    return done


MALLOC_SET = _keep_freed_memory()

from .contract.checks import Allowed, above, at_least, in_range, one_of, setting
from .contract.resampling import SentenceStatistics, f_measure, joined, sacrebleu_statistics
from .contract.conformance import task_checks
from .contract.task import CONTRACT_VERSION, Constraint, DecodeDefaults, Score, Task, TaskConfig
from .errors import CheckFailed, ConfigError, DataError
from .files import atomic_write_text
from .textio import read_lines
from .tokenizers import (
    BOS,
    EOS,
    PAD,
    SPECIALS,
    UNK,
    CharTokenizer,
    MosesBPE,
    Pieces,
    Shareable,
    Subwords,
    Tokenizer,
    TokenList,
    Vocabulary,
    WordTokenizer,
)

__all__ = [
    "RUNTIME_ENV",
    "MALLOC_SETTINGS",
    "MALLOC_SET",
    "CONTRACT_VERSION",
    "Task",
    "TaskConfig",
    "DecodeDefaults",
    "Score",
    "Constraint",
    "setting",
    "Allowed",
    "one_of",
    "at_least",
    "above",
    "in_range",
    "SentenceStatistics",
    "joined",
    "sacrebleu_statistics",
    "f_measure",
    "ConfigError",
    "DataError",
    "atomic_write_text",
    "read_lines",
    "SPECIALS",
    "PAD",
    "BOS",
    "EOS",
    "UNK",
    "Vocabulary",
    "Shareable",
    "Tokenizer",
    "TokenList",
    "WordTokenizer",
    "CharTokenizer",
    "Subwords",
    "Pieces",
    "MosesBPE",
    "task_checks",
    "CheckFailed",
]
__version__ = "0.1.0"
