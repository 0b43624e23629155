"""`python -m s2s.core.apps.cli ...`: the `s2s` command, for a Python without the console script
on its PATH (the tests start it so); torchrun starts the console script (`--no-python s2s`)."""

import sys

from . import main

sys.exit(main())
