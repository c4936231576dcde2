"""`python -m aiayn.cli`: the `aiayn` command without its console script."""

import sys

from aiayn.cli import main

sys.exit(main())
