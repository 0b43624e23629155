"""What a user runs: the `s2s` command (`cli`), sweeps, the server with its page and tree
drawing, attention maps, learning-curve plots and the words a command ends with (`summary`).
The top wing: imports any wing below, and nothing imports it."""
