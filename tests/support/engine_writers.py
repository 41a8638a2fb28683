"""Test helper: write sim-generated acceptance in each engine's own format (for the ingest round trips).

Counts come from ``sim``'s acceptance models: with ``drafts`` rounds at draft
length k, position i is accepted in ``round(drafts × P(tokens 1..i accepted))``
rounds (``AcceptanceModel.prefix_accept_probs``). Each writer renders those
counts exactly as the engine prints or exports them (see the fixtures under
``tests/fixtures/engines/`` and ``calibrate.ingest``'s module docstrings).
"""

from __future__ import annotations

import json

from sim.acceptance import AcceptanceModel


def unconditional_counts(model: AcceptanceModel, k: int, drafts: int) -> list[int]:
    """Drafts whose position i was accepted, i = 1..k (vLLM's per-position counts)."""
    return [int(round(drafts * p)) for p in model.prefix_accept_probs(k)]


def histogram(per_pos: list[int], drafts: int) -> list[int]:
    """Rounds that accepted exactly j tokens, j = 0..k."""
    tail = [drafts] + per_pos + [0]
    return [tail[j] - tail[j + 1] for j in range(len(per_pos) + 1)]


def vllm_log_line(per_pos: list[int], drafts: int, seconds: float = 10.0) -> str:
    k, acc = len(per_pos), sum(per_pos)
    rates = ", ".join(f"{c / drafts:.3f}" for c in per_pos)
    return (f"INFO 09-14 10:21:07 [metrics.py:96] SpecDecoding metrics: Mean acceptance length: {1 + acc / drafts:.2f}, "
            f"Accepted throughput: {acc / seconds:.2f} tokens/s, Drafted throughput: {drafts * k / seconds:.2f} tokens/s, "
            f"Accepted: {acc} tokens, Drafted: {drafts * k} tokens, Per-position acceptance rate: {rates}, "
            f"Avg Draft acceptance rate: {100 * acc / (drafts * k):.1f}%")


def vllm_scrape(per_pos: list[int], drafts: int, offset: int = 0) -> str:
    model = 'engine="0",model_name="m"'
    lines = ["# TYPE vllm:spec_decode_num_drafts_total counter",
             f"vllm:spec_decode_num_drafts_total{{{model}}} {drafts + offset}.0",
             "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
             f"vllm:spec_decode_num_draft_tokens_total{{{model}}} {(drafts + offset) * len(per_pos)}.0",
             "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
             f"vllm:spec_decode_num_accepted_tokens_total{{{model}}} {sum(per_pos) + offset * len(per_pos)}.0",
             "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{model},position="{i}"}} {c + offset}.0'
              for i, c in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


def vllm_request(per_pos: list[int], drafts: int) -> str:
    h = histogram(per_pos, drafts)
    k, acc = len(per_pos), sum(per_pos)
    sd = {"mean_acceptance_length": 1 + acc / drafts, "draft_acceptance_rate": acc / (drafts * k),
          "acceptance_histogram": h, "num_spec_steps": drafts, "num_accepted_draft_tokens": acc,
          "num_draft_tokens": drafts * k, "num_spec_tokens": k}
    return json.dumps({"id": "cmpl-1", "choices": [{"text": "x"}], "metrics": {"speculative_decoding": sd}}) + "\n"


def sglang_meta(per_pos: list[int], drafts: int) -> str:
    h = histogram(per_pos, drafts)
    k, acc = len(per_pos), sum(per_pos)
    meta = {"spec_verify_ct": drafts, "completion_tokens": acc + drafts, "spec_num_correct_drafts": acc,
            "spec_num_proposed_drafts": drafts * k, "spec_correct_drafts_histogram": h}
    return json.dumps({"text": "x", "meta_info": meta}) + "\n"


def llamacpp_statistics(per_pos: list[int], drafts: int) -> str:
    k, acc = len(per_pos), sum(per_pos)
    rates = ", ".join(f"{c / drafts:.3f}" for c in per_pos)
    return (f"slot print_timing: id  0 | task 0 | statistics     draft: #calls(b,g,a) =    1 {drafts:6d} {drafts:6d}, "
            f"#gen drafts = {drafts:6d}, #acc drafts = {per_pos[0]:6d}, #gen tokens = {drafts * k:6d}, "
            f"#acc tokens = {acc:6d}, #mean acc len = {1 + acc / drafts:.2f}, #acc rate/pos = ({rates}), "
            "dur(b,g,a) = 0.005, 325.555, 0.114 ms\n")


def llamacpp_scrape(per_pos: list[int], drafts: int) -> str:
    k, acc = len(per_pos), sum(per_pos)
    lines = ["# TYPE llamacpp:spec_decode_num_drafts counter", f"llamacpp:spec_decode_num_drafts {drafts}",
             "# TYPE llamacpp:spec_decode_num_draft_tokens counter", f"llamacpp:spec_decode_num_draft_tokens {drafts * k}",
             "# TYPE llamacpp:spec_decode_num_accepted_tokens counter", f"llamacpp:spec_decode_num_accepted_tokens {acc}"]
    lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos{{position="{i}"}} {c}' for i, c in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


def tgi_scrape(per_pos: list[int], drafts: int, requests: int = 10) -> str:
    h = histogram(per_pos, drafts)
    h[0] += requests  # each request's prefill step records 0
    cum, lines = 0, ["# TYPE tgi_request_success counter", f"tgi_request_success {requests}",
                     "# TYPE tgi_request_skipped_tokens histogram"]
    for j, n in enumerate(h):
        cum += n
        lines.append(f'tgi_request_skipped_tokens_bucket{{le="{j}"}} {cum}')
    lines += [f'tgi_request_skipped_tokens_bucket{{le="+Inf"}} {cum}',
              f"tgi_request_skipped_tokens_sum {sum(per_pos)}", f"tgi_request_skipped_tokens_count {cum}"]
    return "\n".join(lines) + "\n"


# --- formats without per-position figures (i.i.d. round trips) ---

def sglang_log_line(tau: float, k: int) -> str:
    return (f"[2025-09-03 08:12:44] Decode batch, #running-req: 4, #token: 1406, token usage: 0.01, "
            f"accept len: {tau:.2f}, accept rate: {tau / (k + 1):.2f}, cuda graph: True, "
            "gen throughput (token/s): 402.17, #queue-req: 0,\n")


def vllm_v0_line(per_pos: list[int], drafts: int) -> str:
    k = len(per_pos)
    emitted = sum(per_pos) + drafts
    return (f"INFO 11-05 20:31:44 metrics.py:477] Speculative metrics: Draft acceptance rate: {sum(per_pos) / (drafts * k):.3f}, "
            f"System efficiency: {emitted / (drafts * (k + 1)):.3f}, Number of speculative tokens: {k}, "
            f"Number of accepted tokens: {sum(per_pos)}, Number of draft tokens: {drafts * k}, "
            f"Number of emitted tokens: {emitted}.\n")


def llamacpp_run(per_pos: list[int], drafts: int) -> str:
    k, acc = len(per_pos), sum(per_pos)
    return (f"n_draft   = {k}\nn_predict = {acc + drafts}\nn_drafted = {drafts * k}\nn_accept  = {acc}\n"
            f"accept    = {100 * acc / (drafts * k):.3f}%\n")


def tgi_summary(per_pos: list[int], drafts: int, requests: int = 10) -> str:
    return ("# TYPE tgi_request_success counter\n"
            f"tgi_request_success {requests}\n# TYPE tgi_request_skipped_tokens summary\n"
            'tgi_request_skipped_tokens{quantile="0.5"} 1\n'
            f"tgi_request_skipped_tokens_sum {sum(per_pos)}\ntgi_request_skipped_tokens_count {drafts + requests}\n")
