"""Experiment trackers behind one small adapter: Weights & Biases and MLflow, imported only when asked for.

A CLI decides *what* to log; this module only hands it to a tracker::

    with start_tracker("mlflow", run_name="measure runs/x", job_type="measure", prog="python -m measure") as t:
        t.log_params({"config": {...}, "fingerprint": {...}})      # nested: W&B config / MLflow dotted params
        t.log_metrics({metric_name("speedup", cell): 1.13, ...})   # one step
        t.log_table("cells", columns, rows)
        t.log_files(run_dir, "run")                                # a file or a directory
    print(t.tracked.describe())                                    # where it went (None when it failed)

Failure is never an error: a tracker that cannot start or log (library not
installed, not logged in, server unreachable, a value it refuses) prints
exactly one warning line on stderr, naming the tracker and the reason, and
every later call is a no-op. The block's own exceptions are caught the same
way (the results the block reads are already on disk), but ``KeyboardInterrupt``
and ``SystemExit`` pass through.

Environment (each library reads its own; nothing is overridden):

* W&B: ``WANDB_MODE`` (``offline`` writes the run under ``WANDB_DIR``, default
  ``./wandb``; upload later with ``wandb sync``), ``WANDB_DIR``,
  ``WANDB_PROJECT`` (default ``specscope``), ``WANDB_API_KEY``/``wandb login``.
  Online without credentials is refused with a warning rather than prompting.
* MLflow: ``MLFLOW_TRACKING_URI`` (unset: MLflow's default store, a SQLite file
  ``./mlflow.db``; ``file:./mlruns`` is MLflow's file store, which MLflow 3
  opens only with ``MLFLOW_ALLOW_FILE_STORE=true``; ``http://host:5000`` a
  server), ``MLFLOW_EXPERIMENT_NAME`` (default ``specscope``) or
  ``MLFLOW_EXPERIMENT_ID``.

Names: :func:`metric_name` turns ``("speedup", "draft=int8|gamma=fixed:4")`` into
``speedup/draft-int8/gamma-fixed:4``, a name both trackers accept (MLflow allows
letters, digits, ``_ - . : /`` and spaces); W&B groups its panels by the part
before the first ``/``, so each metric gets a section with one value per cell.

This is the neutral bottom layer: it imports no other specscope package.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import logging
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TextIO, cast

__all__ = ["TRACKERS", "DEFAULT_PROJECT", "TrackedRun", "Tracker", "metric_name", "flatten", "number",
           "start_tracker", "missing_library", "usable_tracker"]

#: The ``--track`` choices.
TRACKERS = ("wandb", "mlflow")
#: W&B project / MLflow experiment when the environment names none.
DEFAULT_PROJECT = "specscope"
#: The module each tracker needs, and the pip package that provides it.
_LIBRARIES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow-skinny")}
_INSTALL_HINT = "pip install 'specscope[track]'"
#: MLflow's limits (mlflow.utils.validation): longer values are cut, batches split.
_MLFLOW_PARAM_VALUE_CHARS = 6000
_MLFLOW_KEY_CHARS = 250
_MLFLOW_PARAMS_PER_BATCH = 100
_MLFLOW_METRICS_PER_BATCH = 1000
_OFFLINE_WANDB_MODES = ("offline", "dryrun", "disabled")
#: MLflow stores backed by SQLAlchemy (MLflow's default is ``sqlite:///mlflow.db``).
_MLFLOW_DATABASES = ("sqlite", "postgresql", "mysql", "mssql")

Scalar = str | int | float | bool | None


@dataclass(frozen=True)
class TrackedRun:
    """Where one tracker run went: enough to find it again."""

    tracker: str
    run_id: str
    #: a W&B run URL or offline run directory; an MLflow tracking URI
    location: str
    #: the W&B project / MLflow experiment
    project: str
    offline: bool = False

    def describe(self) -> str:
        """One line for the CLI: which tracker, which run, where, and how to upload an offline run."""
        if self.tracker == "wandb" and self.offline:
            return (f"tracked: wandb offline run {self.run_id} (project {self.project}) in {self.location}; "
                    f"upload it with: wandb sync {self.location}")
        where = "experiment" if self.tracker == "mlflow" else "project"
        return f"tracked: {self.tracker} run {self.run_id} ({where} {self.project}) at {self.location}"


class TrackerUnavailable(Exception):
    """The tracker cannot be used; the message is the reason, in one line."""


def missing_library(kind: str) -> str | None:
    """The one-line reason ``kind`` cannot be imported (without importing it), or ``None`` when it can."""
    if kind not in _LIBRARIES:
        raise ValueError(f"unknown tracker {kind!r}; valid: {', '.join(TRACKERS)}")
    module, package = _LIBRARIES[kind]
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a broken install, or a module blocked in sys.modules
        spec = None
    if spec is None:
        return f"{module} is not installed ({_INSTALL_HINT}, or pip install {package})"
    return None


def _warning(prog: str, kind: str, reason: str) -> str:
    return f"{prog}: warning: --track {kind}: {reason}; not tracked (the results on disk are complete)"


def usable_tracker(kind: str | None, prog: str, stream: TextIO | None = None) -> str | None:
    """``kind`` if its library can be imported; else the one warning line now (before the work) and ``None``.

    For a CLI to call before a long measurement, so a missing library is said at
    the start rather than after it; nothing is imported.
    """
    if kind is None:
        return None
    missing = missing_library(kind)
    if missing:
        print(_warning(prog, kind, missing), file=stream or sys.stderr, flush=True)
        return None
    return kind


_NAME_BAD = re.compile(r"[^A-Za-z0-9_.:/ -]")


def metric_name(*parts: str) -> str:
    """A metric or table name both trackers accept: the parts joined by ``/``.

    In each part ``=`` becomes ``-`` and ``|`` becomes ``/`` (identities written
    ``key=value|key=value`` read ``key-value/key-value``); any other character
    outside letters, digits, ``_ - . : /`` and space becomes ``_``. A name must
    not also be the folder of another (``n`` beside ``n/x``): MLflow's file store
    keeps each metric as a file (:meth:`Tracker.log_metrics` refuses such a pair).
    """
    if not parts or any(not str(p) for p in parts):
        raise ValueError(f"metric_name needs non-empty parts, got {parts!r}")
    out = "/".join(_NAME_BAD.sub("_", str(p).replace("=", "-").replace("|", "/")) for p in parts)
    return out[:_MLFLOW_KEY_CHARS]


def flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested mappings as dotted keys with text values (lists and other values as compact JSON)."""
    out: dict[str, str] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, name + "."))
        elif isinstance(value, str):
            out[name] = value
        else:
            out[name] = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return out


def number(value: Any) -> float | None:
    """``value`` as a finite float (booleans and ``"true"``/``"false"`` as 1/0, numpy scalars too), else ``None``."""
    if isinstance(value, str):
        value = {"true": 1.0, "false": 0.0}.get(value.strip().lower())
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _finite(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The metrics with a finite number; ``None``/NaN/other text are left out, never sent as NaN."""
    out = {}
    for key, value in metrics.items():
        v = number(value)
        if v is not None:
            out[key] = v
    return out


def _cell(v: Any) -> Scalar:
    """A table cell as a plain scalar (NaN as ``None``)."""
    if v is None or isinstance(v, (str, bool, int)):
        return v
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return f if math.isfinite(f) else None


@contextlib.contextmanager
def _quiet_libraries() -> Iterator[None]:
    """Hide the libraries' INFO logging and Python warnings while they work (our one line is the report)."""
    before = logging.root.manager.disable
    logging.disable(max(before, logging.WARNING))  # a library's own logger levels are set when it is imported
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)


class _WandbBackend:
    """Weights & Biases: one ``wandb.init`` run; params are its config, metrics one ``log`` step each call."""

    kind = "wandb"

    def __init__(self, run_name: str, job_type: str, tags: Sequence[str]) -> None:
        import wandb

        self._wandb = wandb
        # the environment as it is now (wandb's own settings are read once per process, at its first use)
        mode = os.environ.get("WANDB_MODE") or wandb.setup().settings.mode
        self.offline = mode in _OFFLINE_WANDB_MODES
        if not self.offline:
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                logged_in = wandb.login(prompt=False, verify=False)  # never prompts; its "key is set" line hidden
            if not logged_in:
                raise TrackerUnavailable("not logged in to W&B (run `wandb login`, set WANDB_API_KEY, or "
                                         "WANDB_MODE=offline to log to files)")
            _probe(wandb.setup().settings.base_url)
        self.project = os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.run = wandb.init(project=self.project, name=run_name, job_type=job_type, tags=list(tags),
                              mode=cast(Any, mode), dir=os.environ.get("WANDB_DIR") or None, reinit="create_new",
                              settings=wandb.Settings(silent=True, console="off"))

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        self.run.log(dict(metrics))

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Scalar]]) -> None:
        self.run.log({name: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])})

    def log_files(self, path: Path, name: str, kind: str, exclude: frozenset[str]) -> None:
        art = self._wandb.Artifact(_artifact_name(name), type=kind)
        for f, rel in _files(path, exclude):  # file by file: add_dir prints a progress line silent=True misses
            art.add_file(str(f), name=rel)
        self.run.log_artifact(art)

    def log_image(self, path: Path, name: str) -> None:
        self.run.log({name: self._wandb.Image(str(path))})

    def log_html(self, path: Path, name: str) -> None:
        self.run.log({name: self._wandb.Html(path.read_text(encoding="utf-8"))})

    def finish(self) -> TrackedRun:
        run_id, run_dir = self.run.id, Path(self.run.dir).parent
        url = None if self.offline else self.run.url
        self.run.finish()
        return TrackedRun("wandb", run_id, str(run_dir) if self.offline or not url else url, self.project,
                          offline=self.offline)

    def abort(self) -> None:
        self.run.finish(exit_code=1)


class _MlflowBackend:
    """MLflow through ``MlflowClient`` (no global active run): params flattened, metrics at step 0."""

    kind = "mlflow"

    def __init__(self, run_name: str, job_type: str, tags: Sequence[str]) -> None:
        import mlflow
        from mlflow.entities import Metric, Param

        self._Metric, self._Param = Metric, Param
        uri = mlflow.get_tracking_uri()  # MLFLOW_TRACKING_URI, else MLflow's default
        if uri.startswith(("http://", "https://")):
            _probe(uri)
        elif uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("true", "1"):
            raise TrackerUnavailable(f"MLflow opens the file store {uri} only with MLFLOW_ALLOW_FILE_STORE=true "
                                     "(set it, or use MLflow's default sqlite:///mlflow.db, or a server)")
        elif uri.split(":", 1)[0].split("+")[0] in _MLFLOW_DATABASES and importlib.util.find_spec("sqlalchemy") is None:
            raise TrackerUnavailable(f"MLflow's database store {uri} needs sqlalchemy and alembic ({_INSTALL_HINT})")
        self.client = mlflow.MlflowClient(uri)
        exp_id = os.environ.get("MLFLOW_EXPERIMENT_ID")
        self.project = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        if exp_id:
            self.project = self.client.get_experiment(exp_id).name
        else:
            exp = self.client.get_experiment_by_name(self.project)
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.project)
        run_tags = {"specscope.job_type": job_type, **{f"specscope.tag.{t}": "true" for t in tags}}
        self.run_id = self.client.create_run(exp_id, tags=run_tags, run_name=run_name).info.run_id
        self.step = 0

    def log_params(self, params: Mapping[str, Any]) -> None:
        flat = [(k[:_MLFLOW_KEY_CHARS], v if len(v) <= _MLFLOW_PARAM_VALUE_CHARS
                 else v[:_MLFLOW_PARAM_VALUE_CHARS - 1] + "…") for k, v in flatten(params).items()]
        for i in range(0, len(flat), _MLFLOW_PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=[self._Param(k, v) for k, v in
                                                       flat[i:i + _MLFLOW_PARAMS_PER_BATCH]])

    def log_metrics(self, metrics: Mapping[str, float]) -> None:
        now_ms = int(time.time() * 1000)
        items = [self._Metric(k, v, now_ms, self.step) for k, v in metrics.items()]
        for i in range(0, len(items), _MLFLOW_METRICS_PER_BATCH):
            self.client.log_batch(self.run_id, metrics=items[i:i + _MLFLOW_METRICS_PER_BATCH])
        self.step += 1

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Scalar]]) -> None:
        data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
        self.client.log_table(self.run_id, data=data, artifact_file=f"tables/{name}.json")

    def log_files(self, path: Path, name: str, kind: str, exclude: frozenset[str]) -> None:
        if path.is_dir() and not exclude:
            self.client.log_artifacts(self.run_id, str(path), artifact_path=name)
            return
        for f, rel in _files(path, exclude):
            folder = str(Path(name, rel).parent)
            self.client.log_artifact(self.run_id, str(f), artifact_path=folder)

    def log_image(self, path: Path, name: str) -> None:
        self.client.log_artifact(self.run_id, str(path), artifact_path=str(Path(name).parent)
                                 if "/" in name else None)

    def log_html(self, path: Path, name: str) -> None:
        self.log_image(path, name)

    def finish(self) -> TrackedRun:
        self.client.set_terminated(self.run_id)
        return TrackedRun("mlflow", self.run_id, self.client.tracking_uri, self.project)

    def abort(self) -> None:
        self.client.set_terminated(self.run_id, status="FAILED")


def _probe(url: str, timeout_s: float = 5.0) -> None:
    """Refuse a tracking server that does not accept a TCP connection within ``timeout_s``.

    Without it an unreachable server costs minutes of the library's retries
    before the warning (MLflow: 7 retries with exponential backoff, "~4 minutes"
    by its own estimate, one try here 4 min 12 s to a closed port; W&B: a 90 s
    init timeout); the logging itself keeps the libraries' own retry policy.
    """
    import socket
    from urllib.parse import urlparse

    u = urlparse(url)
    if not u.hostname:
        return
    port = u.port or (443 if u.scheme == "https" else 80)
    try:
        socket.create_connection((u.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise TrackerUnavailable(f"cannot reach {url} ({exc.strerror or exc})") from None


def _files(path: Path, exclude: frozenset[str]) -> list[tuple[Path, str]]:
    """The files to log under ``path`` (itself if a file) with their relative names, leaving out any file or
    folder named in ``exclude``."""
    if path.is_file():
        return [(path, path.name)]
    out = []
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path)
        if f.is_file() and not exclude.intersection(rel.parts):
            out.append((f, rel.as_posix()))
    return out


def _artifact_name(name: str) -> str:
    """W&B artifact names: letters, digits, ``-``, ``_`` and ``.``."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "files"


_BACKENDS: dict[str, type[_WandbBackend] | type[_MlflowBackend]] = {"wandb": _WandbBackend, "mlflow": _MlflowBackend}


class Tracker:
    """One tracker run; after the first failure every call is a no-op (one warning line in all).

    Use :func:`start_tracker`; as a context manager it finishes the run on exit
    and keeps the :class:`TrackedRun` in :attr:`tracked`.
    """

    def __init__(self, kind: str, prog: str, stream: TextIO | None = None) -> None:
        self.kind = kind
        self.prog = prog
        self.stream = stream
        self.backend: _WandbBackend | _MlflowBackend | None = None
        self.failed: str | None = None
        self.tracked: TrackedRun | None = None

    @property
    def active(self) -> bool:
        """True while the run is open and nothing has failed."""
        return self.backend is not None and self.failed is None

    def _fail(self, reason: str) -> None:
        if self.failed is not None:
            return
        self.failed = " ".join(str(reason).split())[:400] or "unknown error"
        print(_warning(self.prog, self.kind, self.failed), file=self.stream or sys.stderr, flush=True)
        if self.backend is not None:
            with contextlib.suppress(Exception), _quiet_libraries():
                self.backend.abort()

    def _call(self, method: str, *args: Any) -> None:
        if not self.active:
            return
        try:
            with _quiet_libraries():
                getattr(self.backend, method)(*args)
        except Exception as exc:  # noqa: BLE001 - any tracker failure is one warning, never an error
            self._fail(_reason(exc))

    def start(self, run_name: str, job_type: str, tags: Sequence[str] = ()) -> "Tracker":
        """Open the tracker run (one warning line and an inactive tracker when that fails)."""
        missing = missing_library(self.kind)
        if missing:
            self._fail(missing)
            return self
        try:
            with _quiet_libraries():
                self.backend = _BACKENDS[self.kind](run_name, job_type, tags)
        except Exception as exc:  # noqa: BLE001
            self._fail(_reason(exc))
        return self

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Parameters (nested mappings allowed): W&B's run config; MLflow params with dotted keys."""
        self._call("log_params", params)

    def log_metrics(self, metrics: Mapping[str, Any]) -> None:
        """One step of scalar metrics; ``None``, NaN and non-numbers are left out, booleans become 0/1."""
        values = _finite(metrics)
        folders = {n[:i] for n in values for i, ch in enumerate(n) if ch == "/"}
        clash = sorted(folders & set(values))
        if clash:  # MLflow's file store keeps a metric as a file, so a name cannot also be a folder of another
            raise ValueError(f"metric {clash[0]!r} is also the folder of another metric name; rename one")
        if values:
            self._call("log_metrics", values)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """A table: W&B ``wandb.Table``; MLflow ``tables/<name>.json`` (read back with ``load_table``)."""
        if len(set(columns)) != len(columns):
            raise ValueError(f"table {name!r}: duplicate column names {list(columns)}")
        self._call("log_table", name, list(columns), [[_cell(v) for v in r] for r in rows])

    def log_files(self, path: str | os.PathLike, name: str, kind: str = "files", exclude: Sequence[str] = ()) -> None:
        """A file or a directory: a W&B artifact of type ``kind``; MLflow artifacts under ``name/``.

        ``exclude``: names of files or folders in the directory to leave out (e.g. a lock file)."""
        p = Path(path)
        if not p.exists():
            self._fail(f"{str(p)!r} does not exist")
            return
        self._call("log_files", p, name, kind, frozenset(exclude))

    def log_image(self, path: str | os.PathLike, name: str) -> None:
        """A PNG: a W&B image under ``name``; MLflow an artifact in ``name``'s folder."""
        self._call("log_image", Path(path), name)

    def log_html(self, path: str | os.PathLike, name: str) -> None:
        """An HTML page: ``wandb.Html`` under ``name``; MLflow an artifact in ``name``'s folder."""
        self._call("log_html", Path(path), name)

    def finish(self) -> TrackedRun | None:
        """Close the run; returns where it went, or ``None`` when the tracker failed."""
        if self.active:
            try:
                with _quiet_libraries():
                    self.tracked = self.backend.finish()  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001
                self._fail(_reason(exc))
        self.backend = None
        return self.tracked

    def __enter__(self) -> "Tracker":
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is not None and isinstance(exc, Exception):
            self._fail(_reason(exc))
            self.backend = None
            return True  # the block's failure is the tracker's: one warning line, the results stand
        self.finish()
        return False


def _reason(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    if isinstance(exc, TrackerUnavailable):
        return first
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def start_tracker(kind: str, *, run_name: str, job_type: str, prog: str, tags: Sequence[str] = (),
                  stream: TextIO | None = None) -> Tracker:
    """Open a ``kind`` (``wandb``/``mlflow``) tracker run; a failure is one warning line on ``stream`` (stderr).

    The library is imported here, not before: a CLI without ``--track`` never imports it.
    """
    if kind not in TRACKERS:
        raise ValueError(f"unknown tracker {kind!r}; valid: {', '.join(TRACKERS)}")
    return Tracker(kind, prog, stream).start(run_name, job_type, tags)
