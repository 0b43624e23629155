"""Benchmarks of s2s beside other toolkits: imports decoded by both, exports read back."""
