"""Training: the `Trainer` (section 5's update, the loop, validation and checkpoints on
schedule) and what it stands on: the run's log, validation and the test at the end,
fine-tuning's transfer, the member schedule, random streams and batch prefetch; it writes its
run directory through `runs`. Imports runs and the wings below."""
