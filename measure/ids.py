"""Identities of the run format: small frozen types with one parse/format pair (a cell's id on disk)."""

from __future__ import annotations

from dataclasses import dataclass

from sim.policies import GammaSpec


@dataclass(frozen=True)
class CellId:
    """The identity of a cell: ``draft=int8|gamma=fixed:4|temp=0|domain=code[|head_k=512]`` on disk."""

    draft: str
    gamma: GammaSpec
    temperature: float
    domain: str
    head_k: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.gamma, GammaSpec):
            raise ValueError(f"cell {self.draft!r}: gamma must be a GammaSpec (GammaSpec.parse), got {self.gamma!r}")

    def to_str(self) -> str:
        cid = f"draft={self.draft}|gamma={self.gamma.to_str()}|temp={float(self.temperature):g}|domain={self.domain}"
        if self.head_k is not None:
            cid += f"|head_k={int(self.head_k)}"
        return cid

    @classmethod
    def parse(cls, text: str) -> "CellId":
        """The inverse of :meth:`to_str`; one-line ``ValueError`` for anything else."""
        fields = {}
        for part in str(text).split("|"):
            key, sep, value = part.partition("=")
            if not sep or key in fields:
                raise ValueError(f"cell id {text!r}: bad part {part!r}")
            fields[key] = value
        need = ["draft", "gamma", "temp", "domain"]
        if list(fields)[:4] != need or set(fields) - {*need, "head_k"}:
            raise ValueError(f"cell id {text!r}: expected draft=..|gamma=..|temp=..|domain=..[|head_k=..]")
        try:
            head_k = int(fields["head_k"]) if "head_k" in fields else None
            return cls(fields["draft"], GammaSpec.parse(fields["gamma"]), float(fields["temp"]), fields["domain"],
                       head_k)
        except ValueError as e:
            raise ValueError(f"cell id {text!r}: {e}") from None


@dataclass(frozen=True)
class TreeCellId:
    """The identity of a tree-run cell: ``draft=int8|shape=[[0],[1],[0,0]]|temp=0|domain=code`` on disk.

    ``shape``: a ``--tree`` value in canonical form (a path list without spaces, or ``depth=D,topk=K,budget=N``),
    or ``gamma=G`` for a chain measured by the chain loop. Greedy only: ``temp`` is always 0.
    """

    draft: str
    shape: str
    domain: str

    def __post_init__(self) -> None:
        for name in ("draft", "shape", "domain"):
            if not getattr(self, name) or "|" in getattr(self, name):
                raise ValueError(f"tree cell {name} {getattr(self, name)!r}: must be non-empty, without '|'")

    def to_str(self) -> str:
        return f"draft={self.draft}|shape={self.shape}|temp=0|domain={self.domain}"

    @classmethod
    def parse(cls, text: str) -> "TreeCellId":
        """The inverse of :meth:`to_str`; one-line ``ValueError`` for anything else."""
        parts = [p.partition("=") for p in str(text).split("|")]
        if [k for k, _, _ in parts] != ["draft", "shape", "temp", "domain"] or parts[2][2] != "0":
            raise ValueError(f"tree cell id {text!r}: expected draft=..|shape=..|temp=0|domain=..")
        return cls(parts[0][2], parts[1][2], parts[3][2])


def cell_id(draft: str, gamma_policy: "str | GammaSpec", temperature: float, domain: str,
            head_k: int | None = None) -> str:
    """Stable id of a cell, e.g. ``draft=int8|gamma=fixed:4|temp=0|domain=code`` (:meth:`CellId.to_str`)."""
    return CellId(draft, GammaSpec.parse(gamma_policy), temperature, domain, head_k).to_str()
