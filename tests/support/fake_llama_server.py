"""A stand-in for llama.cpp's ``llama-server`` in tests: the flags, endpoints and streams ``measure serve`` uses.

Run as ``python tests/support/fake_llama_server.py -m MODEL --host 127.0.0.1 --port P -np N ...`` (the tests write a
small executable that execs it). Stdlib only. It serves ``/health``, ``/v1/models``, ``/metrics`` (llama.cpp's
``llamacpp:`` counters) and streaming ``/v1/chat/completions`` / ``/v1/completions``: ``max_tokens`` tokens, one
step of ``FAKE_STEP_MS`` (default 2) per round; with ``--spec-ngram-simple-size-m K`` each round drafts K tokens
and accepts the first ``FAKE_ACCEPT`` (default 1) of them, all counted in ``/metrics`` and the final chunk's
``timings``; ``FAKE_DRAFT_MS`` (default 0) more per drafted token of a round (a larger k costs more). Faults on request: ``FAKE_DIE_AFTER=n`` exits after the n-th completion request starts;
``--port`` already taken: exits with llama-server's bind error; ``FAKE_NO_METRICS=1``: ``/metrics`` is 404;
``FAKE_NOT_OPENAI=1``: ``/v1/models`` is 404. ``FAKE_PID_FILE``: its pid is appended there.
Misbehaving servers (issue #43): ``FAKE_HTTP500_EVERY=n``: every n-th completion request answers HTTP 500;
``FAKE_PLAIN_JSON=1``: 200 with a plain JSON completion body, no stream; ``FAKE_USAGE=<JSON>``: the final chunk's
``usage.completion_tokens`` is that value (``1000000000``, ``-50``, ``"many"``); ``FAKE_NON_OBJECT_CHUNK=1``: a
``data: [1, 2]`` chunk after the first token; ``FAKE_STALL_AFTER=n``: after n tokens the stream sends nothing
more (for a minute); ``FAKE_PROPS_CTX=n``: ``/props`` reports a slot context of n tokens (default: ``-c`` / ``-np``,
raised to 256 as llama-server does).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ARGS = sys.argv[1:]


def arg(flag: str, default: str | None = None) -> str | None:
    return ARGS[ARGS.index(flag) + 1] if flag in ARGS else default


if "--version" in ARGS:
    print("version: 0.0.0-fake (build 0, commit fake)\nbuilt with a test for Linux")
    sys.exit(0)

K = int(arg("--spec-ngram-simple-size-m", "0") or 0) if arg("--spec-type") else 0
STEP_S = float(os.environ.get("FAKE_STEP_MS", "2")) / 1000.0
DRAFT_S = float(os.environ.get("FAKE_DRAFT_MS", "0")) / 1000.0
ACCEPT = int(os.environ.get("FAKE_ACCEPT", "1"))
DIE_AFTER = int(os.environ.get("FAKE_DIE_AFTER", "0"))
LOCK = threading.Lock()
COUNTERS = {"prompt_tokens_total": 0, "tokens_predicted_total": 0, "n_decode_total": 0,
            "spec_decode_num_drafts_total": 0, "spec_decode_num_draft_tokens_total": 0,
            "spec_decode_num_accepted_tokens_total": 0}
PER_POS = [0] * max(K, 1)
STARTED = [0]
HTTP500_EVERY = int(os.environ.get("FAKE_HTTP500_EVERY", "0"))
STALL_AFTER = int(os.environ.get("FAKE_STALL_AFTER", "0"))
SLOTS = int(arg("-np", "1") or 1)
N_CTX_SLOT = int(os.environ.get("FAKE_PROPS_CTX", "0")) or max(256, int(arg("-c", "4096") or 4096) // SLOTS)


def metrics_text() -> str:
    lines = []
    with LOCK:
        for name, v in COUNTERS.items():
            lines += [f"# TYPE llamacpp:{name} counter", f"llamacpp:{name} {v}"]
        if K:
            lines += [f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                      for i, v in enumerate(PER_POS)]
    return "\n".join(lines) + "\n"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: object) -> None:  # quiet
        pass

    def _json(self, code: int, obj: object) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"total_slots": SLOTS, "default_generation_settings": {"n_ctx": N_CTX_SLOT}})
        elif self.path == "/v1/models" and not os.environ.get("FAKE_NOT_OPENAI"):
            self._json(200, {"object": "list", "data": [{"id": "fake-model"}]})
        elif self.path == "/metrics" and not os.environ.get("FAKE_NO_METRICS"):
            body = metrics_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self._json(404, {"error": "not found"})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", "0"))
        req = json.loads(self.rfile.read(n) or b"{}")
        if self.path not in ("/v1/chat/completions", "/v1/completions"):
            self._json(404, {"error": "not found"})
            return
        with LOCK:
            STARTED[0] += 1
            if DIE_AFTER and STARTED[0] > DIE_AFTER:
                os._exit(3)
            nth = STARTED[0]
        if HTTP500_EVERY and nth % HTTP500_EVERY == 0:
            self._json(500, {"error": {"code": 500, "message": "fake internal error"}})
            return
        chat = self.path.endswith("chat/completions")
        text = (req.get("messages") or [{}])[-1].get("content", "") if chat else req.get("prompt", "")
        n_prompt, n_new = max(1, len(text.split())), int(req.get("max_tokens", 16))
        if os.environ.get("FAKE_PLAIN_JSON"):
            self._json(200, {"object": "chat.completion", "choices": [{"index": 0, "message": {
                "role": "assistant", "content": " t" * n_new}}], "usage": {"completion_tokens": n_new}})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def send(obj: object) -> None:
            data = f"data: {json.dumps(obj) if not isinstance(obj, str) else obj}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def token(i: int) -> dict:
            c = {"index": 0, "finish_reason": None}
            c.update({"delta": {"content": f" t{i}"}} if chat else {"text": f" t{i}"})
            return {"choices": [c], "object": "chunk"}

        t0 = time.perf_counter()
        time.sleep(STEP_S * (1 + n_prompt / 100))  # the prompt step
        produced, drafted, accepted = 1, 0, 0
        send(token(0))
        if os.environ.get("FAKE_NON_OBJECT_CHUNK"):
            send("[1, 2]")
        while produced < n_new:
            if STALL_AFTER and produced >= STALL_AFTER:
                time.sleep(60)
                return
            d = min(K, n_new - produced - 1)
            a = min(ACCEPT, d)
            time.sleep(STEP_S + d * DRAFT_S)
            with LOCK:
                COUNTERS["n_decode_total"] += 1
                if d:
                    COUNTERS["spec_decode_num_drafts_total"] += 1
                    COUNTERS["spec_decode_num_draft_tokens_total"] += d
                    COUNTERS["spec_decode_num_accepted_tokens_total"] += a
                    for i in range(a):
                        PER_POS[i] += 1
            drafted, accepted = drafted + d, accepted + a
            for _ in range(a + 1):
                send(token(produced))
                produced += 1
        with LOCK:
            COUNTERS["prompt_tokens_total"] += n_prompt
            COUNTERS["tokens_predicted_total"] += produced
        usage = json.loads(os.environ["FAKE_USAGE"]) if os.environ.get("FAKE_USAGE") else produced
        final = {"choices": [], "object": "chunk",
                 "usage": {"completion_tokens": usage, "prompt_tokens": n_prompt},
                 "timings": {"prompt_n": n_prompt, "prompt_ms": 1.0, "predicted_n": produced,
                             "predicted_ms": (time.perf_counter() - t0) * 1000.0,
                             **({"draft_n": drafted, "draft_n_accepted": accepted} if K else {})}}
        send(final)
        send("[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()


def main() -> None:
    if os.environ.get("FAKE_PID_FILE"):
        with open(os.environ["FAKE_PID_FILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
    port = int(arg("--port", "8080") or 8080)
    try:
        srv = ThreadingHTTPServer((arg("--host", "127.0.0.1") or "127.0.0.1", port), Handler)
    except OSError:
        print(f"couldn't bind HTTP server socket, hostname: 127.0.0.1, port: {port}", flush=True)
        sys.exit(1)
    print(f"main: server is listening on http://127.0.0.1:{port}", flush=True)
    srv.daemon_threads = True
    srv.serve_forever()


if __name__ == "__main__":
    main()
