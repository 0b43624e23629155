"""s2s: a task-agnostic Transformer engine (Vaswani et al. 2017) and its task-plugin interface.

The public interface for plugin authors is what this module exports; see `task.Task`.
"""
from .task import DataError, DecodeDefaults, Score, Task, TaskConfig
from .vocab import BOS, EOS, PAD, SPECIALS, UNK

__all__ = ["Task", "TaskConfig", "DecodeDefaults", "Score", "DataError", "SPECIALS", "PAD", "BOS", "EOS", "UNK"]
__version__ = "0.1.0"
