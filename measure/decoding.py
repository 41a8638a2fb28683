"""Explicit KV-cache decoding loops: the autoregressive baseline and speculative decoding.

No ``model.generate``: every forward, cache roll-back and acceptance decision
is in this file, in the open. Batch size is 1 (the latency setting that
speculative decoding is for).

Speculative round (Leviathan et al. 2023; Chen et al. 2023)::

    draft γ tokens x_1..x_γ with the draft's KV cache, keeping q_i(·)
    one target forward over [last token, x_1..x_γ]  → p_1..p_{γ+1}
    greedy:   accept the longest prefix with x_i == argmax p_i; next = argmax p_{n+1}
    sampling: accept x_i with prob min(1, p_i(x_i)/q_i(x_i)); on the first rejection
              sample next ~ norm(max(0, p_i − q_i)); if all accepted, next ~ p_{γ+1}
    roll both KV caches back to the accepted length

Cache invariant: the target cache holds every token but the last (the last
emitted token is fed at the start of the next forward).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from measure.records import TRACE_GAMMA_MAX
from measure.timing import Timer


# -- small tensor helpers shared with measure.drafts ----------------------------------
def new_cache() -> Any:
    """An empty KV cache. Full-length layers everywhere, so any roll-back is exact."""
    from transformers import DynamicCache

    return DynamicCache()


def cache_len(cache: Any) -> int:
    return int(cache.get_seq_length()) if cache is not None else 0


def crop_cache(cache: Any, n_tokens: int) -> None:
    """Keep the first ``n_tokens`` positions of ``cache`` (no-op if it is not longer)."""
    extra = cache_len(cache) - n_tokens
    if extra > 0:
        cache.crop(-extra)  # transformers 5: a negative count removes that many tokens


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(cls: type) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(cls.forward).parameters
    except (TypeError, ValueError):
        return False


@torch.inference_mode()
def forward_logits(model: Any, input_ids: torch.Tensor, cache: Any | None, last_only: bool = False) -> torch.Tensor:
    """Logits ``[1, S, V]`` (float32) of ``input_ids`` ``[1, S]`` continuing ``cache`` (updated in place).

    ``last_only``: only the last position's logits are wanted (a prefill, or a
    draft step after several uncached tokens), so the model projects that one
    position through its head (``logits_to_keep=1``, as serving engines do) and
    the result is ``[1, 1, V]``. For a 262k-vocabulary head this saves ``S - 1``
    head projections per prefill.
    """
    kw = {}
    if last_only and _takes_logits_to_keep(type(model)):
        # an index tensor, not the int 1: transformers then gathers a contiguous [1, 1, H] copy of the last
        # hidden state, where ``1`` gives a strided view that sends CPU bf16 F.linear down a path ~20x slower
        # (Gemma-3 262k head: 1.9 s instead of 0.1 s for a 2-token draft step)
        kw["logits_to_keep"] = torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)
    out = model(input_ids=input_ids, past_key_values=cache, use_cache=cache is not None, **kw)
    logits = out.logits
    return (logits[:, -1:] if last_only else logits).float()


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at ``temperature`` over the last dim (``temperature > 0``)."""
    return torch.softmax(logits / temperature, dim=-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of ``probs`` ``[N, V]`` → ``[N]``."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> torch.Tensor:
    """Next token(s) from logits ``[N, V]``: argmax at temperature 0, else a sample. → ``[N]``"""
    if temperature == 0:
        return logits.argmax(-1)
    return sample(probs_from_logits(logits, temperature), generator)


def check_temperature(temperature: float) -> float:
    t = float(temperature)
    if not t >= 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    return t


# -- records ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundRecord:
    """One speculative round. ``context_tokens``: sequence length before the round."""

    round: int
    gamma: int
    context_tokens: int
    drafted: int
    accepted: int
    draft_ms: float
    verify_ms: float
    overhead_ms: float


@dataclass(frozen=True)
class GenerationResult:
    """Output and timings of one generation (baseline or speculative).

    ``tokens``: the new tokens only. ``wall_s`` runs from the first forward to
    the last emitted token (prefill included). ``token_latency_ms[i]``: time
    since the previous token was emitted (tokens emitted by one round share its
    instant: the first carries the round's time, the rest 0).
    """

    tokens: tuple[int, ...]
    prompt_tokens: int
    wall_s: float
    ttft_ms: float
    token_latency_ms: tuple[float, ...]
    rounds: tuple[RoundRecord, ...] = ()
    peak_mem_bytes: int = 0

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def drafted(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted(self) -> int:
        return sum(r.accepted for r in self.rounds)


class Draft(Protocol):
    """What the speculative loop needs from a draft (see :mod:`measure.drafts`)."""

    name: str

    def start(self, prompt_ids: torch.Tensor) -> None: ...

    def propose(self, tokens: torch.Tensor, gamma: int, temperature: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def rollback(self, n_tokens: int) -> None: ...


def _model_of(target: Any) -> Any:
    return getattr(target, "model", target) if not isinstance(target, torch.nn.Module) else target


def _first_eos(tokens: Sequence[int], eos: Sequence[int]) -> int | None:
    for i, t in enumerate(tokens):
        if t in eos:
            return i
    return None


# -- the baseline -------------------------------------------------------------------------
def autoregressive_generate(target: Any, input_ids: torch.Tensor, temperature: float = 0.0,
                            max_new_tokens: int = 64, generator: torch.Generator | None = None,
                            eos_token_ids: Sequence[int] = (), timer: Timer | None = None) -> GenerationResult:
    """Token-by-token decoding with the target's KV cache. ``input_ids``: ``[1, S]``."""
    temperature = check_temperature(temperature)
    model = _model_of(target)
    timer = timer or Timer(input_ids.device)
    eos = set(eos_token_ids)
    cache = new_cache()
    out: list[int] = []
    lat: list[float] = []
    t0 = last = timer.now_s()
    logits = forward_logits(model, input_ids, cache, last_only=True)[:, -1]  # [1, V]
    while True:
        tok = int(pick(logits, temperature, generator)[0])
        out.append(tok)
        now = timer.now_s()
        lat.append((now - last) * 1e3)
        last = now
        if len(out) >= max_new_tokens or tok in eos:
            break
        x = torch.tensor([[tok]], device=input_ids.device)  # [1, 1]
        logits = forward_logits(model, x, cache)[:, -1]  # [1, V]
    return GenerationResult(tokens=tuple(out), prompt_tokens=int(input_ids.shape[1]), wall_s=last - t0,
                            ttft_ms=lat[0], token_latency_ms=tuple(lat))


# -- the speculative loop -------------------------------------------------------------------
def accept_tokens(p_logits: torch.Tensor, draft_tokens: torch.Tensor, q_probs: torch.Tensor | None,
                  temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """Verify ``k`` draft tokens against target logits ``[k+1, V]`` → (accepted n, next token).

    Greedy: exact match with the target's argmax. Sampling: rejection sampling
    with the draft's probabilities ``q_probs`` ``[k, V]`` (one-hot for a
    deterministic draft); residual ``max(0, p − q)`` renormalised on rejection,
    a bonus token from ``p_{k+1}`` when all ``k`` are accepted.
    """
    k = int(draft_tokens.shape[0])
    if temperature == 0:
        target_tok = p_logits.argmax(-1)  # [k+1]
        match = (target_tok[:k] == draft_tokens).int()  # [k]
        n = int(match.cumprod(0).sum()) if k else 0
        return n, int(target_tok[n])
    p = probs_from_logits(p_logits, temperature)  # [k+1, V]
    if k == 0:
        return 0, int(sample(p[-1:], generator)[0])
    if q_probs is None:  # deterministic draft: q is one-hot on the drafted token
        q_probs = torch.zeros_like(p[:k]).scatter_(1, draft_tokens[:, None], 1.0)
    idx = torch.arange(k, device=p.device)
    ratio = p[idx, draft_tokens] / q_probs[idx, draft_tokens]  # [k]
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    n = int((u < ratio).int().cumprod(0).sum())
    if n == k:
        return k, int(sample(p[k:k + 1], generator)[0])
    residual = torch.clamp(p[n] - q_probs[n], min=0.0)  # [V]
    total = residual.sum()
    residual = residual / total if total > 0 else p[n]
    return n, int(sample(residual[None], generator)[0])


def speculative_generate(target: Any, draft: Draft, input_ids: torch.Tensor, policy: Any,
                         temperature: float = 0.0, max_new_tokens: int = 64,
                         generator: torch.Generator | None = None, eos_token_ids: Sequence[int] = (),
                         timer: Timer | None = None) -> GenerationResult:
    """Speculative decoding of ``target`` with ``draft``; γ from ``policy`` (``sim.policies``).

    ``input_ids``: ``[1, S]``. Returns the new tokens and one :class:`RoundRecord`
    per round. The first token comes from the target's prefill (as in the
    baseline); the draft's prefill of the prompt is part of the time to first token.
    """
    temperature = check_temperature(temperature)
    model = _model_of(target)
    dev = input_ids.device
    timer = timer or Timer(dev)
    eos = set(eos_token_ids)
    policy.reset()
    cache = new_cache()
    t0 = timer.now_s()
    logits = forward_logits(model, input_ids, cache, last_only=True)[:, -1]  # [1, V]
    first = int(pick(logits, temperature, generator)[0])
    draft.start(input_ids)
    last = timer.now_s()
    out: list[int] = [first]
    lat: list[float] = [(last - t0) * 1e3]
    rounds: list[RoundRecord] = []
    tokens = torch.cat([input_ids, torch.tensor([[first]], device=dev)], dim=1)  # [1, L]
    done = first in eos or max_new_tokens <= 1
    while not done:
        L = int(tokens.shape[1])
        gamma = max(0, min(int(policy.gamma), max_new_tokens - len(out) - 1))
        r0 = timer.now_s()
        with timer.span() as d_span:
            if gamma > 0:
                d_tok, q = draft.propose(tokens, gamma, temperature, generator)  # [k], [k, V] | None
            else:
                d_tok, q = tokens.new_empty(0), None
        k = int(d_tok.shape[0])
        with timer.span() as v_span:
            inp = torch.cat([tokens[:, -1:], d_tok[None]], dim=1)  # [1, k+1]
            p_logits = forward_logits(model, inp, cache)[0]  # [k+1, V]
        n, nxt = accept_tokens(p_logits, d_tok, q, temperature, generator)
        new = [int(t) for t in d_tok[:n].tolist()] + [nxt]
        crop_cache(cache, L + n)  # drop the rejected draft positions from the target cache
        if k:
            draft.rollback(L + n)
            policy.update(k, n)
        cut = _first_eos(new, eos)
        if cut is not None:
            new, done = new[:cut + 1], True
        new = new[:max_new_tokens - len(out)]
        out.extend(new)
        tokens = torch.cat([tokens, torch.tensor([new], device=dev)], dim=1)
        done = done or len(out) >= max_new_tokens
        now = timer.now_s()
        total_ms = (now - r0) * 1e3
        lat.extend([(now - last) * 1e3] + [0.0] * (len(new) - 1))
        last = now
        rounds.append(RoundRecord(round=len(rounds), gamma=gamma, context_tokens=L, drafted=k, accepted=n,
                                  draft_ms=d_span.ms, verify_ms=v_span.ms,
                                  overhead_ms=max(0.0, total_ms - d_span.ms - v_span.ms)))
    return GenerationResult(tokens=tuple(out), prompt_tokens=int(input_ids.shape[1]), wall_s=last - t0,
                            ttft_ms=lat[0], token_latency_ms=tuple(lat), rounds=tuple(rounds))


# -- acceptance traces ------------------------------------------------------------------------
@torch.inference_mode()
def acceptance_trace(target: Any, draft: Any, tokens: torch.Tensor, prompt_tokens: int,
                     temperature: float) -> list[float]:
    """Per generated position, teacher-forced on ``tokens`` ``[1, L]`` (prompt + target output).

    Greedy: 1.0 where the draft's choice given the true prefix equals the
    target's token, else 0.0 (any γ's acceptance follows as the run of ones
    from a round's first position). Sampling: Σ_v min(p_v, q_v), the
    probability that the draft token is accepted at that position.
    """
    q = draft.position_probs(tokens, prompt_tokens, temperature)  # [n, V]
    gen = tokens[0, prompt_tokens:]  # [n]
    if temperature == 0:
        return [float(x) for x in (q.gather(1, gen[:, None]).squeeze(1) > 0.5).float().tolist()]
    logits = forward_logits(_model_of(target), tokens[:, :-1], None)[0, prompt_tokens - 1:]  # [n, V]
    p = probs_from_logits(logits, temperature)
    return [float(x) for x in torch.minimum(p, q).sum(-1).tolist()]


def proposal_runs(draft: Any, tokens: torch.Tensor, prompt_tokens: int, flags: Sequence[float],
                  gamma_max: int = TRACE_GAMMA_MAX) -> tuple[list[int], list[int]]:
    """Greedy: per generated position t, (tokens the draft proposes, how many match in a row).

    ``tokens`` ``[1, L]`` is prompt + the target's greedy output, ``flags`` the
    teacher-forced match flags of :func:`acceptance_trace`. A model draft
    always proposes ``gamma_max`` tokens and, fed its own accepted tokens,
    proposes exactly what teacher forcing gives, so its run is the number of
    leading ones of ``flags[t:]``. A lookup draft (``draft.lookup``) proposes a
    copied continuation, possibly short or empty, which is looked up directly.
    Both are capped by the end of the sequence.
    """
    seq = tokens[0].tolist()
    gen = seq[prompt_tokens:]
    n = len(gen)
    lookup = getattr(draft, "lookup", None)
    proposed: list[int] = []
    runs: list[int] = []
    for t in range(n):
        if lookup is None:  # model draft: gamma_max tokens, matching where teacher forcing matched
            k = min(gamma_max, n - t)
            hits = [f > 0.5 for f in flags[t:t + k]]
        else:
            cont = lookup(seq[:prompt_tokens + t], gamma_max)
            k = min(len(cont), n - t)
            hits = [a == b for a, b in zip(cont[:k], gen[t:t + k])]
        proposed.append(k)
        runs.append(next((i for i, h in enumerate(hits) if not h), k))
    return proposed, runs
