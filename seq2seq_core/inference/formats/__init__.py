"""Outside formats, one module each, holding its import and its export (docs/pretrained.md)."""
