"""Entry point: ``python -m measure`` (see :mod:`measure.cli`).

Nothing of an engine's runtime is set here: llama.cpp runs in a process of its
own (:mod:`measure.engines.llamacpp_native.worker`) with the environment the
user gave, as their own ``Llama(...)`` would.
"""

import sys

if __name__ == "__main__":
    from measure.cli import main

    sys.exit(main())
