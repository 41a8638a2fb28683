"""Where llama.cpp's ``llama-server`` is: the one place that looks it up.

By default the project's own build (``python -m measure build-llamacpp``, the
source the pinned llama-cpp-python vendors): its ``llama-server`` through
:func:`measure.engines.llamacpp_native.build.tool_path`. That build loads its
CPU backend at run time from its compiled-in ``GGML_BACKEND_DIR`` (the build's
``backends/``), where :func:`measure.engines.llamacpp_native.probe.check_installed`
links the variant it has seen decode on this CPU; so before the server starts,
the same check runs (cached per build and CPU) and its outcome goes to
``run.json``. No environment is set for the child: the directory is compiled
in, and the tools find their libraries by their RPATH.

An override, for a llama-server of one's own: ``--llama-server PATH`` or
``$SPECSCOPE_LLAMA_SERVER`` (the flag wins); it is run as it is, unchecked.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ENV = "SPECSCOPE_LLAMA_SERVER"
FLAG = "--llama-server"


@dataclass(frozen=True)
class ServerBinary:
    """The ``llama-server`` a run starts, where it was found, and (for the project's build) what was checked."""

    path: Path
    source: str  # "build", "flag" or "env"
    build: dict | None = None
    selection: dict | None = None

    def describe(self) -> dict:
        """For ``run.json``'s ``server``."""
        return {"binary": str(self.path), "found_by": self.source, "build": self.build,
                "cpu_backend": self.selection}


def _executable(p: Path, what: str) -> Path:
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise ValueError(f"{what}={str(p)!r} is not an executable file; give a llama-server binary, or drop it to "
                         "use the project's build")
    return p


def server_binary(flag_value: str | None = None) -> ServerBinary:
    """The ``llama-server`` to start: ``flag_value``, else ``$SPECSCOPE_LLAMA_SERVER``, else the project's build.

    One-line ``ValueError`` when there is none, naming the build command.
    """
    if flag_value:
        return ServerBinary(_executable(Path(flag_value), FLAG), "flag")
    given = os.environ.get(ENV)
    if given:
        return ServerBinary(_executable(Path(given), f"${ENV}"), "env")
    from measure.engines.llamacpp_native.build import BUILD_COMMAND, tool_path

    try:
        path = tool_path("llama-server")
    except ValueError:
        raise ValueError(f"llama-server not found: build llama.cpp's tools with {BUILD_COMMAND} (about 10 min "
                         f"on 2 cores), or give one with {FLAG} PATH / ${ENV}") from None
    return ServerBinary(path, "build")


def checked(binary: ServerBinary, model: Path) -> ServerBinary:
    """``binary`` with the project's build checked on this CPU with ``model`` (its CPU backend selected);
    an override is returned as it is. One-line ``ValueError`` when no CPU backend of the build runs here."""
    if binary.source != "build":
        return binary
    from measure.engines.llamacpp_native.probe import LibraryCrashed, check_installed

    try:
        info = check_installed(model)
    except LibraryCrashed as e:
        raise ValueError(str(e)) from None
    return ServerBinary(binary.path, binary.source, info.get("build"), info.get("selection"))


def server_version(binary: Path) -> str:
    """``llama-server --version`` in one line (recorded in run.json); ``unknown`` when it says nothing."""
    try:
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ValueError(f"{binary} does not run: {e}") from None
    lines = [ln.strip() for ln in (out.stdout + out.stderr).splitlines() if ln.strip()]
    keep = [ln for ln in lines if ln.startswith(("version:", "built with"))]
    return "; ".join(keep or lines[-2:]) or "unknown"
