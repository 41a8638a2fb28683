"""The benchmark-file side of ``python -m calibrate serve``: flags or a manifest → configurations → serving
rows, and those rows written as a serving run directory (``OUT/run``: ``run.json``, ``serve_units.csv``,
``serve_requests.csv``) that the report reads for what was measured."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from calibrate.benchfiles.dataset import ConfigFiles, load_benchfiles, parse_spec
from calibrate.benchfiles.rows import BenchFileError
from toolkit.jsonio import read_json


def _paths(base: Path, v: Any, where: str) -> tuple[str, ...]:
    items = v if isinstance(v, list) else [v]
    if not items or not all(isinstance(x, str) and x.strip() for x in items):
        raise ValueError(f"manifest {where}: expected a path or a list of paths, got {v!r}")
    return tuple(str(base / x) for x in items)


def read_manifest(path: str) -> tuple[list[ConfigFiles], int | None, int | None]:
    """``{"off": PATH|[PATH..], "spec": {"K": PATH|[PATH..]}, "slots": N, "lookup_n": N}``; paths relative to
    the manifest."""
    doc = read_json(path, "manifest")
    base = Path(path).parent
    if not isinstance(doc, dict):
        raise ValueError(f"manifest {path!r}: expected a JSON object with 'off' and 'spec'")
    unknown = sorted(set(doc) - {"off", "spec", "slots", "lookup_n"})
    if unknown:
        raise ValueError(f"manifest {path!r}: unknown key {unknown[0]!r}; valid: off, spec, slots, lookup_n")
    configs = [ConfigFiles(0, _paths(base, doc["off"], "'off'"))] if "off" in doc else []
    spec = doc.get("spec") or {}
    if not isinstance(spec, dict):
        raise ValueError(f"manifest {path!r}: 'spec' must map draft lengths to paths, e.g. {{\"4\": \"k4.json\"}}")
    for k, v in spec.items():
        if not str(k).isdigit() or not 1 <= int(k) <= 64:
            raise ValueError(f"manifest {path!r}: spec key {k!r} is not a draft length 1..64")
        configs.append(ConfigFiles(int(k), _paths(base, v, f"spec {k!r}")))
    slots, lookup = doc.get("slots"), doc.get("lookup_n")
    for name, v in (("slots", slots), ("lookup_n", lookup)):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise ValueError(f"manifest {path!r}: {name} {v!r} is not an integer >= 1")
    return configs, slots, lookup


def configs_of(args: argparse.Namespace) -> tuple[list[ConfigFiles], int | None, int | None]:
    """The configurations named by ``--manifest`` and/or ``--off``/``--spec`` (flags add to the manifest)."""
    configs, slots, lookup = read_manifest(args.manifest) if args.manifest else ([], None, None)
    if args.off:
        configs = [c for c in configs if c.k] + [ConfigFiles(0, tuple(args.off))]
    by_k: dict[int, list[str]] = {}
    for text in args.spec:
        k, p = parse_spec(text)
        by_k.setdefault(k, []).append(p)
    configs = [c for c in configs if c.k not in by_k] + [ConfigFiles(k, tuple(ps)) for k, ps in sorted(by_k.items())]
    if not any(c.k for c in configs):
        raise ValueError("no speculative configuration: give --spec k=K:PATH (or 'spec' in the manifest)")
    return sorted(configs, key=lambda c: c.k), args.slots or slots, args.lookup_n or lookup


def bench_data(args: argparse.Namespace, run_path: Path) -> Any:
    """The :class:`calibrate.serve.ServeData` of the benchmark files the flags name."""
    configs, slots, lookup = configs_of(args)
    try:
        return load_benchfiles(configs, slots, lookup or 1, run_path, seed=args.seed)
    except BenchFileError:
        raise
    except KeyError as exc:  # a field a reader expected and the file lacks
        raise ValueError(f"a benchmark file lacks the field {exc}: truncated or of another version?") from None


def write_run(data: Any, path: Path, command: str) -> None:
    """``data`` as a serving run directory (the report's "what was measured")."""
    from measure.records import SCHEMA_VERSION
    from measure.serve.units import RequestRow, UnitRow, summarise
    from toolkit.files import write_dict_rows
    from toolkit.jsonio import write_json

    path.mkdir(parents=True, exist_ok=True)
    units = data.units
    cols = list(UnitRow.columns())
    write_dict_rows(path / "serve_units.csv", units[cols].to_dict("records"))
    write_dict_rows(path / "serve_requests.csv", data.requests[list(RequestRow.columns())]
                    .to_dict("records"))
    cfg = dict(data.meta["config"])
    tools = sorted({f["tool"] for fs in data.meta["sources"].values() for f in fs})
    cfg.update(configs=list(dict.fromkeys(units["config"])), loads=list(dict.fromkeys(units["load"])),
               requests=int(units["n_requests"].max()), repeats=int(units["repeat"].max()) + 1,
               url="benchmark files of " + ", ".join(tools))  # a server measured as it is, not one we started
    meta = {"schema_version": SCHEMA_VERSION, "status": "complete", "command": command, "config": cfg,
            "models": {"target": {"name": data.meta.get("model") or "a model the files do not name",
                                  "source": ", ".join(tools)}},
            "server": {"version": "from benchmark files: " + ", ".join(tools)},
            "sources": data.meta["sources"], "notes": data.meta.get("notes", []),
            "summary": {"groups": [g.as_dict() for g in summarise(units[cols])]}}
    write_json(path / "run.json", meta)
