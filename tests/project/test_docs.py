"""The documentation stays true: a short README, links and cited runs that exist, pasted outputs that are current.

* README.md is a product page: at most :data:`README_MAX_WORDS` words, and its two commands are
  ``make run`` and ``make test`` (targets of the Makefile; ``.ci/run`` calls ``make test``).
* Every relative link in README.md, CHANGELOG.md, ``docs/**/*.md`` and the notes of ``results/``
  resolves to a file or folder of the repository, and a ``#fragment`` into a Markdown file names one of
  its headings (GitHub's anchor rule).
* Every ``results/...`` path those files name exists (a run the docs cite must stay in the tree; a
  removed run is named as ``COMMIT:results`` for ``git archive``, which this check leaves alone).
* Every ``console`` block whose one command is ``$ python -m sim ...`` shows what that command prints
  now (the README's 30-second example among them), and the claims table of the check-a-claim guide is
  what ``python -m sim check --claims --format markdown`` prints.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_WORDS = 1500
#: Notes the docs cite that another change writes (the lead's measured llama.cpp figures); each entry
#: goes when its file lands.
NOT_YET_WRITTEN: set[str] = set()

FENCE = re.compile(r"^(```|~~~)", re.M)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
RESULTS_PATH = re.compile(r"(?<![\w./:-])results/[\w.\-/]*")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
CONSOLE_BLOCK = re.compile(r"^```console\n(.*?)^```", re.M | re.S)


def doc_files() -> list[Path]:
    """README, CHANGELOG, every Markdown file under docs/ and the notes at the top of results/."""
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md")),
             *sorted((ROOT / "results").glob("*.md"))]
    return [f for f in files if f.is_file()]


def without_code(text: str) -> str:
    """``text`` with fenced code blocks and inline code spans removed (links inside code are not links)."""
    parts = re.split(r"^```.*?^```", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", "".join(parts))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(md: Path) -> set[str]:
    return {slug(h) for h in HEADING.findall(without_fences(md.read_text()))}


def without_fences(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)


def link_problems(md: Path) -> list[str]:
    """Every relative link of ``md`` that does not resolve, as ``file: target (why)``."""
    text = without_code(md.read_text())
    bad = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        dest = md if not path_part else (md.parent / path_part).resolve()
        name = f"{md.relative_to(ROOT)}: {target}"
        if not dest.exists():
            bad.append(f"{name} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{name} (no heading with anchor #{fragment} in {dest.relative_to(ROOT)})")
    return bad


def test_readme_is_short() -> None:
    words = len((ROOT / "README.md").read_text().split())
    assert words <= README_MAX_WORDS, f"README.md has {words} words; at most {README_MAX_WORDS}"


def test_readme_two_commands_are_make_targets() -> None:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## Two commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    assert [line.split("#")[0].strip() for line in block.strip().splitlines()] == ["make run", "make test"]
    targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"run", "test"} <= set(targets)


def test_slug_follows_github() -> None:
    assert slug("Which llama.cpp: the build") == "which-llamacpp-the-build"
    assert slug("Serve mode: capacity, not only latency") == "serve-mode-capacity-not-only-latency"
    assert slug("`--executor ray` on a cluster") == "--executor-ray-on-a-cluster"


def test_link_checker_finds_a_broken_link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "a.md").write_text("# Top\n\n[ok](b.md#there) [bad](missing.md) [frag](b.md#nowhere) "
                                   "`[code](ignored.md)` [web](https://example.com)\n")
    (tmp_path / "b.md").write_text("## There\n")
    assert link_problems(tmp_path / "a.md") == ["a.md: missing.md (no such file)",
                                                 "a.md: b.md#nowhere (no heading with anchor #nowhere in b.md)"]


def test_results_paths_are_found() -> None:
    text = ("python -m calibrate results/cpu-x/run.json, then `results/`; git archive fb3536e:results cpu-y; "
            "[note](../../results/z.md)")
    assert RESULTS_PATH.findall(text) == ["results/cpu-x/run.json", "results/"]


@pytest.mark.parametrize("md", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md: Path) -> None:
    assert link_problems(md) == []


@pytest.mark.parametrize("md", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_results_exist(md: Path) -> None:
    missing = []
    for found in RESULTS_PATH.findall(md.read_text()):
        path = found.rstrip(".-")
        if path not in NOT_YET_WRITTEN and not (ROOT / path).exists():
            missing.append(path)
    assert missing == [], f"{md.relative_to(ROOT)} names runs or notes that are not in results/"


def sim_console_blocks() -> list[tuple[str, str, str]]:
    """(file, command, printed output) of every console block whose one command is ``python -m sim``."""
    out = []
    for md in doc_files():
        for block in CONSOLE_BLOCK.findall(md.read_text()):
            lines = block.splitlines()
            commands = [line for line in lines if line.startswith("$ ")]
            if len(commands) == 1 and lines[0].startswith("$ python -m sim") and "|" not in lines[0]:
                out.append((str(md.relative_to(ROOT)), lines[0][2:], "\n".join(lines[1:])))
    return out


def _norm(text: str) -> list[str]:
    return [line.rstrip() for line in text.strip("\n").splitlines()]


def test_readme_has_the_sim_example() -> None:
    assert ("README.md", "python -m sim --preset llama3-1b-3b") in {(f, c) for f, c, _ in sim_console_blocks()}


@lru_cache(maxsize=None)
def printed(command: str) -> str:
    """What ``python -m ...`` (``command``) prints now, run from the repository root (once per command)."""
    run = subprocess.run([sys.executable, *shlex.split(command)[1:]], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, f"`{command}` failed: {run.stderr}"
    return run.stdout


@pytest.mark.parametrize("where,command,shown", sim_console_blocks(), ids=lambda v: v if "\n" not in v else "")
def test_pasted_sim_output_is_current(where: str, command: str, shown: str) -> None:
    assert _norm(shown) == _norm(printed(command)), f"{where}: the output of `{command}` changed; paste it again"


def test_claims_table_is_current() -> None:
    guide = (ROOT / "docs" / "guides" / "check-a-claim.md").read_text()
    table = "\n".join(_norm(printed("python -m sim check --claims --format markdown")))
    assert table in "\n".join(_norm(guide)), "docs/guides/check-a-claim.md: the claims table changed; paste it again"
