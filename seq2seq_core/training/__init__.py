"""Training: the `Trainer` (section 5's update, the loop, validation and checkpoints on
schedule) and what it stands on: checkpoints and their agreement with a config, the run
directory and log, validation and the test at the end, fine-tuning's transfer, the member
schedule, processes, random streams and batch prefetch. Imports decode and the wings below."""
