"""vLLM: ``SpecDecoding metrics:`` log lines of every known version, Prometheus counters, per-request JSON.

Definitions (``vllm/v1/spec_decode/metrics.py``): "Mean acceptance length" =
1 + accepted / drafts (the bonus token included); "Per-position acceptance
rate" i = drafts whose position i was accepted / drafts (**unconditional**);
"Avg Draft acceptance rate" = accepted / drafted. V0's ``Speculative metrics:``
line counts every draft token the rejection sampler accepted, also after the
first rejection, so its "Draft acceptance rate" is not accepted/drafted of the
emitted prefix; its emitted-token count is.

Log lines are parsed field by field (fields come and go between versions);
a line whose fields do not add up (a truncated copy) is skipped and counted.
"""

from __future__ import annotations

import math
import re

from calibrate.ingest.fields import (
    count,
    counts,
    find_key,
    number,
    numbers,
    percent,
    scan_json,
    scan_lines,
    split_fields,
)
from calibrate.ingest.normalise import conditional_from_unconditional, counts_from_rates, rounding_slack
from calibrate.ingest.records import Figure, ImpossibleFigure, Observation, ParseResult, check_draft_capacity
from sim.limits import GAMMA_LIMIT
from toolkit.prometheus import Scrape, counter_total

ENGINE = "vllm"
_LINE = re.compile(r"(SpecDecoding metrics|Speculative metrics):\s*(?P<rest>.*)$")
COUNTERS = ("vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
            "vllm:spec_decode_num_accepted_tokens", "vllm:spec_decode_num_accepted_tokens_per_pos")
THROUGHPUT_NOTE = "tokens/s over the log interval: depends on load, not used"
#: The V1 log line's fields, by the name the records check them under.
LOG_NAMES = (("accepted_tokens", "Accepted"), ("draft_tokens", "Drafted"), ("tau", "Mean acceptance length"),
             ("k", "the length of the per-position list (or the speculative depth)"),
             ("acceptance_rate", "Accepted / Drafted"))


def _fmt_alpha(judged: tuple[int, ...], accepted: tuple[int, ...], i: int) -> str:
    return f"alpha_{i + 1} = {accepted[i]}/{judged[i]} = {accepted[i] / judged[i]:.3f} (conditional)" \
        if judged[i] else f"alpha_{i + 1}: no round reached it"


# long: one vLLM V1 line: the checks that refuse a truncated line, the format and draft count, then one figure per
#   printed field
def _v1_line(source: str, f: dict[str, str]) -> Observation | None:
    """A V1 line (any version); None when its fields do not add up (truncated)."""
    acc = number(f.get("accepted"))
    drafted = number(f.get("drafted"))
    if acc is None or drafted is None or "tokens" not in f.get("drafted", ""):
        return None
    acc_i, drafted_i = int(acc), int(drafted)
    tau = number(f.get("mean acceptance length"))
    rate_key = "avg draft acceptance rate" if "avg draft acceptance rate" in f else "draft acceptance rate"
    rate_printed = percent(f.get(rate_key))
    rates = numbers(f["per-position acceptance rate"]) if "per-position acceptance rate" in f else None
    depth = number(f.get("current speculative depth"))
    if "mean acceptance length" in f and tau is None:
        return None
    if rate_key in f and rate_printed is None:
        return None
    # the newest format ends with "Avg Draft acceptance rate"; without it the line was cut
    if "accepted throughput" in f and "mean acceptance length" in f and next(iter(f)) == "mean acceptance length" \
            and "avg draft acceptance rate" not in f and rates is not None:
        return None
    if rate_printed is not None and drafted_i and abs(acc_i / drafted_i - rate_printed) > 0.0011:
        return None
    figs = []
    notes = []
    k = len(rates) if rates else (int(depth) if depth is not None else None)
    drafts = None
    if depth is not None:
        fmt = "vllm-log-adaptive"
        notes.append("vLLM adaptive depth: the draft length changes over the run; k = the last printed depth")
    elif "avg draft acceptance rate" in f:
        fmt = "vllm-log-v1"
    elif rates is not None:
        fmt = "vllm-log-v1-2025"
    else:
        fmt = "vllm-log-v1-early"
    if rates and drafted_i:
        k = len(rates)
        full = drafted_i / k
        if drafted_i % k == 0 and (tau is None or abs(1 + acc_i / full - tau) < 0.0051 or acc_i == 0):
            drafts = drafted_i // k
        elif tau is not None and tau > 1:
            drafts = int(round(acc_i / (tau - 1)))
            notes.append("vLLM: some drafts were shorter than k (drafted != drafts x k): drafts taken from the "
                         "mean acceptance length; alpha_i of later positions slightly underestimated")
        else:
            return None
    elif tau is not None and tau > 1:
        drafts = int(round(acc_i / (tau - 1)))
    per_pos = None
    if rates is not None and drafts:
        per_pos = counts_from_rates(rates, drafts)
        if abs(sum(per_pos) - acc_i) > rounding_slack(len(rates), drafts):  # a cut per-position list
            return None
        try:
            judged, accepted = conditional_from_unconditional(per_pos, drafts)
        except ValueError:
            return None
    for key, value in f.items():
        if key == "mean acceptance length":
            figs.append(Figure("Mean acceptance length", value, "1 + accepted / drafts (bonus token included)",
                               f"mean tokens per round incl. bonus = {value}" + (f"; drafts = {drafts}" if drafts else "")))
        elif key in ("accepted throughput", "drafted throughput"):
            figs.append(Figure(key.capitalize(), value, THROUGHPUT_NOTE, "not used"))
        elif key == "accepted":
            figs.append(Figure("Accepted", value, "accepted draft tokens in the interval", f"accepted tokens = {acc_i}"))
        elif key == "drafted":
            figs.append(Figure("Drafted", value, "drafted tokens in the interval", f"drafted tokens = {drafted_i}"))
        elif key == "per-position acceptance rate" and rates is not None:
            for i, r in enumerate(rates):
                conv = (f"{per_pos[i]} of {drafts} drafts; {_fmt_alpha(judged, accepted, i)}"
                        if per_pos is not None else "no draft count: not converted")
                figs.append(Figure(f"Per-position acceptance rate [{i + 1}]", f"{r:.3f}",
                                   f"drafts whose position {i + 1} was accepted / drafts (unconditional)", conv))
        elif key == rate_key:
            figs.append(Figure(key.capitalize(), value, "accepted / drafted",
                               f"acceptance rate = {acc_i / drafted_i:.4f} (same definition)" if drafted_i else "n/a"))
        elif key == "current speculative depth":
            figs.append(Figure("Current speculative depth", value, "draft length at the end of the interval",
                               f"k = {int(depth)} (assumed for the whole interval)" if depth is not None else "n/a"))
    return Observation(ENGINE, fmt, source, k=k, drafts=drafts, draft_tokens=drafted_i, accepted_tokens=acc_i,
                       accepted_per_pos=per_pos, tau=tau,
                       acceptance_rate=acc_i / drafted_i if drafted_i else None,
                       figures=tuple(figs), notes=tuple(notes), names=LOG_NAMES)


def _v0_line(source: str, f: dict[str, str]) -> Observation | None:
    need = ("draft acceptance rate", "system efficiency", "number of speculative tokens",
            "number of accepted tokens", "number of draft tokens", "number of emitted tokens")
    vals = {key: number(f.get(key)) for key in need}
    if any(v is None for v in vals.values()):
        return None
    k = int(vals["number of speculative tokens"])  # type: ignore[arg-type]
    dtok = int(vals["number of draft tokens"])  # type: ignore[arg-type]
    emitted = int(vals["number of emitted tokens"])  # type: ignore[arg-type]
    if k < 1 or dtok % k:
        return None
    drafts = dtok // k
    acc_prefix = emitted - drafts
    if drafts == 0 or not 0 <= acc_prefix <= dtok:
        return None
    tau = emitted / drafts
    figs = (
        Figure("Draft acceptance rate", f.get("draft acceptance rate", ""),
               "accepted by the rejection sampler / drafted, counting positions after the first rejection too",
               f"not the project's rate; acceptance rate = (emitted - drafts) / drafted = {acc_prefix / dtok:.4f}"),
        Figure("System efficiency", f.get("system efficiency", ""), "emitted / (drafts x (k + 1))",
               f"mean tokens per round incl. bonus = efficiency x (k+1) = {tau:.4f}"),
        Figure("Number of speculative tokens", f.get("number of speculative tokens", ""), "k", f"k = {k}"),
        Figure("Number of accepted tokens", f.get("number of accepted tokens", ""),
               "accepted draft tokens incl. those after a rejection", "not used (not the emitted prefix)"),
        Figure("Number of draft tokens", f.get("number of draft tokens", ""), "drafts x k",
               f"drafted tokens = {dtok}; drafts = {drafts}"),
        Figure("Number of emitted tokens", f.get("number of emitted tokens", ""),
               "accepted prefix + bonus/correction token per draft",
               f"accepted tokens = emitted - drafts = {acc_prefix}"),
    )
    note = ("vLLM V0 'Draft acceptance rate' counts draft tokens accepted after the first rejection: "
            "converted from the emitted-token count instead")
    return Observation(ENGINE, "vllm-log-v0", source, k=k, drafts=drafts, draft_tokens=dtok, accepted_tokens=acc_prefix,
                       tau=tau, acceptance_rate=acc_prefix / dtok, figures=figs, notes=(note,),
                       names=(("k", "Number of speculative tokens"), ("draft_tokens", "Number of draft tokens"),
                              ("accepted_tokens", "Number of emitted tokens - drafts")))


def _log_line(source: str, m: re.Match) -> Observation | None:
    f = split_fields(m.group("rest"))
    return _v0_line(source, f) if m.group(1) == "Speculative metrics" else _v1_line(source, f)


def parse_log(path: str, text: str) -> ParseResult | None:
    """Every ``SpecDecoding metrics:`` / ``Speculative metrics:`` line; None when the file has none."""
    return scan_lines(ENGINE, "vllm-log", path, text, _LINE.search, _log_line)


def counter_observation(engine: str, fmt: str, path: str, scrape: Scrape,
                        counters: tuple[str, str, str, str]) -> Observation | None:
    """vLLM-shaped spec-decode counters (drafts, draft tokens, accepted, accepted per position) of a scrape.

    Shared with llama.cpp, whose ``/metrics`` copies vLLM's names and
    definitions. Counters are summed over label sets (engines); None when the
    scrape has none of them.
    """
    drafts = counter_total(scrape, counters[0])
    dtok = counter_total(scrape, counters[1])
    acc = counter_total(scrape, counters[2])
    if drafts is None and dtok is None and acc is None:
        return None
    pos: dict[int, float] = {}
    for s in scrape.named(counters[3], counters[3] + "_total"):
        p = s.label("position")
        if p.isdigit():
            pos[int(p)] = pos.get(int(p), 0.0) + s.value
    per_pos = tuple(int(round(pos[i])) for i in range(len(pos))) if pos and sorted(pos) == list(range(len(pos))) else None
    drafts_i = int(round(drafts)) if drafts is not None else None
    figs = [Figure(counters[0], f"{drafts:g}" if drafts is not None else "-", "drafts (rounds that drafted)",
                   f"drafts = {drafts_i}"),
            Figure(counters[1], f"{dtok:g}" if dtok is not None else "-", "drafted tokens", "drafted tokens"),
            Figure(counters[2], f"{acc:g}" if acc is not None else "-",
                   "accepted draft tokens (bonus not counted)", "accepted tokens")]
    notes = []
    dtok_i = int(round(dtok)) if dtok is not None else None
    names = (("drafts", counters[0]), ("draft_tokens", counters[1]), ("accepted_tokens", counters[2]),
             ("k", f"the positions of {counters[3]}"))
    if per_pos is not None and drafts_i:
        try:
            judged, accepted = conditional_from_unconditional(per_pos, drafts_i)
        except ValueError as exc:
            raise ImpossibleFigure(f"{path}: {counters[3]}: {exc}") from None
        for i, c in enumerate(per_pos):
            figs.append(Figure(f'{counters[3]}{{position="{i}"}}', str(c),
                               f"drafts whose position {i + 1} was accepted (unconditional)",
                               _fmt_alpha(judged, accepted, i)))
        check_draft_capacity(path, len(per_pos), drafts_i, dtok_i, dict(names))
        if dtok_i is not None and dtok_i < drafts_i * len(per_pos):
            notes.append(f"{engine}: some drafts were shorter than k (drafted < drafts x k): alpha_i of later "
                         "positions slightly underestimated")
    return Observation(engine, fmt, path, k=len(per_pos) if per_pos else None, drafts=drafts_i,
                       draft_tokens=dtok_i, accepted_tokens=int(round(acc)) if acc is not None else None,
                       accepted_per_pos=per_pos, figures=tuple(figs), notes=tuple(notes), names=names)


def scrape_observation(path: str, scrape: Scrape) -> Observation | None:
    """vLLM's spec-decode counters of one scrape (or scrape delta); None when it has none."""
    return counter_observation(ENGINE, "vllm-prometheus", path, scrape, COUNTERS)


#: The per-request fields, by the name the records check them under.
REQUEST_NAMES = (("k", "num_spec_tokens"), ("drafts", "num_spec_steps"), ("draft_tokens", "num_draft_tokens"),
                 ("accepted_tokens", "num_accepted_draft_tokens"), ("tau", "mean_acceptance_length"),
                 ("rounds_by_accepted", "acceptance_histogram"))


def _request(source: str, sd: dict) -> Observation | None:
    try:
        k = count(source, sd, "num_spec_tokens")
        steps = count(source, sd, "num_spec_steps")
        acc = count(source, sd, "num_accepted_draft_tokens")
        dtok = count(source, sd, "num_draft_tokens")
        hist = sd.get("acceptance_histogram")
        if isinstance(hist, dict) and hist:
            top = max(int(x) for x in hist)
            if top > GAMMA_LIMIT:
                raise ImpossibleFigure(f"{source}: acceptance_histogram has a bucket {top}: no draft accepts more "
                                       f"than {GAMMA_LIMIT} tokens")
            hist = [hist.get(str(j), hist.get(j, 0)) for j in range(top + 1)]
        hist_t = tuple(counts(source, "acceptance_histogram", list(hist))) if hist else None
        per_round = None
        if sd.get("per_step_accepted") is not None and sd.get("per_step_drafted") is not None:
            a = counts(source, "per_step_accepted", sd["per_step_accepted"])
            d = counts(source, "per_step_drafted", sd["per_step_drafted"])
            if len(a) != len(d):
                return None
            per_round = tuple(zip(d, a))
    except ImpossibleFigure:
        raise
    except (TypeError, ValueError, KeyError):
        return None
    check_draft_capacity(source, k, steps, dtok, dict(REQUEST_NAMES))
    tau = sd.get("mean_acceptance_length")
    rate = sd.get("draft_acceptance_rate")
    notes = []
    if isinstance(tau, float) and not math.isfinite(tau):  # redundant with the counts: dropped, and said so
        notes.append(f"vLLM mean_acceptance_length {tau} dropped (not a finite number): the counts are used")
        tau = None
    figs = [Figure("mean_acceptance_length", f"{tau}", "1 + accepted / steps (bonus included)",
                   "mean tokens per round incl. bonus"),
            Figure("draft_acceptance_rate", f"{rate}", "accepted / drafted", "acceptance rate (same definition)"),
            Figure("acceptance_histogram", f"{list(hist_t) if hist_t else '-'}", "steps that accepted exactly j drafts",
                   "per-position counts: count_i = sum of h_j for j >= i")]
    if per_round:
        figs.append(Figure("per_step_accepted/per_step_drafted", f"{len(per_round)} steps",
                           "accepted and proposed drafts per verification step", "exact conditional counts per position"))
    return Observation(ENGINE, "vllm-request-detailed" if per_round else "vllm-request-summary", source, k=k,
                       drafts=steps, draft_tokens=dtok, accepted_tokens=acc, rounds_by_accepted=hist_t,
                       per_round=per_round, tau=float(tau) if isinstance(tau, (int, float)) and tau >= 1 else None,
                       figures=tuple(figs), notes=tuple(notes), names=REQUEST_NAMES)


def _speculative_decoding(obj: object) -> list[dict]:
    sd = find_key(obj, "speculative_decoding")
    return [sd] if isinstance(sd, dict) else []


def parse_requests(path: str, text: str) -> ParseResult | None:
    """Responses (JSON or JSON lines) carrying ``speculative_decoding`` metrics; None when none do."""
    return scan_json(ENGINE, "vllm-request", path, text, _speculative_decoding, _request)


__all__ = ["COUNTERS", "ENGINE", "counter_observation", "parse_log", "parse_requests", "scrape_observation"]
