"""`python -m s2s.core.apps.cli ...`: the `s2s` command (torchrun starts it this way)."""

import sys

from . import main

sys.exit(main())
