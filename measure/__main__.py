"""Entry point: ``python -m measure`` (see :mod:`measure.cli`).

With ``--engine llamacpp`` it asks OpenMP runtimes for passive waiting before
anything loads one: llama.cpp's CPU backend and torch each run an OpenMP
runtime, and their idle threads spinning against each other on a small CPU
made llama.cpp decoding 10-40x slower and erratic in a sweep (the runtime
reads the setting once, when it loads). A user's own setting is kept.
"""

import os
import sys

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--engine=llamacpp" in argv or any(a == "--engine" and b == "llamacpp" for a, b in zip(argv, argv[1:])):
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from measure.cli import main

    sys.exit(main())
