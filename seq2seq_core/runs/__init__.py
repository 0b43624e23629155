"""Runs: what a training leaves on disk and the processes it runs in, which inference reads and
uses without the Trainer: the run directory (`directory`), its checkpoints (`checkpoint`), a
checkpoint checked against the config that would use it (`agreement`), metrics.jsonl and
result.json read back (`metrics`, `result`), the processes and their device (`distributed`).
It stands between decode and training, and imports only the root and the contract."""
