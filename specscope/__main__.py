"""Entry point: ``python -m specscope`` (the same as the ``specscope`` console script)."""

import sys

from specscope.cli import main

sys.exit(main())
