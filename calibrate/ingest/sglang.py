"""SGLang: ``Decode batch ... accept len:`` log lines, ``sglang:spec_accept_*`` gauges, per-request ``meta_info``.

Definitions (``python/sglang/srt/managers/scheduler_metrics_mixin.py``): the
log's "accept len" = (accepted + one bonus token per request) / verify steps —
mean tokens per round, bonus included; "accept rate" = the same numerator /
(verify steps × ``speculative_num_draft_tokens``) — it **includes the bonus
token** and divides by the draft-token slots (k + 1 for a chain). Both are
averages over the last logging window, without counts. The gauges carry the
same two numbers for the last window only. Per request, ``meta_info`` holds
``spec_verify_ct`` and, in newer versions, accepted/proposed draft counts and
a histogram of verify steps by accepted drafts (``spec_accept_histogram``,
renamed ``spec_correct_drafts_histogram``; old names kept as aliases).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from calibrate.ingest.fields import count, counts, number, scan_json, scan_lines, split_fields
from calibrate.ingest.records import Figure, ImpossibleFigure, Observation, ParseResult
from toolkit.prometheus import Scrape

ENGINE = "sglang"
_LINE = re.compile(r"Decode batch[.,]?\s*(?P<rest>#running-req.*)$")
GAUGES = ("sglang:spec_accept_length", "sglang:spec_accept_rate")
BONUS_LEN = "SGLang 'accept len' counts the bonus token: accepted draft tokens per round = accept len - 1"
WINDOW = "average over the last logging window (no counts)"


def _k_from_rate(tau: float, rate_with_bonus: float | None, spec_tokens: int | None) -> tuple[int | None, str]:
    """k = num_draft_tokens − 1, with num_draft_tokens = accept len / accept rate (rounded)."""
    if spec_tokens is not None:
        return spec_tokens, f"k = {spec_tokens} from --spec-tokens"
    if rate_with_bonus is None or rate_with_bonus <= 0:
        return None, "no accept rate: k unknown (pass --spec-tokens K)"
    slots = int(round(tau / rate_with_bonus))
    return max(slots - 1, 1), (f"num_draft_tokens = accept len / accept rate = {tau / rate_with_bonus:.2f} -> {slots}, "
                               f"k = {max(slots - 1, 1)}")


def _window(source: str, fmt: str, tau: float, rate: float | None, spec_tokens: int | None,
            names: tuple[str, str]) -> Observation:
    k, how = _k_from_rate(tau, rate, spec_tokens)
    figs = [Figure(names[0], f"{tau:.2f}", f"(accepted + bonus) / verify steps, {WINDOW}",
                   f"mean tokens per round incl. bonus = {tau:.2f}; accepted per round = {tau - 1:.2f}")]
    notes = [BONUS_LEN]
    if rate is not None:
        conv = f"{how}; acceptance rate = (accept len - 1) / k = {(tau - 1) / k:.3f}" if k else how
        figs.append(Figure(names[1], f"{rate:.2f}", "(accepted + bonus) / (verify steps x num_draft_tokens): "
                           "includes the bonus token", conv))
        if k:
            notes.append(f"SGLang accept rate includes the bonus token: converted to accepted/drafted = "
                         f"(accept len - 1) / k (k = {k}{', inferred as accept len / accept rate - 1' if spec_tokens is None else ''})")
            if spec_tokens is None:
                notes.append("k inferred for a chain draft; with --speculative-eagle-topk > 1 num_draft_tokens counts "
                             "tree nodes: pass --spec-tokens K (speculative_num_steps)")
    acc_rate = (tau - 1) / k if k and 0 <= (tau - 1) / k <= 1 else None
    return Observation(ENGINE, fmt, source, k=k, tau=tau, acceptance_rate=acc_rate, figures=tuple(figs),
                       notes=tuple(notes), names=(("tau", names[0]), ("k", "k from --spec-tokens" if spec_tokens
                                                  is not None else f"k inferred as {names[0]} / {names[1]} - 1")))


def _log_line(source: str, m: re.Match, spec_tokens: int | None) -> Observation | None:
    f = split_fields(m.group("rest"))
    tau = number(f.get("accept len"))
    rate = number(f.get("accept rate")) if "accept rate" in f else None
    if tau is None or "#queue-req" not in f or ("accept rate" in f and rate is None):
        return None  # cut before its last field
    if tau < 1.0:  # an idle window prints 0.00
        return None
    fmt = "sglang-log" if rate is not None else "sglang-log-old"
    return _window(source, fmt, tau, rate, spec_tokens, ("accept len", "accept rate"))


def _match(line: str) -> re.Match | None:
    return _LINE.search(line) if "accept len" in line else None


def parse_log(path: str, text: str, spec_tokens: int | None = None) -> ParseResult | None:
    """``Decode batch`` lines with ``accept len``; None when the file has none."""
    return scan_lines(ENGINE, "sglang-log", path, text, _match, lambda s, m: _log_line(s, m, spec_tokens))


def scrape_observation(path: str, scrape: Scrape, spec_tokens: int | None = None) -> Observation | None:
    """The two gauges of one scrape; None when it has neither."""
    lens = scrape.named(GAUGES[0])
    rates = scrape.named(GAUGES[1])
    if not lens and not rates:
        return None
    if not lens or lens[-1].value < 1.0:
        raise ValueError(f"no spec-decode figures in {path}: sglang:spec_accept_length is missing or 0 "
                         "(was speculative decoding on, and did a decode window run?)")
    tau = lens[-1].value
    rate = rates[-1].value if rates else None
    o = _window(path, "sglang-prometheus", tau, rate, spec_tokens, GAUGES)
    return replace(o, notes=o.notes + ("SGLang gauges hold the last logging window only, not the whole run",))


_ACC = ("spec_num_correct_drafts", "spec_accept_token_num", "spec_accepted_drafts")
_DRAFTED = ("spec_num_proposed_drafts", "spec_draft_token_num", "spec_proposed_drafts")
_HIST = ("spec_correct_drafts_histogram", "spec_accept_histogram")


def _first(meta: dict, keys: tuple[str, ...]):
    for key in keys:
        if meta.get(key) is not None:
            return key, meta[key]
    return None, None


# long: one request's meta_info fields read and checked one by one (an unreadable one skips the request, an
#   impossible one refuses the input), then one figure per field
def _request(source: str, meta: dict, spec_tokens: int | None) -> Observation | None:
    try:
        verify = count(source, meta, "spec_verify_ct")
        acc_key, _ = _first(meta, _ACC)
        dr_key, _ = _first(meta, _DRAFTED)
        hist_key, hist = _first(meta, _HIST)
        acc = count(source, meta, acc_key) if acc_key else None
        drafted = count(source, meta, dr_key) if dr_key else None
        hist = counts(source, hist_key, hist) if isinstance(hist, list) and hist else None
    except ImpossibleFigure:
        raise
    except (KeyError, TypeError, ValueError):
        return None
    if verify is None:
        return None
    if verify <= 0:
        return None
    k = spec_tokens
    if k is None and drafted is not None and drafted % verify == 0 and drafted:
        k = drafted // verify
    figs = [Figure("spec_verify_ct", str(verify), "verify steps (rounds)", f"rounds = {verify}")]
    notes = []
    if acc is not None:
        figs.append(Figure(acc_key, str(acc), "accepted draft tokens (bonus not counted)", f"accepted tokens = {acc}"))
    if drafted is not None:
        figs.append(Figure(dr_key, str(drafted), "proposed draft tokens", f"drafted tokens = {drafted}"
                           + (f"; k = drafted / verify steps = {k}" if k and spec_tokens is None else "")))
    if "spec_accept_length" in meta:
        figs.append(Figure("spec_accept_length", f"{meta['spec_accept_length']}",
                           "completion_tokens / spec_verify_ct (bonus included)",
                           "not used: counts tokens, not rounds" if acc is not None else "mean tokens per round"))
    if "spec_accept_rate" in meta:
        figs.append(Figure("spec_accept_rate", f"{meta['spec_accept_rate']}",
                           "accepted / (verify steps x (num_draft_tokens - 1))", "acceptance rate (same definition)"))
    if hist is not None:
        if k is not None and len(hist) < k + 1:
            hist = hist + [0] * (k + 1 - len(hist))
        elif k is None:
            notes.append("SGLang histogram without a draft count: k = the longest accepted run "
                         f"({len(hist) - 1}); pass --spec-tokens K for the configured k")
            k = len(hist) - 1
        figs.append(Figure(hist_key, str(hist), "verify steps that accepted exactly j drafts",
                           "per-position counts: count_i = sum of h_j for j >= i"))
        if sum(hist) != verify:
            return None
    tau = None
    if acc is None and hist is None and meta.get("spec_accept_length") is not None:
        try:
            tau = float(meta["spec_accept_length"])
        except (TypeError, ValueError):
            return None
        notes.append("SGLang spec_accept_length = completion tokens / verify steps: the prefill token "
                     "counts too (slight overestimate)")
    new_names = any(key in meta for key in (_ACC[0], _DRAFTED[0], _HIST[0]))
    return Observation(ENGINE, "sglang-meta-info-new" if new_names else "sglang-meta-info",
                       source, k=k, drafts=verify, draft_tokens=drafted, accepted_tokens=acc,
                       rounds_by_accepted=tuple(hist) if hist else None, tau=tau if tau is None or tau >= 1 or
                       not math.isfinite(tau) else None, figures=tuple(figs), notes=tuple(notes),
                       names=(("drafts", "spec_verify_ct"), ("accepted_tokens", acc_key or "accepted"),
                              ("draft_tokens", dr_key or "drafted"), ("rounds_by_accepted", hist_key or "histogram"),
                              ("tau", "spec_accept_length"),
                              ("k", "k (--spec-tokens)" if spec_tokens is not None else "k inferred")))


def _meta_infos(obj: object) -> list[dict]:
    """Every ``meta_info`` with ``spec_verify_ct`` in a response (one per choice of a batch)."""
    found, todo = [], [obj]
    while todo:
        m = todo.pop()
        if isinstance(m, dict):
            if isinstance(m.get("meta_info"), dict) and "spec_verify_ct" in m["meta_info"]:
                found.append(m["meta_info"])
            todo.extend(v for v in m.values() if isinstance(v, (dict, list)))
        elif isinstance(m, list):
            todo.extend(m)
    return found


def parse_requests(path: str, text: str, spec_tokens: int | None = None) -> ParseResult | None:
    """Responses carrying ``meta_info.spec_verify_ct``; None when none do."""
    return scan_json(ENGINE, "sglang-meta-info", path, text, _meta_infos, lambda s, m: _request(s, m, spec_tokens))
