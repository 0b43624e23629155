"""Decoding: greedy and beam search of one batch with the length penalty and constraints
(`search`), and batched decoding of many lines, shared by validation, the test at the end of a
run, `s2s generate` and the server (`batched`). Imports nn and the wings below it."""
