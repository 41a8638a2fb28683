"""The test suite: one folder per package (``tests/<package>/``, subpackages likewise), shared helpers in ``tests/support/``."""
