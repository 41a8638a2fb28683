"""llama.cpp: ``llama-speculative(-simple)`` end-of-run output, llama-server timings JSON, log lines, /metrics.

Definitions (``examples/speculative-simple/speculative-simple.cpp``,
``common/speculative.cpp``, ``tools/server``):

* end of run: ``n_draft`` = the maximum draft length, ``n_drafted`` = drafted
  tokens, ``n_accept`` = accepted draft tokens, ``n_predict`` = tokens
  produced (each round adds accepted + 1), so rounds = ``n_predict − n_accept``;
  ``accept`` = n_accept / n_drafted. Drafts can be shorter than ``n_draft``.
* llama-server ``timings``: ``draft_n`` drafted, ``draft_n_accepted``
  accepted; no verify-step count.
* log: ``draft acceptance rate = R (A accepted / G generated)``; newer builds
  add ``mean acceptance length`` (1 + accepted / drafts) and ``acceptance rate
  per position`` (unconditional, vLLM's definition), and print a
  ``statistics`` line with ``#gen drafts`` (drafts) and ``#acc tokens``.
* ``/metrics``: ``llamacpp:spec_decode_*`` counters shaped like vLLM's.
"""

from __future__ import annotations

import re

from calibrate.ingest.fields import count, find_key, number, numbers, scan_json
from calibrate.ingest.normalise import conditional_from_unconditional, counts_from_rates, rounding_slack
from calibrate.ingest.records import Figure, ImpossibleFigure, Observation, ParseResult, check_draft_capacity
from calibrate.ingest.vllm import counter_observation
from toolkit.prometheus import Scrape

ENGINE = "llamacpp"
COUNTERS = ("llamacpp:spec_decode_num_drafts", "llamacpp:spec_decode_num_draft_tokens",
            "llamacpp:spec_decode_num_accepted_tokens", "llamacpp:spec_decode_num_accepted_tokens_per_pos")
_KV = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept|accept)\s*=\s*([0-9.]+)\s*(%?)")
_OLD = re.compile(r"draft acceptance rate\s*=\s*([0-9.]+)\s*\(\s*(\d+)\s+accepted\s*/\s*(\d+)\s+generated\)")
_NEW = re.compile(r"draft acceptance\s*=\s*([0-9.]+)\s*\(\s*(\d+)\s+accepted\s*/\s*(\d+)\s+generated\)"
                  r"(?:,\s*mean acceptance length\s*=\s*([0-9.]+))?"
                  r"(?:,\s*acceptance rate per position\s*=\s*\(([0-9.,\s]*)\))?")
_STATS = re.compile(r"statistics\s+(?P<impl>\S+):\s*(?P<rest>.*)$")
SHORT_DRAFTS = ("llama.cpp drafts can be shorter than the maximum (p-min cut-off, end of context): "
                "i.i.d. alpha implied at k = the maximum")


def _per_pos_figures(rates: list[float], drafts: int, label: str) -> tuple[tuple[int, ...] | None, list[Figure]]:
    per_pos = counts_from_rates(rates, drafts)
    try:
        judged, accepted = conditional_from_unconditional(per_pos, drafts)
    except ValueError:
        return None, []
    figs = [Figure(f"{label} [{i + 1}]", f"{r:.3f}", f"drafts whose position {i + 1} was accepted / drafts (unconditional)",
                   f"{per_pos[i]} of {drafts} drafts; alpha_{i + 1} = {accepted[i]}/{judged[i]} = "
                   f"{accepted[i] / judged[i]:.3f} (conditional)" if judged[i] else "no round reached it")
            for i, r in enumerate(rates)]
    return per_pos, figs


def parse_run(path: str, text: str) -> ParseResult | None:
    """The end-of-run block of ``llama-speculative`` / ``llama-speculative-simple``; None when absent."""
    vals: dict[str, tuple[float, str]] = {}
    for line in text.splitlines():
        for m in _KV.finditer(line):
            vals[m.group(1)] = (float(m.group(2)), m.group(3))
    if not {"n_drafted", "n_accept"} & set(vals) or "n_predict" not in vals and "n_drafted" not in vals:
        return None
    need = ("n_predict", "n_drafted", "n_accept")
    if any(k not in vals for k in need):
        return ParseResult(ENGINE, "llamacpp-speculative", (), 1)
    n_predict, n_drafted, n_accept = (int(vals[k][0]) for k in need)
    k = int(vals["n_draft"][0]) if "n_draft" in vals else None
    rounds = n_predict - n_accept
    if n_accept > n_drafted:
        raise ImpossibleFigure(f"{path}: n_accept ({n_accept}) is more than n_drafted ({n_drafted}): no engine accepts "
                               "more draft tokens than it drafted")
    if rounds <= 0:
        raise ImpossibleFigure(f"{path}: n_predict ({n_predict}) <= n_accept ({n_accept}): every round adds its "
                               "accepted tokens plus one, so n_predict exceeds n_accept")
    figs = [Figure("n_draft", str(k), "maximum draft length", f"k = {k}"),
            Figure("n_predict", str(n_predict), "tokens produced (accepted + 1 per round)",
                   f"rounds = n_predict - n_accept = {rounds}; mean tokens per round = {n_predict / rounds:.3f}"),
            Figure("n_drafted", str(n_drafted), "drafted tokens", f"drafted tokens; mean draft length {n_drafted / rounds:.2f}"),
            Figure("n_accept", str(n_accept), "accepted draft tokens", "accepted tokens")]
    if "accept" in vals:
        figs.append(Figure("accept", f"{vals['accept'][0]:.3f}%", "n_accept / n_drafted",
                           f"acceptance rate = {n_accept / n_drafted:.4f} (same definition)"))
    names = (("k", "n_draft"), ("drafts", "n_predict - n_accept"), ("draft_tokens", "n_drafted"),
             ("accepted_tokens", "n_accept"))
    check_draft_capacity(path, k, rounds, n_drafted, dict(names))
    notes = [SHORT_DRAFTS] if k and n_drafted < rounds * k else []
    obs = Observation(ENGINE, "llamacpp-speculative", path, k=k, drafts=rounds, draft_tokens=n_drafted,
                      accepted_tokens=n_accept, figures=tuple(figs), notes=tuple(notes), names=names)
    return ParseResult(ENGINE, "llamacpp-speculative", (obs,), 0)


# long: one pass over the log: the two line kinds (statistics, draft acceptance) parsed where matched, sharing the
#   seen/skipped counts
def parse_log(path: str, text: str) -> ParseResult | None:
    """llama-server ``statistics`` / ``draft acceptance`` lines; None when the file has none."""
    stats: list[Observation] = []
    accs: list[Observation] = []
    skipped = seen = 0
    for i, line in enumerate(text.splitlines(), start=1):
        src = f"{path}:{i}"
        sm = _STATS.search(line)
        if sm and "#gen drafts" in line:
            seen += 1
            rest = sm.group("rest")
            dm = re.search(r"#gen drafts\s*=\s*(\d+)", rest)  # None when the count is cut or not a number
            drafts = number(dm.group(1)) if dm else None
            gm = re.search(r"#gen tokens\s*=\s*(\d+)", rest)
            am = re.search(r"#acc tokens\s*=\s*(\d+)", rest)
            lm = re.search(r"#mean acc len\s*=\s*([0-9.]+)", rest)
            pm = re.search(r"#acc rate/pos\s*=\s*\(([0-9.,\s]*)\)", rest)
            if drafts is None or gm is None or am is None or not rest.rstrip().endswith("ms"):
                skipped += 1
                continue
            d, g, a = int(drafts), int(gm.group(1)), int(am.group(1))
            rates = numbers(pm.group(1)) if pm else []
            per_pos, pfigs = _per_pos_figures(rates, d, "#acc rate/pos") if rates and d else (None, [])
            if rates and (per_pos is None or abs(sum(per_pos) - a) > rounding_slack(len(rates), d)):
                skipped += 1
                continue
            figs = [Figure("#gen drafts", str(d), "drafts (rounds that drafted)", f"drafts = {d}"),
                    Figure("#gen tokens", str(g), "drafted tokens", "drafted tokens"),
                    Figure("#acc tokens", str(a), "accepted draft tokens", "accepted tokens")]
            if lm:
                figs.append(Figure("#mean acc len", lm.group(1), "1 + accepted / drafts (bonus included)",
                                   f"mean tokens per round incl. bonus = {1 + a / d:.3f}" if d else "n/a"))
            names = (("drafts", "#gen drafts"), ("draft_tokens", "#gen tokens"), ("accepted_tokens", "#acc tokens"),
                     ("k", "the length of #acc rate/pos"))
            check_draft_capacity(src, len(per_pos) if per_pos else None, d, g, dict(names))
            notes = ["llama.cpp: some drafts were shorter than k (drafted < drafts x k): alpha_i of later "
                     "positions slightly underestimated"] if per_pos and g < d * len(per_pos) else []
            stats.append(Observation(ENGINE, f"llamacpp-server-statistics ({sm.group('impl')})", src,
                                     k=len(per_pos) if per_pos else None, drafts=d, draft_tokens=g, accepted_tokens=a,
                                     accepted_per_pos=per_pos, figures=tuple(figs + pfigs), notes=tuple(notes),
                                     names=names))
            continue
        nm = _NEW.search(line) if "draft acceptance =" in line else None
        om = _OLD.search(line) if nm is None else None
        if "draft acceptance" in line and nm is None and om is None:
            seen += 1
            skipped += 1
            continue
        m = nm or om
        if m is None:
            continue
        seen += 1
        a, g = int(m.group(2)), int(m.group(3))
        figs = [Figure("draft acceptance" + (" rate" if om else ""), m.group(1), "accepted / generated draft tokens",
                       f"acceptance rate = {a / g:.4f} (same definition)" if g else "n/a"),
                Figure("accepted", str(a), "accepted draft tokens", "accepted tokens"),
                Figure("generated", str(g), "drafted tokens", "drafted tokens")]
        drafts = per_pos = None
        if nm and nm.group(4):
            tau = float(nm.group(4))
            drafts = int(round(a / (tau - 1))) if tau > 1 else None
            figs.append(Figure("mean acceptance length", nm.group(4), "1 + accepted / drafts (bonus included)",
                               f"mean tokens per round incl. bonus; drafts = accepted / (len - 1) = {drafts}"))
            if nm.group(5) and drafts:
                per_pos, pfigs = _per_pos_figures(numbers(nm.group(5)), drafts, "acceptance rate per position")
                if per_pos is None or abs(sum(per_pos) - a) > rounding_slack(len(per_pos), drafts):
                    skipped += 1
                    continue
                figs += pfigs
        accs.append(Observation(ENGINE, "llamacpp-server-log" if om else "llamacpp-server-log-new", src,
                                k=len(per_pos) if per_pos else None, drafts=drafts, draft_tokens=g, accepted_tokens=a,
                                accepted_per_pos=per_pos, figures=tuple(figs),
                                names=(("accepted_tokens", "accepted"), ("draft_tokens", "generated"),
                                       ("tau", "mean acceptance length"))))
    if not seen:
        return None
    # newer builds print both lines for the same work: the statistics line has the draft count
    obs = stats or accs
    return ParseResult(ENGINE, "/".join(sorted({o.fmt for o in obs})) or "llamacpp-server-log", tuple(obs), skipped)


def _timings(source: str, t: dict) -> Observation | None:
    try:
        g, a = count(source, t, "draft_n"), count(source, t, "draft_n_accepted")
    except ImpossibleFigure:
        raise
    except (TypeError, ValueError):
        return None
    if g is None or a is None:
        return None
    figs = (Figure("draft_n", str(g), "drafted tokens", "drafted tokens"),
            Figure("draft_n_accepted", str(a), "accepted draft tokens", "accepted tokens"),
            Figure("predicted_n", str(t.get("predicted_n")), "tokens generated",
                   "not used: rounds without a draft are not counted separately"))
    return Observation(ENGINE, "llamacpp-server-timings", source, draft_tokens=g, accepted_tokens=a, figures=figs,
                       notes=("llama-server timings have no verify-step count: mean tokens per round "
                              "from drafted tokens / k, assuming every round drafted k",),
                       names=(("draft_tokens", "draft_n"), ("accepted_tokens", "draft_n_accepted")))


def _drafting_timings(obj: object) -> list[dict]:
    t = find_key(obj, "timings")
    return [t] if isinstance(t, dict) and "predicted_n" in t and "draft_n" in t else []


def parse_timings(path: str, text: str) -> ParseResult | None:
    """llama-server responses whose ``timings`` carry ``draft_n``; None when none do."""
    res = scan_json(ENGINE, "llamacpp-server-timings", path, text, _drafting_timings, _timings)
    if res is None and '"timings"' in text and '"predicted_n"' in text and '"draft_n"' not in text:
        raise ValueError(f"no spec-decode figures in {path}: no response has timings.draft_n "
                         "(was speculative decoding on?)")
    return res


def scrape_observation(path: str, scrape: Scrape) -> Observation | None:
    """``llamacpp:spec_decode_*`` counters of one scrape (or delta); None when it has none."""
    return counter_observation(ENGINE, "llamacpp-prometheus", path, scrape, COUNTERS)
