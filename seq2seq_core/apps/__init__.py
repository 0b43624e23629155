"""What a user runs: the `s2s` command (`cli/`, a module per command that parses, calls and
prints), the work behind it that no lower wing holds (the quickstart, scoring files, sweeps, the
server with its page and tree drawing, attention maps, learning-curve plots) and the words a
command ends with (`summary`). The top wing: imports any wing below, and nothing imports it."""
