"""torch.profiler split of one decoding step into lm_head, attention, MLP and the rest.

Forward pre-/post-hooks on the outermost attention and MLP modules of every
layer and on the output embedding (``lm_head``) open and close
``torch.profiler.record_function`` ranges named ``specscope::<component>``;
the whole step runs inside ``specscope::step``. The profiler's per-range
totals (CPU time on CPU; device time of the kernels launched in the range on
CUDA) give each component's milliseconds, and ``other`` is the step minus the
three (embeddings, norms, residual adds, sampling glue, Python overhead).

A step is what the speculative loop runs: a draft step is one token with a
KV cache of ``context_tokens``; a target step verifies ``n_tokens`` (γ+1)
tokens. Rows follow ``profile.csv`` of ``docs/RUN_FORMAT.md``.

    rows = profile_step(model, "gemma3-270m", "draft", context_tokens=128)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

__all__ = [
    "COMPONENTS",
    "ProfileRow",
    "classify_modules",
    "component_ranges",
    "profile_step",
    "profile_rows_to_records",
]

COMPONENTS = ("lm_head", "attention", "mlp", "other")
_PREFIX = "specscope::"
_ATTN_NAMES = ("self_attn", "attn", "attention", "self_attention")
_MLP_NAMES = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class ProfileRow:
    """One component of one profiled step (``profile.csv`` plus context columns)."""

    model: str
    role: str
    component: str
    ms: float
    share: float
    step_ms: float
    device: str
    vocab_size: int
    head_k: int | None
    context_tokens: int
    n_tokens: int
    repeats: int

    def __post_init__(self) -> None:
        if self.component not in COMPONENTS:
            raise ValueError(f"component={self.component!r} not in {COMPONENTS}")
        if self.role not in ("draft", "target"):
            raise ValueError(f"role={self.role!r} must be 'draft' or 'target'")


def output_head(model: nn.Module) -> nn.Module:
    """``model.get_output_embeddings()`` (else ``model.lm_head``); one-line ``ValueError`` when it has none."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    head = head if head is not None else getattr(model, "lm_head", None)
    if not isinstance(head, nn.Module):
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to profile")
    return head


def _vocab_of(model: nn.Module) -> int:
    """The rows of the model's output head (its vocabulary)."""
    weight = output_head(model).weight  # [V, H]
    if not isinstance(weight, torch.Tensor):
        raise ValueError(f"{type(model).__name__}: its output head has no weight tensor; give vocab_size")
    return int(weight.shape[0])


def classify_modules(model: nn.Module) -> dict[str, list[nn.Module]]:
    """Outermost attention / MLP modules and the output head of an HF causal LM.

    Attention: a module whose attribute name is one of ``self_attn, attn,
    attention`` or whose class name ends in ``Attention``; MLP: ``mlp,
    feed_forward, ffn`` or a class name ending in ``MLP``; lm_head:
    ``model.get_output_embeddings()`` (else ``model.lm_head``). Modules nested
    in an already-classified module are skipped so nothing is counted twice.
    """
    head = output_head(model)
    out: dict[str, list[nn.Module]] = {"lm_head": [head], "attention": [], "mlp": []}
    taken: list[str] = []
    for name, mod in model.named_modules():
        if mod is head or not name:
            continue
        if any(name.startswith(t + ".") for t in taken):
            continue
        last = name.rsplit(".", 1)[-1]
        cls = type(mod).__name__
        if last in _ATTN_NAMES or cls.endswith("Attention"):
            out["attention"].append(mod)
            taken.append(name)
        elif last in _MLP_NAMES or cls.endswith("MLP"):
            out["mlp"].append(mod)
            taken.append(name)
    if not out["attention"] or not out["mlp"]:
        raise ValueError(f"could not find attention/MLP modules in {type(model).__name__}")
    return out


@contextlib.contextmanager
def component_ranges(model: nn.Module) -> Iterator[dict[str, list[nn.Module]]]:
    """Install hooks that wrap every classified module's forward in a ``record_function`` range."""
    groups = classify_modules(model)
    handles = []
    for comp, mods in groups.items():
        for mod in mods:
            stack: list[Any] = []

            def pre(_m: nn.Module, _a: Any, comp: str = comp, stack: list = stack) -> None:
                rf = record_function(_PREFIX + comp)
                rf.__enter__()
                stack.append(rf)

            def post(_m: nn.Module, _a: Any, _o: Any, stack: list = stack) -> None:
                stack.pop().__exit__(None, None, None)

            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(post))
    try:
        yield groups
    finally:
        for h in handles:
            h.remove()


def _range_totals_ms(prof: Any, use_device: bool) -> dict[str, float]:
    totals: dict[str, float] = {}
    for evt in prof.key_averages():
        if not evt.key.startswith(_PREFIX):
            continue
        if use_device:
            us = float(getattr(evt, "device_time_total", 0.0) or getattr(evt, "cuda_time_total", 0.0))
        else:
            us = float(evt.cpu_time_total)
        totals[evt.key[len(_PREFIX):]] = totals.get(evt.key[len(_PREFIX):], 0.0) + us / 1e3
    return totals


# long: a twelve-line signature and docstring; the body (warm-up, profiled steps, split of the trace by component)
#   runs in that order
@torch.inference_mode()
def profile_step(
    model: nn.Module,
    model_name: str,
    role: str,
    context_tokens: int = 128,
    n_tokens: int = 1,
    repeats: int = 5,
    warmup: int = 2,
    seed: int = 0,
    vocab_size: int | None = None,
    head_k: int | None = None,
) -> list[ProfileRow]:
    """Profile ``repeats`` steps of ``n_tokens`` tokens after a ``context_tokens`` KV cache.

    Token ids are drawn with a generator seeded by ``seed``. Returns one
    :class:`ProfileRow` per component; ``ms`` is the mean per step, ``share``
    its fraction of the step (``other`` = step − the rest, floored at 0).
    """
    from measure.engines.transformers.decoder import crop_cache, new_cache

    if role not in ("draft", "target"):
        raise ValueError(f"role={role!r} must be 'draft' or 'target'")
    if context_tokens < 1 or n_tokens < 1 or repeats < 1 or warmup < 0:
        raise ValueError(
            f"need context_tokens >= 1, n_tokens >= 1, repeats >= 1, warmup >= 0; got "
            f"{context_tokens}, {n_tokens}, {repeats}, {warmup}"
        )
    p = next(model.parameters())
    dev = p.device
    vocab = vocab_size or _vocab_of(model)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ctx = torch.randint(0, vocab, (1, context_tokens), generator=gen).to(dev)  # [1, C]
    step = torch.randint(0, vocab, (1, n_tokens), generator=gen).to(dev)  # [1, n]
    cache = new_cache()
    model(input_ids=ctx, past_key_values=cache, use_cache=True)

    def run_step() -> None:
        model(input_ids=step, past_key_values=cache, use_cache=True)
        crop_cache(cache, context_tokens)

    for _ in range(warmup):
        run_step()
    use_device = dev.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_device else [])
    if use_device:
        torch.cuda.synchronize(dev)
    with component_ranges(model):
        with profile(activities=acts) as prof:
            for _ in range(repeats):
                with record_function(_PREFIX + "step"):
                    run_step()
            if use_device:
                torch.cuda.synchronize(dev)
    totals = _range_totals_ms(prof, use_device)
    step_ms = totals.get("step", 0.0) / repeats
    if use_device and step_ms == 0.0:  # device time of the outer range not attributed: sum kernels
        step_ms = sum(totals.get(c, 0.0) for c in COMPONENTS[:3]) / repeats
    comp = {c: totals.get(c, 0.0) / repeats for c in COMPONENTS[:3]}
    comp["other"] = max(0.0, step_ms - sum(comp.values()))
    denom = max(step_ms, sum(comp.values()), 1e-12)
    return [
        ProfileRow(
            model=model_name,
            role=role,
            component=c,
            ms=comp[c],
            share=comp[c] / denom,
            step_ms=step_ms,
            device=str(dev.type),
            vocab_size=vocab,
            head_k=head_k,
            context_tokens=context_tokens,
            n_tokens=n_tokens,
            repeats=repeats,
        )
        for c in COMPONENTS
    ]


def profile_rows_to_records(rows: list[ProfileRow], columns: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows as dicts restricted to ``columns`` (the run writer's ``profile`` table)."""
    return [{c: asdict(r)[c] for c in columns} for r in rows]


def main(argv: list[str] | None = None) -> int:
    """``python -m measure.head.profiling``: profile draft (1 token) and target (γ+1 tokens) steps of models.

    Prints a table and one JSON line; ``--out FILE.csv`` writes the rows
    (``profile.csv`` columns plus context). Errors are one line, exit 2.
    """
    import csv
    import json

    from toolkit.cli import OneLineParser, csv_items, fail, int_arg

    prog = "python -m measure.head.profiling"
    ap = OneLineParser(prog=prog, description=(main.__doc__ or prog).splitlines()[0])
    ap.add_argument("--models", default="smollm2-135m,gemma3-270m",
                    help="comma-separated model specs (measure.engines.transformers.models.load_model), e.g. synthetic:gpt2")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--context-tokens", type=int_arg(1, 1_000_000), default=128)
    ap.add_argument("--gamma", type=int_arg(1, 64), default=4, help="target step verifies gamma+1 tokens")
    ap.add_argument("--repeats", type=int_arg(1, 100_000), default=5)
    ap.add_argument("--threads", type=int_arg(1, 1024), default=None)
    ap.add_argument("--out", default=None, help="CSV file for the rows")
    args = ap.parse_args(argv)
    specs = csv_items("--models", args.models, prog)
    try:
        from measure.engines.transformers.models import load_model

        if args.threads is not None:
            torch.set_num_threads(args.threads)
        rows: list[ProfileRow] = []
        for spec in specs:
            lm = load_model(spec, device=args.device, dtype=args.dtype)
            rows += profile_step(lm.model, lm.name, "draft", args.context_tokens, 1, args.repeats)
            rows += profile_step(lm.model, lm.name, "target", args.context_tokens, args.gamma + 1, args.repeats)
            del lm
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    except ValueError as e:
        fail(prog, e)
    print(f"{'model':32s} {'role':6s} {'vocab':>7s} {'step ms':>9s} " + " ".join(f"{c:>14s}" for c in COMPONENTS))
    keyed: dict[tuple[str, str], dict[str, ProfileRow]] = {}
    for r in rows:
        keyed.setdefault((r.model, r.role), {})[r.component] = r
    for (m, role), comp in keyed.items():
        any_r = next(iter(comp.values()))
        cells = " ".join(f"{comp[c].ms:7.3f} ({comp[c].share:4.0%})" for c in COMPONENTS)
        print(f"{m:32s} {role:6s} {any_r.vocab_size:7d} {any_r.step_ms:9.3f} {cells}")
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(asdict(rows[0]).keys()))
            w.writeheader()
            w.writerows(asdict(r) for r in rows)
    print(json.dumps({"rows": [asdict(r) for r in rows]}))
    return 0


if __name__ == "__main__":
    import sys as _sys

    _sys.exit(main())
