"""Entry point: ``python -m sim``."""

import sys

from sim.cli import main

sys.exit(main())
