"""Explicit KV-cache decoding loops over :class:`~measure.seam.Decoder` objects.

No ``model.generate``: every forward, cache roll-back and acceptance decision
is in this file, in the open, written once against the seam (:mod:`measure.seam`),
so the transformers and the llama.cpp engines run the very same loop. The
caller owns the decoder (gpt-fast's ``setup_caches``): it makes one with
``target.new_decoder()`` — a static cache and its compiled steps built once —
and passes it to every generation; a model draft holds its own. Batch size is
1 (the latency setting that speculative decoding is for).

Speculative round (Leviathan et al. 2023; Chen et al. 2023)::

    draft γ tokens x_1..x_γ with the draft's KV cache, keeping q_i(·)
    one target forward over [last token, x_1..x_γ]  → p_1..p_{γ+1}
    greedy:   accept the longest prefix with x_i == argmax p_i; next = argmax p_{n+1}
    sampling: accept x_i with prob min(1, p_i(x_i)/q_i(x_i)); on the first rejection
              sample next ~ norm(max(0, p_i − q_i)); if all accepted, next ~ p_{γ+1}
    roll both KV caches back to the accepted length

What the greedy path does per round (gpt-fast's habits): tokens live in one
preallocated ``[1, S + max_new]`` buffer on the device (draft tokens are
written into it and the verify input is a view of it — no re-concatenation);
the target's and the draft's argmax stay on the device (no float32 copy of
full-vocabulary logits; a pruned draft head goes through its ids-and-logits
path); one device-to-host transfer per round brings the target's and the
draft's tokens to the host for the acceptance count. Per-phase times are
marks (``perf_counter`` on CPU, CUDA events on GPU) read after the generation,
so timing adds no synchronisation.

Cache invariant: the target cache holds every token but the last (the last
emitted token is fed at the start of the next forward).
"""

from __future__ import annotations

import time
from typing import Any, Collection, Sequence

import torch

from measure.analysis import TRACE_GAMMA_MAX
from measure.seam import Decoder, Draft, GenerationResult, RoundRecord, SparseProbs
from measure.timing import Timer


# -- sampling helpers --------------------------------------------------------------------------
def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at ``temperature`` over the last dim (``temperature > 0``), in float32."""
    return torch.softmax(logits.float() / temperature, dim=-1)


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


def _first_eos(tokens: Sequence[int], eos: Collection[int]) -> int | None:
    for i, t in enumerate(tokens):
        if t in eos:
            return i
    return None


# -- the baseline -------------------------------------------------------------------------
def autoregressive_generate(dec: Decoder, input_ids: torch.Tensor, temperature: float = 0.0,
                            max_new_tokens: int = 64, generator: torch.Generator | None = None,
                            eos_token_ids: Sequence[int] = (), timer: Timer | None = None) -> GenerationResult:
    """Token-by-token decoding with the target's decoder ``dec`` (reset first). ``input_ids``: ``[1, S]``.

    Greedy: the argmax stays on the device and is the next step's input; the
    host reads it once per token (for EOS and the latency stamp). A decoder
    whose :meth:`~measure.seam.Decoder.greedy_generate` runs this same loop
    itself returns the :class:`GenerationResult` from there (the llama.cpp
    engine, whose decoder lives in another process: a message per token would
    cost every token two process wake-ups a user's loop never has).
    """
    temperature = check_temperature(temperature)
    if temperature == 0:  # the decoder's own token loop where it has one (llama.cpp: no message per token)
        fused = dec.greedy_generate(input_ids, max_new_tokens, eos_token_ids)
        if fused is not None:
            return fused
    dev = input_ids.device
    timer = timer or Timer(dev)
    eos = set(eos_token_ids)
    dec.reset()
    out: list[int] = []
    lat: list[float] = []
    t0 = last = timer.now_s()
    if temperature == 0:
        x = dec.forward_argmax(input_ids, last_only=True).view(1, 1)  # [1, 1]
    else:
        x = pick(dec.forward(input_ids, last_only=True), temperature, generator).view(1, 1)
    while True:
        tok = int(x)  # the one device-to-host transfer of the step
        out.append(tok)
        now = time.perf_counter()
        lat.append((now - last) * 1e3)
        last = now
        if len(out) >= max_new_tokens or tok in eos:
            break
        if temperature == 0:
            x = dec.forward_argmax(x).view(1, 1)
        else:
            x = pick(dec.forward(x), temperature, generator).view(1, 1)
    return GenerationResult(tokens=tuple(out), prompt_tokens=int(input_ids.shape[1]), wall_s=last - t0,
                            ttft_ms=lat[0], token_latency_ms=tuple(lat))


# -- the speculative loop -------------------------------------------------------------------
def accept_greedy(target_tokens: Sequence[int], draft_tokens: Sequence[int]) -> int:
    """Accepted count: the longest prefix with ``draft_tokens[i] == target_tokens[i]`` (host ints)."""
    n = 0
    for a, b in zip(draft_tokens, target_tokens):
        if a != b:
            break
        n += 1
    return n


def accept_tokens(p_logits: torch.Tensor, draft_tokens: torch.Tensor, q_probs: Any,
                  temperature: float, generator: torch.Generator | None) -> tuple[int, int]:
    """Verify ``k`` draft tokens against target logits ``[k+1, V]`` → (accepted n, next token).

    Greedy: exact match with the target's argmax. Sampling: rejection sampling
    with the draft's probabilities ``q_probs`` (``[k, V]``, a :class:`SparseProbs`,
    or None for a deterministic draft: one-hot); residual ``max(0, p − q)``
    renormalised on rejection, a bonus token from ``p_{k+1}`` when all ``k`` are accepted.
    """
    k = int(draft_tokens.shape[0])
    if temperature == 0:
        target_tok = p_logits.argmax(-1)  # [k+1]
        host = torch.cat([target_tok, draft_tokens]).tolist()
        n = accept_greedy(host[:k + 1], host[k + 1:])
        return n, host[n]
    p = probs_from_logits(p_logits, temperature)  # [k+1, V]
    if k == 0:
        return 0, int(sample(p[-1:], generator)[0])
    idx = torch.arange(k, device=p.device)
    if q_probs is None:  # deterministic draft: q is one-hot on the drafted token
        q_at = torch.ones(k, device=p.device)
    elif isinstance(q_probs, SparseProbs):
        q_at = q_probs.at(draft_tokens)
    else:
        q_at = q_probs[idx, draft_tokens]
    ratio = p[idx, draft_tokens] / q_at  # [k]
    u = torch.rand(k, generator=generator, device=p.device)  # [k]
    n = int((u < ratio).int().cumprod(0).sum())
    if n == k:
        return k, int(sample(p[k:k + 1], generator)[0])
    if q_probs is None:
        q_row = torch.zeros_like(p[n]).index_fill_(0, draft_tokens[n:n + 1], 1.0)
    elif isinstance(q_probs, SparseProbs):
        q_row = q_probs.dense_row(n, p.shape[-1])
    else:
        q_row = q_probs[n]
    residual = torch.clamp(p[n] - q_row, min=0.0)  # [V]
    total = residual.sum()
    residual = residual / total if total > 0 else p[n]
    return n, int(sample(residual[None], generator)[0])


# long: the speculative loop kept as one straight piece of tensor code (draft, verify, accept, roll back) as in
#   gpt-fast
def speculative_generate(dec: Decoder, draft: Draft, input_ids: torch.Tensor, policy: Any,
                         temperature: float = 0.0, max_new_tokens: int = 64,
                         generator: torch.Generator | None = None, eos_token_ids: Sequence[int] = (),
                         timer: Timer | None = None) -> GenerationResult:
    """Speculative decoding of the target whose decoder is ``dec`` with ``draft``; γ from ``policy`` (``sim.policies``).

    ``input_ids``: ``[1, S]``. Returns the new tokens and one :class:`RoundRecord`
    per round. The first token comes from the target's prefill (as in the
    baseline); the draft's prefill of the prompt is part of the time to first token.
    """
    temperature = check_temperature(temperature)
    greedy = temperature == 0
    dev = input_ids.device
    timer = timer or Timer(dev)
    eos = set(eos_token_ids)
    policy.reset()
    dec.reset()
    S = int(input_ids.shape[1])
    buf = torch.empty(1, S + max_new_tokens + 1, dtype=torch.long, device=dev)  # [1, S + new]: the sequence
    buf[:, :S] = input_ids
    t0 = timer.now_s()
    if greedy:
        first_t = dec.forward_argmax(input_ids, last_only=True)  # [1]
    else:
        first_t = pick(dec.forward(input_ids, last_only=True), temperature, generator)
    buf[0, S:S + 1] = first_t
    draft.start(input_ids)
    first = int(first_t)
    draft.observe([first])
    last = time.perf_counter()
    out: list[int] = [first]
    lat: list[float] = [(last - t0) * 1e3]
    raw: list[tuple] = []  # per round: (γ, L, k, n, marks) — marks read after the loop, no sync inside it
    L = S + 1  # tokens in the sequence, the last one not yet in the target cache
    done = first in eos or max_new_tokens <= 1
    while not done:
        gamma = max(0, min(int(policy.gamma), max_new_tokens - len(out) - 1))
        m0 = timer.mark()
        if gamma > 0:
            d_tok, q = draft.propose(buf[:, :L], gamma, temperature, generator)  # [k], q [k, V] | Sparse | None
        else:
            d_tok, q = buf.new_empty(0), None
        k = int(d_tok.shape[0])
        if k:
            buf[0, L:L + k] = d_tok
        m1 = timer.mark()
        inp = buf[:, L - 1:L + k]  # [1, k+1]: the last emitted token, then the drafts
        if greedy:
            t_tok = dec.forward_argmax(inp)  # [k+1] on the device
            m2 = timer.mark()
            host = (torch.cat([t_tok, d_tok]) if k else t_tok).tolist()  # the round's one device-to-host transfer
            n = accept_greedy(host[:k + 1], host[k + 1:])
            new = host[:n + 1]  # accepted drafts equal the target's argmax; then the target's next token
            buf[0, L + n:L + n + 1] = t_tok[n:n + 1]
        else:
            p_logits = dec.forward(inp)  # [k+1, V]
            m2 = timer.mark()
            n, nxt = accept_tokens(p_logits, d_tok, q, temperature, generator)
            new = (buf[0, L:L + n].tolist() if n else []) + [nxt]
            buf[0, L + n] = nxt
        dec.rollback(L + n)  # drop the rejected draft positions from the target cache
        if k:
            draft.rollback(L + n)
            policy.update(k, n)
        cut = _first_eos(new, eos)
        if cut is not None:
            new, done = new[:cut + 1], True
        new = new[:max_new_tokens - len(out)]
        out.extend(new)
        draft.observe(new)
        L += len(new)
        done = done or len(out) >= max_new_tokens
        m3 = timer.mark()
        now = time.perf_counter()
        lat.extend([(now - last) * 1e3] + [0.0] * (len(new) - 1))
        last = now
        raw.append((gamma, L - len(new), k, n, (m0, m1, m2, m3)))
    rounds = []
    for i, (gamma, ctx, k, n, (m0, m1, m2, m3)) in enumerate(raw):
        d_ms, v_ms, tot_ms = timer.elapsed_ms(m0, m1), timer.elapsed_ms(m1, m2), timer.elapsed_ms(m0, m3)
        rounds.append(RoundRecord(round=i, gamma=gamma, context_tokens=ctx, drafted=k, accepted=n, draft_ms=d_ms,
                                  verify_ms=v_ms, overhead_ms=max(0.0, tot_ms - d_ms - v_ms)))
    return GenerationResult(tokens=tuple(out), prompt_tokens=S, wall_s=last - t0,
                            ttft_ms=lat[0], token_latency_ms=tuple(lat), rounds=tuple(rounds))


# -- acceptance traces ------------------------------------------------------------------------
@torch.inference_mode()
def acceptance_trace(dec: Decoder, draft: Draft, tokens: torch.Tensor, prompt_tokens: int,
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
    dec.reset()
    logits = dec.forward(tokens[:, :-1])[prompt_tokens - 1:]  # [n, V]
    dec.reset()
    p = probs_from_logits(logits, temperature)
    return [float(x) for x in torch.minimum(p, q).sum(-1).tolist()]


def proposal_runs(draft: Draft, tokens: torch.Tensor, prompt_tokens: int, flags: Sequence[float],
                  gamma_max: int = TRACE_GAMMA_MAX) -> tuple[list[int], list[int]]:
    """Greedy: per generated position t, (tokens the draft proposes, how many match in a row).

    ``tokens`` ``[1, L]`` is prompt + the target's greedy output, ``flags`` the
    teacher-forced match flags of :func:`acceptance_trace`. A model draft
    always proposes ``gamma_max`` tokens and, fed its own accepted tokens,
    proposes exactly what teacher forcing gives, so its run is the number of
    leading ones of ``flags[t:]``. A lookup draft (one with a
    :meth:`~measure.seam.Draft.new_index`) proposes a copied continuation,
    possibly short or empty, which is looked up directly in its index.
    Both are capped by the end of the sequence.
    """
    seq = tokens[0].tolist()
    gen = seq[prompt_tokens:]
    n = len(gen)
    index = draft.new_index(seq[:prompt_tokens])
    proposed: list[int] = []
    runs: list[int] = []
    for t in range(n):
        if index is not None:
            cont = index.propose(gamma_max)
            index.append(gen[t])
        else:  # model draft: gamma_max tokens, matching where teacher forcing matched
            k = min(gamma_max, n - t)
            hits = [f > 0.5 for f in flags[t:t + k]]
            proposed.append(k)
            runs.append(next((i for i, h in enumerate(hits) if not h), k))
            continue
        k = min(len(cont), n - t)
        hits = [a == b for a, b in zip(cont[:k], gen[t:t + k])]
        proposed.append(k)
        runs.append(next((i for i, h in enumerate(hits) if not h), k))
    return proposed, runs
