"""Where llama.cpp's ``llama-server`` is: the one place that looks it up.

Until the project-owned llama.cpp build lands, :func:`server_binary` takes
``$SPECSCOPE_LLAMA_SERVER`` or the ``llama-server`` on ``PATH``; switching to
the build's own lookup is a change of this function only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ENV = "SPECSCOPE_LLAMA_SERVER"
BUILD_HINT = ("build llama.cpp's tools from the pinned source (docs/guides/serving.md, 'The server') or point "
              f"${ENV} at a llama-server binary")


def server_binary() -> Path:
    """The ``llama-server`` executable; a one-line ``ValueError`` saying how to get one when there is none."""
    given = os.environ.get(ENV)
    if given:
        p = Path(given)
        if not (p.is_file() and os.access(p, os.X_OK)):
            raise ValueError(f"${ENV}={given!r} is not an executable file; {BUILD_HINT}")
        return p
    found = shutil.which("llama-server")
    if found is None:
        raise ValueError(f"llama-server not found (no ${ENV}, none on PATH); {BUILD_HINT}")
    return Path(found)


def server_version(binary: Path) -> str:
    """``llama-server --version`` in one line (recorded in run.json); ``unknown`` when it says nothing."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"{binary} does not run: {e}") from None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    keep = [ln for ln in lines if ln.startswith(("version:", "built with"))]
    return "; ".join(keep or lines[-2:]) or "unknown"
