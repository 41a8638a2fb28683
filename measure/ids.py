"""Identities of the run format: small frozen types, each with its one codec — ``to_str`` (the text on disk) and
``parse`` (its inverse, a one-line ``ValueError`` for anything else).

* a γ policy: :class:`sim.policies.GammaSpec` (``fixed:4``; ``sim`` owns the type, the run format writes it);
* a chain sweep's cell: :class:`CellId` (``draft=int8|gamma=fixed:4|temp=0|domain=code[|head_k=512]``);
* a tree run's cell: :class:`TreeCellId` (``draft=int8|shape=[[0],[1],[0,0]]|temp=0|domain=code``);
* a serving run's configuration, load and unit: :class:`ServeConfig` (``ngram:3:k4``), :class:`LoadSpec`
  (``c4``, ``r2.5``) and :class:`UnitId` (``config=ngram:3:k4|slots=4|load=c4|repeat=0``).

Objects travel between the modules that measure, calibrate and report; the text is made only where a row, a
``run.json`` or a file name is written, and parsed only where one is read. Torch-free: ``calibrate`` and
``reports`` import it.
"""

from __future__ import annotations

import math
import re
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

    @classmethod
    def chain(cls, draft: str, gamma: int, domain: str) -> "TreeCellId":
        """The cell of a chain of ``gamma`` drafted tokens run by the chain loop (shape ``gamma=G``)."""
        return cls(draft, f"gamma={int(gamma)}", domain)

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


@dataclass(frozen=True)
class ServeConfig:
    """How the server was started: ``off``, ``ngram:N:kK`` or, with synthetic acceptance, ``synth:kK:pP``.

    ``ngram:N:kK``: llama-server ``--spec-type ngram-simple --spec-ngram-simple-size-n N
    --spec-ngram-simple-size-m K`` (for the n-gram types llama.cpp drafts ``size_m`` tokens;
    ``--spec-draft-n-max`` only limits drafts of a draft *model*). ``synth:kK``: the same n-gram draft on a
    prompt it always matches (the alphabet over and over, about ``P`` tokens, lookup n-gram 1), with
    ``--spec-synth-rates 0,...,0`` so every step verifies ``K + 1`` tokens per slot and emits one: what a
    step costs, apart from acceptance. ``synth:off:pP``: speculation off on the same prompts.
    """

    kind: str  # "off" | "ngram" | "synth" | "url" (a running server measured as it is)
    k: int = 0
    ngram_n: int = 0
    prompt_tokens: int = 0  # synth: the length of its repetitive prompts

    def __post_init__(self) -> None:
        if self.kind not in ("off", "ngram", "synth", "url"):
            raise ValueError(f"configuration kind {self.kind!r}; valid: off, ngram, synth, url")
        if self.kind == "ngram" and (self.k < 1 or self.ngram_n < 1):
            raise ValueError(f"an n-gram configuration needs n >= 1 and k >= 1, got n={self.ngram_n}, k={self.k}")
        if self.kind in ("off", "url") and (self.k or self.ngram_n):
            raise ValueError(f"a configuration {self.kind!r} has no k")
        if (self.kind == "synth") != (self.prompt_tokens > 0):
            raise ValueError("a synthetic configuration (and only one) has a prompt length")

    @property
    def speculative(self) -> bool:
        return self.k > 0

    @property
    def synthetic(self) -> bool:
        return self.kind == "synth"

    def to_str(self) -> str:
        if self.kind in ("off", "url"):
            return self.kind
        if self.kind == "synth":
            return f"synth:{f'k{self.k}' if self.k else 'off'}:p{self.prompt_tokens}"
        return f"ngram:{self.ngram_n}:k{self.k}"

    @classmethod
    def parse(cls, text: str) -> "ServeConfig":
        t = str(text).strip()
        if t in ("off", "url"):
            return cls(t)
        m = re.fullmatch(r"synth:(?:k(\d+)|off):p(\d+)", t)
        if m:
            return cls("synth", int(m.group(1) or 0), 0, int(m.group(2)))
        m = re.fullmatch(r"ngram:(\d+):k(\d+)", t)
        if m:
            return cls("ngram", int(m.group(2)), int(m.group(1)))
        raise ValueError(f"configuration {text!r}; expected off, url, ngram:N:kK, synth:kK:pP or synth:off:pP")

    def server_args(self, slots: int) -> list[str]:
        """llama-server flags for this configuration (``--spec-synth-rates`` for the synthetic ones)."""
        if not self.speculative:
            return []
        n = self.ngram_n if self.kind == "ngram" else 1
        args = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(n),
                "--spec-ngram-simple-size-m", str(self.k)]
        if self.synthetic:
            args += ["--spec-synth-rates", ",".join(["0"] * self.k)]
        return args


@dataclass(frozen=True)
class LoadSpec:
    """A load: closed-loop ``concurrency`` clients (``c4``) or Poisson arrivals at ``rate_per_s`` (``r2.5``)."""

    concurrency: int = 0
    rate_per_s: float = 0.0

    def __post_init__(self) -> None:
        closed, open_ = self.concurrency > 0, self.rate_per_s > 0
        if closed == open_:
            raise ValueError(f"a load is a concurrency >= 1 or a rate > 0, not both or neither "
                             f"(concurrency={self.concurrency}, rate={self.rate_per_s})")
        if open_ and not math.isfinite(self.rate_per_s):
            raise ValueError(f"arrival rate must be finite, got {self.rate_per_s}")

    @property
    def closed(self) -> bool:
        return self.concurrency > 0

    @property
    def amount(self) -> float:
        """How much load: the clients of a closed loop, the requests/s of an open one."""
        return float(self.concurrency) if self.closed else self.rate_per_s

    def to_str(self) -> str:
        return f"c{self.concurrency}" if self.closed else f"r{self.rate_per_s:g}"

    @classmethod
    def parse(cls, text: str) -> "LoadSpec":
        t = str(text).strip()
        try:
            if t.startswith("c"):
                return cls(concurrency=int(t[1:]))
            if t.startswith("r"):
                return cls(rate_per_s=float(t[1:]))
        except ValueError:
            pass
        raise ValueError(f"load {text!r}; expected cN (concurrency) or rX (requests/s)")


@dataclass(frozen=True)
class UnitId:
    """One load on one configuration in one repeat: ``config=..|slots=..|load=..|repeat=..``."""

    config: ServeConfig
    slots: int
    load: LoadSpec
    repeat: int

    def to_str(self) -> str:
        return f"config={self.config.to_str()}|slots={self.slots}|load={self.load.to_str()}|repeat={self.repeat}"

    @classmethod
    def parse(cls, text: str) -> "UnitId":
        parts = dict(p.partition("=")[::2] for p in str(text).split("|"))
        if list(parts) != ["config", "slots", "load", "repeat"]:
            raise ValueError(f"unit id {text!r}: expected config=..|slots=..|load=..|repeat=..")
        try:
            return cls(ServeConfig.parse(parts["config"]), int(parts["slots"]), LoadSpec.parse(parts["load"]),
                       int(parts["repeat"]))
        except ValueError as e:
            raise ValueError(f"unit id {text!r}: {e}") from None
