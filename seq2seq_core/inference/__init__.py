"""Inference: a trained run loaded for decoding (`loading`; `load_run` is the public way),
`s2s generate`'s file loop (`generate`), exports to other runtimes (`export`) and decoding with
them (`deployed`). Imports training and the wings below it."""

from .loading import Run, load_for_inference, load_run

__all__ = ["Run", "load_for_inference", "load_run"]
