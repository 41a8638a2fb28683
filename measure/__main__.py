"""Entry point: ``python -m measure`` (see :mod:`measure.cli`)."""

import sys

from measure.cli import main

if __name__ == "__main__":
    sys.exit(main())
