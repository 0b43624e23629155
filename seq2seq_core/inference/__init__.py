"""Inference: a trained run loaded for decoding (`loading`; `load_run` is the public way),
`s2s generate`'s file loop (`generate`), the outside formats imported and exported (`formats`: a
module a format) and decoding with an export (`deployed`). Imports training and the wings below
it."""

from .loading import Run, load_for_inference, load_run

__all__ = ["Run", "load_for_inference", "load_run"]
