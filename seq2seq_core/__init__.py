"""s2s: a task-agnostic Transformer engine (Vaswani et al. 2017) and its task-plugin interface.

The public interface for plugin authors is what this module exports; see `task.Task`.

Importing s2s sets three defaults of the CPU runtime in the environment (`RUNTIME_ENV`; a value
already set wins). They take effect only when set before torch is first imported, so the `s2s`
command, the tests and the benchmarks import s2s first:
* GOMP_SPINCOUNT=1000: libgomp's threads spin for about 300,000 iterations at every barrier
  before they sleep; on a machine shared with other processes a spinning thread holds the core
  its partner needs, and each of the hundreds of small parallel regions of an update can then
  wait a whole scheduler time slice (measured: training 3.4x, beam search 12x slower on a busy
  2-core machine). A short spin keeps the benefit when the machine is idle.
* ONEDNN_PRIMITIVE_CACHE_CAPACITY=64: oneDNN keeps up to 1,024 compiled primitives, one per
  shape of a bf16 product, and nearly every training batch has a token count of its own, so the
  cache only grows with bf16 training's memory. 64 still holds the shapes that recur within a
  search.
* LRU_CACHE_CAPACITY=1: torch's bridge to oneDNN (ideep) keeps a cache of its own in front of
  oneDNN's, 1,024 entries by default, again one per bf16 product shape. Its entries are small
  but long-lived blocks allocated in the middle of each update, and they pin the heap: glibc
  can reuse the freed activations around them less and less, so bf16 training's peak grew
  update by update, and its updates slowed with the fresh pages they faulted in. oneDNN's own
  cache above still spares the compilation.
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

from .task import DataError, DecodeDefaults, Score, Task, TaskConfig
from .vocab import BOS, EOS, PAD, SPECIALS, UNK

__all__ = [
    "RUNTIME_ENV",
    "Task",
    "TaskConfig",
    "DecodeDefaults",
    "Score",
    "DataError",
    "SPECIALS",
    "PAD",
    "BOS",
    "EOS",
    "UNK",
]
__version__ = "0.1.0"
