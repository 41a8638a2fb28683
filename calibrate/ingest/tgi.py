"""TGI: the ``tgi_request_skipped_tokens`` histogram of a ``/metrics`` scrape.

Definition (``router/src/infer``): every generation step of every request
records ``tokens emitted in the step − 1`` — the speculated tokens accepted
in that step. There is no drafted-token count. The router sets the buckets to
the integers ``0..speculate`` (``router/src/server.rs``); then the bucket
differences are the number of steps by accepted count, which gives exact
per-position counts. Builds without those buckets export a summary
(quantiles, sum, count): mean tokens per step only. Each request's prefill
step records 0 too; when the scrape has ``tgi_request_success`` those steps
are taken out.
"""

from __future__ import annotations

import math

from toolkit.prometheus import Scrape, counter_total
from calibrate.ingest.records import Figure, Observation

ENGINE = "tgi"
METRIC = "tgi_request_skipped_tokens"
NO_DRAFTED = "TGI records no drafted-token count: acceptance rate from the bucket counts assumes every step drafted k"


# long: the histogram form and the summary form of the same TGI metric, each with its one-line errors and notes
def scrape_observation(path: str, scrape: Scrape) -> Observation | None:
    """The skipped-tokens histogram (or summary) of one scrape or delta; None when absent."""
    buckets = {s.label("le"): s.value for s in scrape.named(METRIC + "_bucket")}
    total = counter_total(scrape, METRIC + "_sum")
    count = counter_total(scrape, METRIC + "_count")
    if not buckets and count is None:
        return None
    requests = counter_total(scrape, "tgi_request_success")
    notes: list[str] = []
    figs: list[Figure] = []
    finite = {}
    for le, v in buckets.items():
        try:
            x = float(le)
        except ValueError:
            continue
        if math.isfinite(x):
            finite[x] = v
    integer_buckets = bool(finite) and all(float(x).is_integer() for x in finite) and \
        sorted(finite) == [float(i) for i in range(len(finite))]
    if integer_buckets:
        k = len(finite) - 1
        if k < 1:
            raise ValueError(f"no spec-decode counters in {path}: {METRIC} has only the 0 bucket "
                             "(was speculative decoding on? TGI --speculate)")
        cum = [int(round(finite[float(j)])) for j in range(k + 1)]
        inf = buckets.get("+Inf")
        if inf is not None and int(round(inf)) != cum[-1]:
            raise ValueError(f"{path}: {METRIC} has {int(inf) - cum[-1]} steps above the last bucket {k}: "
                             "not the router's 0..speculate buckets")
        hist = [cum[0]] + [cum[j] - cum[j - 1] for j in range(1, k + 1)]
        if any(h < 0 for h in hist):
            raise ValueError(f"{path}: {METRIC} buckets are not cumulative")
        for j in range(k + 1):
            figs.append(Figure(f'{METRIC}_bucket{{le="{j}"}}', f"{cum[j]}", f"steps that accepted <= {j} tokens",
                               f"steps that accepted exactly {j} = {hist[j]}"))
        if requests is not None:
            r = int(round(requests))
            if r <= hist[0]:
                hist[0] -= r
                notes.append(f"TGI counts each request's prefill step as 0 skipped: {r} steps "
                             "(tgi_request_success) taken out of bucket 0")
        else:
            notes.append("TGI counts each request's prefill step as 0 skipped and the scrape has no "
                         "tgi_request_success to take them out: alpha_1 slightly underestimated")
        notes.append(NO_DRAFTED)
        steps = sum(hist)
        if steps == 0:
            raise ValueError(f"no spec-decode counters in {path}: {METRIC} has no decode steps")
        return Observation(ENGINE, "tgi-prometheus-histogram", path, k=k, drafts=steps, draft_tokens=steps * k,
                           rounds_by_accepted=tuple(hist), figures=tuple(figs), notes=tuple(notes),
                           names=(("k", f"the last integer bucket of {METRIC} (--speculate)"),))
    # summary (or unusable buckets): mean only
    if count is None or total is None or count <= 0:
        raise ValueError(f"no spec-decode counters in {path}: {METRIC} has no count "
                         "(was speculative decoding on? TGI --speculate)")
    rounds = count
    if requests is not None and requests < count:
        rounds = count - requests
        notes.append(f"TGI counts each request's prefill step as 0 skipped: {int(requests)} steps "
                     "(tgi_request_success) taken out")
    tau = 1.0 + total / rounds
    figs = [Figure(METRIC + "_sum", f"{total:g}", "tokens skipped (accepted speculated tokens) over all steps",
                   "accepted tokens"),
            Figure(METRIC + "_count", f"{count:g}", "generation steps (prefill steps included)",
                   f"rounds = {rounds:g}; mean tokens per round = 1 + sum / rounds = {tau:.4f}")]
    notes.append("TGI gives tokens per step only: per-position acceptance assumed i.i.d.")
    return Observation(ENGINE, "tgi-prometheus-summary", path, drafts=int(round(rounds)),
                       accepted_tokens=int(round(total)), figures=tuple(figs), notes=tuple(notes))
