"""GPU forward times from silicon-measured kernel tables: NVIDIA's aiconfigurator-core (the ``costs`` extra).

The package is imported lazily, only when a kernel cost is asked for;
:func:`kernels_unavailable` says why it cannot be used (not installed, another
platform) without importing it. Its loading chatter ("Loading low-fidelity
fallback rows ...", logging to stdout) is captured, never printed: it is kept
in :data:`CAPTURED` and surfaced as one line only when an estimate actually
used rows that are not silicon measurements at that shape
(:func:`fallback_note`).

:class:`KernelForward` prices one forward of a compiled model — ``batch``
sequences × ``n_tokens`` query tokens at a KV length — from the engine's
generation op list (every op at ``batch · n_tokens`` tokens), with the
attention rule of ``docs/design/gpu-costs.md``: the tables time attention at
one query token per sequence, so a q-token verification is bracketed between
``x = b·q`` (attention as ``b`` one-token sequences: the KV read once, a lower
bound) and ``batch_size = b·q`` (the KV read q times: an upper bound), and
priced at the lower bound scaled by the attention's arithmetic intensity over
the chip's ridge point (``kv-once``: memory-bound while q · query-heads-per-KV-head
stays under the ridge, as chain verification does), clipped to the bracket.
Then a monotone envelope in tokens and batch: the tables dip by a few per cent
here and there, and a marginal cost must never be negative.

The MoE tables are measured under three token-routing distributions (the
tables' own names: ``balanced``, ``power_law_1.01``, ``power_law_1.2``); the
library prices a model under its family's default (``power_law`` at α 1.2 for
Qwen3-MoE and Llama-4, 1.01 for DeepSeek) unless told otherwise. The routing
is a choice of this source (:data:`MOE_ROUTINGS`, ``--moe-routing``): passed
to the library through its model config (``ModelConfig.workload_distribution``,
which the MoE op carries into the tables), so the handle is compiled here from
the library's own pieces rather than by ``EngineHandle.compile`` (which does
not take it). A dense model has no routing (``None``).

Compiled handles are cached per (model, system, engine, tp, ep, dtype, MoE routing).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PACKAGE = "aiconfigurator_core"
PACKAGE_PIN = "aiconfigurator-core==0.12.0"
ENGINES = ("vllm", "sglang", "trtllm")
ATTENTION_RULES = ("kv-once", "lower", "upper")
# dtype -> (GEMM and MoE quant mode, KV-cache quant mode) as aiconfigurator names them; fp16 runs the bf16 tables
# (the same tensor-core rate); fp8 and nvfp4 weights keep an fp8 KV cache, as the engines' FP8/FP4 recipes do.
QUANT_MODES = {"bf16": ("bfloat16", "bfloat16"), "fp16": ("bfloat16", "bfloat16"), "fp8": ("fp8", "fp8"),
               "nvfp4": ("nvfp4", "fp8")}
KV_BYTES = {"bfloat16": 2.0, "fp8": 1.0}
MOE_ROUTINGS = ("balanced", "power_law_1.01", "power_law_1.2")  # the MoE tables' distributions, as they name them
DEFAULT_MOE_ROUTING = "balanced"
"""The routing an MoE model is priced under unless asked: the one ``python -m sim validate`` prefers on its fit rows
(the rule and the per-routing errors are in its output)."""

CAPTURED: list[str] = []  # aiconfigurator's loading messages, kept out of the output
_PROVENANCE: set[str] = set()  # non-silicon provenance tiers that fired in an estimate
_HANDLES: dict[tuple, Any] = {}
_VERSIONS: dict[tuple, str] = {}
_CACHE_DIR = Path.home() / ".cache" / "specscope" / "kernel-configs"


class KernelsUnavailable(RuntimeError):
    """The kernel tables cannot price this (package absent, a GPU/engine/dtype without tables, a compile error)."""


def kernels_unavailable() -> str | None:
    """Why the kernel tables cannot be used here, or ``None`` when the package is importable."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return f"{PACKAGE_PIN} is not installed (pip install -e '.[costs]', Linux x86-64)"
    return None


def package_dir() -> Path | None:
    """Where the installed package lives (without importing it), or ``None``."""
    if kernels_unavailable() is not None:
        return None
    spec = importlib.util.find_spec(PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def shipped_config(hub_id: str) -> dict | None:
    """The ``config.json`` aiconfigurator-core ships for ``hub_id`` (its ``model_configs`` folder), or ``None``."""
    root = package_dir()
    if root is None:
        return None
    path = root / "model_configs" / f"{hub_id.replace('/', '--')}_config.json"
    if not path.is_file():
        return None
    return json.loads(path.read_text().replace("Infinity", "1e308"))


def shipped_ids() -> list[str]:
    """Every hub id aiconfigurator-core ships a config for."""
    root = package_dir()
    if root is None:
        return []
    return sorted(p.name[: -len("_config.json")].replace("--", "/", 1)
                  for p in (root / "model_configs").glob("*_config.json") if not p.name.endswith("_quant_config.json"))


@contextlib.contextmanager
def _quiet() -> Any:
    """Run aiconfigurator code with its stdout, stderr and logging captured into :data:`CAPTURED`."""
    out, err = io.StringIO(), io.StringIO()
    log = logging.getLogger(PACKAGE)
    handler = logging.StreamHandler(out)
    old = (log.handlers[:], log.propagate, log.level)
    log.handlers, log.propagate = [handler], False
    log.setLevel(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        log.handlers, log.propagate = old[0], old[1]
        log.setLevel(old[2])
        CAPTURED.extend(line for line in (out.getvalue() + err.getvalue()).splitlines() if line.strip())


def _engine_module() -> Any:
    """``aiconfigurator_core.sdk.engine``, imported on first use (tests make this fail to price without it)."""
    with _quiet():
        import aiconfigurator_core.sdk.engine as engine
    return engine


def engine_version(system: str, engine: str) -> str:
    """The literal data version of ``engine`` on ``system`` ("current" slot of the package's tables), cached."""
    key = ("version", system, engine)
    if key not in _VERSIONS:
        mod = _engine_module()
        try:
            with _quiet():
                _VERSIONS[key] = str(mod._literal_backend_version(system, engine, None, None, None))
        except Exception:  # a private helper: fall back to the slot's name
            _VERSIONS[key] = "current"
    return _VERSIONS[key]


def config_dir(config: dict) -> str:
    """A local directory holding ``config`` as ``config.json`` (aiconfigurator compiles a local directory), cached
    by content under ``~/.cache/specscope/kernel-configs``."""
    text = json.dumps(config, sort_keys=True)
    folder = _CACHE_DIR / hashlib.sha256(text.encode()).hexdigest()[:16]
    if not (folder / "config.json").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(text)
    return str(folder)


def check_moe_routing(routing: str) -> str:
    """``routing`` if it is one of :data:`MOE_ROUTINGS`, else one ``ValueError`` line naming it and the valid."""
    if routing not in MOE_ROUTINGS:
        raise ValueError(f"unknown MoE routing {routing!r}; valid: {', '.join(MOE_ROUTINGS)}")
    return routing


def _compile(model_path: str, system: str, engine: str, kwargs: dict[str, Any], routing: str | None) -> Any:
    """``EngineHandle.compile`` with the model config's ``workload_distribution`` set to ``routing`` (``None``: the
    library's default): the steps of the library's ``compile_engine``, from its own functions, unpatched."""
    mod = _engine_module()
    if routing is None:
        return mod.EngineHandle.compile(model_path, system, engine, **kwargs)
    import aiconfigurator_core

    ep = kwargs.get("moe_ep_size", 1)
    cfg = mod.build_model_config(tp_size=kwargs["tp_size"], pp_size=1, attention_dp_size=1,
                                 moe_tp_size=kwargs.get("moe_tp_size", 1), moe_ep_size=ep,
                                 gemm_quant_mode=kwargs["gemm_quant_mode"], moe_quant_mode=kwargs["moe_quant_mode"],
                                 kvcache_quant_mode=kwargs["kvcache_quant_mode"])
    cfg.workload_distribution = routing  # a value other than "power_law" reaches the MoE op as it is
    mod.apply_nextn(cfg, 0)
    model = mod.get_model(model_path, cfg, engine)
    version = mod._literal_backend_version(system, engine, None, None, None)
    database = mod._maybe_load_database(system, engine, version, None)
    spec = mod.build_engine_spec_json(model, model_path=model_path, system=system, backend=engine,
                                      backend_version=version, kv_block_size=None, systems_path=None,
                                      nextn=cfg.nextn, database=database)
    return mod.EngineHandle(bytes(aiconfigurator_core.engine_spec_bincode_from_json(spec)))


def _compile_checked(model_path: str, system: str, engine: str, tp: int, ep: int, dtype: str,
                     moe_routing: str | None) -> Any:
    """One handle compiled and tried on a decode step; any failure is :class:`KernelsUnavailable`."""
    gemm, kv = QUANT_MODES[dtype]
    kwargs: dict[str, Any] = dict(tp_size=tp, gemm_quant_mode=gemm, moe_quant_mode=gemm, kvcache_quant_mode=kv,
                                  nextn=0)
    if ep > 1:
        kwargs.update(moe_tp_size=max(tp // ep, 1), moe_ep_size=ep)
    try:
        with _quiet():
            handle = _compile(model_path, system, engine, kwargs, moe_routing)
            if handle.decode_step_latency(1, 127, 1) <= 0:
                raise KernelsUnavailable(f"no {engine} {dtype} tables for this model on {system}")
    except KernelsUnavailable:
        raise
    except Exception as exc:  # the library raises ValueError, RuntimeError, KeyError ... per missing table
        msg = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise KernelsUnavailable(f"{type(exc).__name__}: {msg}") from None
    return handle


#: Handles whose asked MoE routing has no tables on that system and engine (A100's older vllm/trtllm tables hold
#: no ``balanced`` rows): the routing that priced them instead, by handle key.
_ROUTING_USED: dict[tuple, str] = {}


def compile_handle(model_path: str, system: str, engine: str, tp: int, ep: int, dtype: str,
                   moe_routing: str | None = None) -> Any:
    """A compiled ``EngineHandle``, cached per (model, system, engine, tp, ep, dtype, MoE routing; ``None``: a dense
    model, or the library's default); any failure is :class:`KernelsUnavailable` with the library's reason in one
    line. Where the tables hold no rows of the asked routing, the first of :data:`MOE_ROUTINGS` they hold prices
    it instead (:func:`routing_used` names it)."""
    key = (model_path, system, engine, tp, ep, dtype, moe_routing)
    if key in _HANDLES:
        return _HANDLES[key]
    try:
        handle = _compile_checked(model_path, system, engine, tp, ep, dtype, moe_routing)
    except KernelsUnavailable as exc:
        if moe_routing is None or "MoE data missing" not in str(exc):
            raise
        for other in (r for r in MOE_ROUTINGS if r != moe_routing):
            try:
                handle = _compile_checked(model_path, system, engine, tp, ep, dtype, other)
            except KernelsUnavailable:
                continue
            _ROUTING_USED[key] = other
            break
        else:
            raise
    _HANDLES[key] = handle
    return handle


def routing_used(model_path: str, system: str, engine: str, tp: int, ep: int, dtype: str,
                 moe_routing: str | None) -> str | None:
    """The MoE routing whose tables priced a compiled handle: the asked one, or the one that stood in for it."""
    return _ROUTING_USED.get((model_path, system, engine, tp, ep, dtype, moe_routing), moe_routing)


def fallback_note() -> str | None:
    """One line when an estimate used rows that are not silicon measurements at its shape, else ``None``."""
    if not _PROVENANCE:
        return None
    tiers = ", ".join(sorted(_PROVENANCE))
    loaded = sum("low-fidelity fallback rows" in line for line in CAPTURED)
    extra = f"; {loaded} table(s) were filled from a sibling engine's rows at load time" if loaded else ""
    return f"kernel tables: some ops were priced by transferred data ({tiers}), not measured at that shape{extra}"


def _note(handle: Any) -> None:
    tier = handle.last_provenance()
    if tier:
        _PROVENANCE.add(str(tier))


def gemm_ops_json(name: str, n: int, k: int, quant: str = "bfloat16") -> str:
    """One GEMM (``n`` outputs, ``k`` inputs) as an ad-hoc op list for ``evaluate_ops_json``."""
    return json.dumps([{"Gemm": {"name": name, "scale_factor": 1.0, "n": int(n), "k": int(k), "quant_mode": quant,
                                 "scale_num_tokens": 1, "low_precision_input": False, "seq_split": 1,
                                 "below_grid_sol": False}}])


def _prev_pow2(b: int) -> int:
    return 1 << (int(b - 1).bit_length() - 1)


@dataclass(frozen=True)
class KernelForward:
    """One model compiled for one GPU system, engine, TP/EP and dtype: forward times from measured kernels
    (satisfies ``sim.cost.ForwardCost``). ``heads_per_kv`` and ``ridge_flops_per_byte`` feed the attention rule;
    ``moe_routing`` is the MoE tables' token-routing distribution (``None`` for a dense model)."""

    model_path: str
    label: str
    system: str
    engine: str
    tp: int = 1
    ep: int = 1
    dtype: str = "bf16"
    heads_per_kv: int = 1
    ridge_flops_per_byte: float = 200.0
    attention_rule: str = "kv-once"
    moe_routing: str | None = None

    def __post_init__(self) -> None:
        if self.attention_rule not in ATTENTION_RULES:
            raise ValueError(f"unknown attention rule {self.attention_rule!r}; valid: {', '.join(ATTENTION_RULES)}")
        if self.moe_routing is not None:
            check_moe_routing(self.moe_routing)

    def handle(self) -> Any:
        return compile_handle(self.model_path, self.system, self.engine, self.tp, self.ep, self.dtype,
                              self.moe_routing)

    def routing_text(self) -> str:
        """The MoE routing that priced it, in words ("" for a dense model); call after :meth:`handle`."""
        if self.moe_routing is None:
            return ""
        used = routing_used(self.model_path, self.system, self.engine, self.tp, self.ep, self.dtype,
                            self.moe_routing)
        return used if used == self.moe_routing else f"{used} (these tables hold no {self.moe_routing} rows)"

    def _attention_ms(self, lo: float, hi: float, q: int) -> float:
        if self.attention_rule == "lower":
            return lo
        if self.attention_rule == "upper":
            return hi
        kv_bytes = KV_BYTES[QUANT_MODES[self.dtype][1]]
        intensity = 2.0 * q * self.heads_per_kv / kv_bytes  # FLOPs per KV byte: q query rows per head group
        return min(max(lo, lo * intensity / self.ridge_flops_per_byte), max(hi, lo))

    def raw_ms(self, batch: int, n_tokens: int, kv_tokens: int) -> float:
        """The composed step time, before the envelope."""
        h = self.handle()
        key = (self, batch, n_tokens, kv_tokens)
        if key in _RAW:
            return _RAW[key]
        n_ops = len(h.decode_step_per_op(1, 127, 1))
        idx = list(range(n_ops))
        if n_tokens == 1:
            total = sum(op[1] for op in h.evaluate_generation_ops(idx, batch_size=batch, s=kv_tokens))
        else:
            lo = h.evaluate_generation_ops(idx, batch_size=batch, s=kv_tokens, x=batch * n_tokens)
            _note(h)
            hi = h.evaluate_generation_ops(idx, batch_size=batch * n_tokens, s=kv_tokens)
            total = sum(a[1] if math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-12)
                        else self._attention_ms(a[1], b[1], n_tokens) for a, b in zip(lo, hi))
        _note(h)
        _RAW[key] = float(total)
        return float(total)

    def _envelope_ms(self, batch: int, n_tokens: int, kv_tokens: int) -> float:
        key = ("env", self, batch, n_tokens, kv_tokens)
        if key not in _RAW:
            best = self.raw_ms(batch, n_tokens, kv_tokens)
            if n_tokens > 1:
                best = max(best, self._envelope_ms(batch, n_tokens - 1, kv_tokens))
            if batch > 1:
                best = max(best, self._envelope_ms(_prev_pow2(batch), n_tokens, kv_tokens))
            _RAW[key] = best
        return _RAW[key]

    def forward_ms(self, n_tokens: int, context_tokens: float, batch: int = 1) -> float:
        """``batch`` sequences × ``n_tokens`` query tokens over ``context_tokens`` of KV (monotone envelope)."""
        kv = max(int(round(context_tokens)) + int(n_tokens), 2)
        return self._envelope_ms(int(batch), int(n_tokens), kv)

    def prefill_ms(self, prompt_tokens: int, batch: int = 1) -> float:
        """A prefill step of ``batch`` prompts of ``prompt_tokens`` tokens."""
        h = self.handle()
        with _quiet():
            ms = float(h.predict_prefill_latency(int(batch), int(prompt_tokens)))
        _note(h)
        return ms

    def gemm_ms(self, n: int, k: int, tokens: int) -> float:
        """One bf16 GEMM (``k`` → ``n``) over ``tokens`` rows, from the same system's GEMM table."""
        h = self.handle()
        key = ("gemm", self.system, self.engine, n, k, tokens)
        if key not in _RAW:
            with _quiet():
                ops = h.evaluate_ops_json(gemm_ops_json("extra_gemm", n, k), is_context=False,
                                          batch_size=int(tokens), s=1, x=int(tokens))
            _note(h)
            _RAW[key] = float(sum(op[1] for op in ops))
        return _RAW[key]

    def describe(self) -> dict:
        return {"model": self.label, "source": "kernels", "system": self.system, "engine": self.engine,
                "tp": self.tp, "ep": self.ep, "dtype": self.dtype, "attention_rule": self.attention_rule,
                **({"moe_routing": self.moe_routing} if self.moe_routing else {})}


_RAW: dict[tuple, float] = {}
