"""Set llama.cpp up for this virtualenv: build (or take from the cache), install the bindings, check a variant.

What ``python -m measure build-llamacpp`` runs (and both README commands,
through the Makefile): :func:`measure.engines.llamacpp_native.build.build`,
then llama-cpp-python's Python package over that build, then the check
decode that picks the CPU variant this machine runs
(:func:`measure.engines.llamacpp_native.probe.select_variant`).
"""

from __future__ import annotations

from dataclasses import dataclass

from measure.engines.llamacpp_native.build import TOOLS, Build, BuildSpec, _compiler, build, install_bindings
from measure.engines.llamacpp_native.probe import Selection, select_variant


@dataclass(frozen=True)
class Installed:
    """A build, where its tools are, and the CPU variant checked on this machine (None: no model to check with)."""

    build: Build
    selection: Selection | None

    def describe(self) -> dict:
        return {"build": self.build.describe(), "tools": {t: str(self.build.tool(t)) for t in TOOLS},
                "variant": None if self.selection is None else self.selection.variant}


def install(kind: str = "portable", jobs: int | None = None, extra_flags: tuple[str, ...] = (),
            force: bool = False, bindings: bool = True) -> Installed:
    """Build ``kind`` (from the cache when there), install the bindings over it, and select its CPU variant."""
    b = build(BuildSpec(kind=kind, extra_flags=tuple(extra_flags), compiler=_compiler()), jobs=jobs, force=force)
    if bindings:
        install_bindings(b)
    elif not b.variants():  # a native build's CPU backend is linked in: only its own bindings can check it
        return Installed(b, None)
    return Installed(b, select_variant(b, force=force))
