"""Where a sweep's cells run: here (``--executor local``) or on a Ray cluster (``--executor ray``).

The local executor is :func:`measure.sweep.run_sweep` itself. The Ray executor
(:func:`run_sweep_distributed`) opens the run as the local one does
(:func:`measure.sweep.open_run`), sends every unfinished cell to the cluster as
one Ray task and writes what comes back:

* **Workers load the models themselves** from the same specs
  (:class:`CellWorker`: the engine from :func:`measure.engines.make_engine`,
  the target, the drafts and the prompts rebuilt from the
  :class:`~measure.sweep.SweepConfig`), so model paths and ``--prompts-file``
  must be visible on every node. A worker process keeps its loaded models for
  the next cell of the same sweep (GPU tasks too: ``max_calls=0``), so a
  node measures a group of cells per model load.
* **The same cell code**: a worker calls :func:`measure.sweep.run_cell` with a
  :class:`RowCollector` in place of the run writer and returns the cell's rows
  as a :class:`CellOutcome` (frozen, picklable).
* **The driver is the only writer** of the run directory: it appends each
  cell's rows as the cell arrives, in any order, its ``cells.csv`` row last,
  exactly as the local executor writes them, so resume, the fingerprint and
  the statistics are those of a local run. Each row names the worker's
  hardware (``cells.csv`` ``hardware``, :func:`measure.records.hardware_label`;
  ``run.json`` ``workers``); the cost curves are timed on one worker
  (``run.json`` ``cost_hardware``), a resume timing only the points not on
  disk (:func:`measure.sweep.cost_points_done`), as the local executor does.
* **Resources**: one GPU per cell on CUDA, else ``cpus_per_cell`` CPUs (and as
  many torch threads), so CPU cells never share cores.
* **Failures**: a worker that dies loses only its cell, which Ray re-runs up to
  ``max_retries`` times; after that, or on an error raised by the cell, the
  cell is reported failed with the worker's error (``run.json``
  ``failed_cells``, then :class:`CellsFailed`) and a resume runs it again.
  Ctrl-C cancels every outstanding task (their workers are stopped) and the
  run closes ``interrupted`` with its finished cells kept.

Tests inject a worker death through :data:`FAULTS_ENV` (see :func:`_inject_fault`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Any, Callable, Iterable, Mapping

import torch

from measure import records, sweep
from measure.rows import CellRow, CostDraftRow, CostTargetRow, Row
from measure.devices import resolve_device
from measure.sweep.cost import DraftKey, TargetKey
from measure.timing import Timer
from sim.policies import GammaSpec
from toolkit.cli import parse_host_port

#: ``--executor`` choices.
EXECUTORS = ("local", "ray")
#: What installs Ray (the ``ray`` extra of pyproject.toml).
RAY_EXTRA = "pip install 'specscope[ray]'"
#: The fingerprint's hardware for a cluster run: the hardware is per cell (cells.csv ``hardware``).
CLUSTER_HARDWARE = {"device": "ray cluster", "device_name": None, "cpu": None, "cores": None, "gpu": None}
#: Tables a cell writes before its ``cells.csv`` row, in the local executor's order.
CELL_TABLES = ("generations", "token_latency", "rounds", "traces")
#: Fault injection for tests: a JSON file ``{cell_id: "once" | "always"}``; the worker exits (``os._exit``)
#: when it starts that cell (``once``: the first time only).
FAULTS_ENV = "SPECSCOPE_TEST_FAULTS"
_ADDRESS = re.compile(r"^(auto|(ray://)?[A-Za-z0-9._-]+:\d+)$")
#: How long joining a Ray cluster may take before the run stops in one line (Ray itself retries for many minutes
#: when nothing, or something else than Ray, answers at the address).
RAY_JOIN_TIMEOUT_S = 30.0
#: Joins the cluster at ``sys.argv[1]`` and leaves: run in a child process, killed after RAY_JOIN_TIMEOUT_S.
_JOIN_PROBE = ("import sys, ray; ray.init(address=sys.argv[1], include_dashboard=False, log_to_driver=False, "
               "configure_logging=False); ray.shutdown()")


def check_ray_address(address: str) -> str:
    """``auto``, ``HOST:PORT`` or ``ray://HOST:PORT`` with a port in 1..65535; else ``ValueError`` (one line)."""
    if not _ADDRESS.match(address):
        raise ValueError(f"--ray-address {address!r}: expected auto or HOST:PORT (e.g. 10.0.0.1:6379)")
    if address != "auto":
        try:
            parse_host_port(address.removeprefix("ray://"))
        except ValueError as exc:  # the port
            raise ValueError(f"--ray-address {exc}") from None
    return address


def probe_ray_address(address: str, timeout_s: float = RAY_JOIN_TIMEOUT_S) -> None:
    """Join the cluster at ``address`` from a child process and leave; ``ValueError`` (one line) when that fails
    or takes longer than ``timeout_s`` (the child is then killed): nothing listening, or no Ray there."""
    if address != "auto":
        host, port = parse_host_port(address.removeprefix("ray://"))
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError as exc:
            raise ValueError(f"--ray-address {address}: nothing answers there ({exc.strerror or exc}); start the "
                             "cluster (ray start --head) or give its address") from None
    child = subprocess.Popen([sys.executable, "-c", _JOIN_PROBE, address], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        _, err = child.communicate(timeout=timeout_s)
    except BaseException as exc:  # the time is up, or Ctrl-C: the probe does not outlive this call
        os.killpg(child.pid, signal.SIGKILL)  # its own session: the probe and anything Ray started for it
        child.communicate()
        if isinstance(exc, subprocess.TimeoutExpired):
            raise ValueError(f"--ray-address {address}: no Ray cluster answered within {timeout_s:g} s (is this "
                             "the head's GCS port, from ray start --head?)") from None
        raise
    if child.returncode != 0:
        last = next((ln for ln in reversed(err.splitlines()) if ln.strip()), f"exit status {child.returncode}")
        raise ValueError(f"--ray-address {address}: cannot join the Ray cluster ({' '.join(last.split())[:200]})")


@dataclass(frozen=True)
class ExecutorConfig:
    """Where the cells run (``--executor``, ``--ray-address``, ``--cpus-per-cell``, ``--max-retries``).

    ``ray_address``: None starts a local Ray instance for this sweep;
    ``auto`` joins the cluster running on this machine (``ray start``);
    ``HOST:PORT`` (or ``ray://HOST:PORT``) joins that cluster's head.
    """

    kind: str = "local"
    ray_address: str | None = None
    cpus_per_cell: int = 1
    max_retries: int = 2

    def __post_init__(self) -> None:
        if self.kind not in EXECUTORS:
            raise ValueError(f"--executor {self.kind!r}: unknown; valid: {', '.join(EXECUTORS)}")
        if self.ray_address is not None:
            check_ray_address(str(self.ray_address))
        if not 1 <= self.cpus_per_cell <= 1024:
            raise ValueError(f"--cpus-per-cell {self.cpus_per_cell}: must be an integer in 1..1024")
        if not 0 <= self.max_retries <= 100:
            raise ValueError(f"--max-retries {self.max_retries}: must be an integer in 0..100")
        if self.kind == "local" and self.ray_address is not None:
            raise ValueError("--ray-address needs --executor ray")


class RayMissing(ValueError):
    """``--executor ray`` without Ray installed."""


class CellsFailed(RuntimeError):
    """Cells that failed on their workers after the retries (their errors are in ``run.json`` ``failed_cells``)."""

    def __init__(self, failed: Mapping[str, str]) -> None:
        self.failed = dict(failed)
        first = next(iter(self.failed.items()))
        super().__init__(f"{len(self.failed)} cell(s) failed on their Ray workers (first: {first[0]}: {first[1]}); "
                         "the finished cells are kept, re-run with the same --out to retry the failed ones")


def import_ray() -> Any:
    """The ``ray`` module, or :class:`RayMissing` naming the extra that installs it."""
    try:
        import ray
    except ImportError:
        raise RayMissing(f"--executor ray: Ray is not installed; install the extra: {RAY_EXTRA}") from None
    return ray


@dataclass(frozen=True)
class CellTask:
    """One cell to measure: the draft spec, γ policy spec, temperature and domain (and its id)."""

    cell_id: str
    draft: str
    gamma_policy: GammaSpec
    temperature: float
    domain: str


@dataclass(frozen=True)
class WorkerInfo:
    """The worker that measured something: host, pid, resolved device and hardware (``run.json`` style)."""

    host: str
    pid: int
    device: str
    hardware: Mapping[str, Any]
    versions: Mapping[str, Any]

    @property
    def label(self) -> str:
        return records.hardware_label(self.hardware)


@dataclass(frozen=True)
class Preparation:
    """What the driver records before the cells: models, prompts, versions and (optionally) the cost curves."""

    worker: WorkerInfo
    target_fingerprint: Mapping[str, Any]
    models: Mapping[str, Any]
    draft_names: tuple[str, ...]
    prompts: Mapping[str, Any]
    synthetic: bool
    cost_target: tuple[CostTargetRow, ...] = ()
    cost_draft: tuple[CostDraftRow, ...] = ()


@dataclass(frozen=True)
class CellOutcome:
    """A measured cell as it travels back to the driver: its rows per table and its ``cells.csv`` row."""

    cell_id: str
    row: CellRow
    tables: Mapping[str, tuple[Row, ...]]
    worker: WorkerInfo
    target_fingerprint: Mapping[str, Any]
    peer_errors: Mapping[str, str] = field(default_factory=dict)


class RowCollector:
    """Stands in for :class:`measure.records.RunWriter` inside a worker: keeps a cell's rows in memory.

    :func:`measure.sweep.run_cell` writes through ``append`` / ``finish_cell``
    and records a failing peer with ``update(peer_errors=...)``; the driver
    writes what was collected.
    """

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.tables: dict[str, list[Row]] = {t: [] for t in CELL_TABLES}
        self.row: CellRow | None = None
        self.repairs: list[str] = []  # nothing staged here, so nothing to repair or quarantine

    def append(self, table: str, rows: Iterable[Row]) -> int:
        rows = list(rows)
        self.tables.setdefault(table, []).extend(rows)
        return len(rows)

    def finish_cell(self, row: CellRow) -> None:
        self.row = row

    def update(self, **fields: Any) -> None:
        self.meta.update(fields)

    def stage(self, record: Mapping[str, Any]) -> None:
        """Visits are not staged on a worker: a cell lost with its worker is re-run whole by Ray."""

    def staged(self) -> list[dict[str, Any]]:
        return []

    def quarantine(self, record: Any, reason: str) -> None:
        """Nothing staged (:meth:`stage`), so nothing to quarantine."""
        raise AssertionError(f"a worker stages no visits, so none fails validation ({reason})")

    def clear_staged(self) -> None:
        """Nothing staged (:meth:`stage`)."""


class CellWorker:
    """A sweep's models on one worker process, rebuilt from the config alone (the driver sends nothing else)."""

    def __init__(self, config: sweep.SweepConfig, cpus: int | None, quiet: bool = True) -> None:
        self.config = config
        device = resolve_device(config.device)
        threads = config.threads or (cpus if not device.startswith("cuda") else None)
        if threads:
            torch.set_num_threads(int(threads))
        prompts, self.selection = sweep.select_prompts(config)
        self.session = sweep.open_session(config, prompts, sweep.engine_options(config, device, threads, quiet),
                                          quiet=quiet)
        self.drafts = dict(zip(config.drafts, self.session.drafts))
        hardware, versions, _ = sweep.environment(device)
        self.info = WorkerInfo(host=socket.gethostname(), pid=os.getpid(), device=device, hardware=hardware,
                               versions=self.session.versions(versions))
        self.ctx = sweep.CellContext(RowCollector(), self.session, config, Timer(device), hardware=self.info.label)

    def prepare(self, cost_curves: bool, done_target: AbstractSet[TargetKey] = frozenset(),
                done_draft: AbstractSet[DraftKey] = frozenset()) -> Preparation:
        """Models, prompts and versions for ``run.json``; when ``cost_curves``, the cost-curve points not
        already on disk (``done_target``/``done_draft``: :func:`measure.sweep.cost_points_done`)."""
        session = self.session
        t_rows: list[CostTargetRow] = []
        d_rows: list[CostDraftRow] = []
        if cost_curves:
            t_rows, d_rows = sweep.cost_curves_for(self.config, session.target, list(session.drafts), self.ctx.timer,
                                                   done_target, done_draft,
                                                   prompt_tokens=sweep.prompt_lengths(session.prompts, session.enc)
                                                   ).measure()
        return Preparation(
            worker=self.info, target_fingerprint=session.target_fingerprint, models=session.models(),
            draft_names=tuple(d.name for d in session.drafts), prompts=session.prompts_meta(),
            synthetic=session.synthetic, cost_target=tuple(t_rows), cost_draft=tuple(d_rows))

    def run(self, task: CellTask, selection_sha256: str) -> CellOutcome:
        """Measure one cell with :func:`measure.sweep.run_cell` and return its rows."""
        if self.selection.get("texts_sha256") != selection_sha256:
            raise ValueError(f"worker {self.info.host}: its prompts differ from the driver's (is --prompts-file the "
                             "same file on every node?)")
        _inject_fault(task.cell_id)
        collector = RowCollector()
        self.ctx.writer = collector
        row = sweep.run_cell(self.ctx, self.drafts[task.draft], task.gamma_policy, task.temperature, task.domain)
        if row.cell_id != task.cell_id:
            raise AssertionError(f"cell id {row.cell_id!r} != {task.cell_id!r}")
        return CellOutcome(cell_id=task.cell_id, row=row,
                           tables={t: tuple(collector.tables.get(t, ())) for t in CELL_TABLES},
                           worker=self.info, target_fingerprint=self.session.target_fingerprint,
                           peer_errors=dict(collector.meta.get("peer_errors", {})))


def _inject_fault(cell_id: str) -> None:
    """Tests only: exit this worker process abruptly at the start of a cell named in :data:`FAULTS_ENV`."""
    path = os.environ.get(FAULTS_ENV)
    if not path or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        mode = json.load(f).get(cell_id)
    if mode is None:
        return
    if mode == "once":
        marker = Path(f"{path}.{hashlib.sha256(cell_id.encode()).hexdigest()[:16]}.done")
        try:
            marker.touch(exist_ok=False)
        except FileExistsError:
            return
    os._exit(3)


#: One per worker process: the models of the sweep it last measured, reused by its next cell.
_WORKERS: dict[str, CellWorker] = {}


def _worker(config: sweep.SweepConfig, cpus: int | None, quiet: bool) -> CellWorker:
    key = json.dumps(config.as_dict(), sort_keys=True, default=str) + f"|{cpus}"
    if key not in _WORKERS:
        _WORKERS.clear()  # another sweep's models: free them first
        _WORKERS[key] = CellWorker(config, cpus, quiet)
    return _WORKERS[key]


def prepare_task(config: sweep.SweepConfig, cpus: int | None, quiet: bool, cost_curves: bool,
                 done_target: AbstractSet[TargetKey] = frozenset(),
                 done_draft: AbstractSet[DraftKey] = frozenset()) -> Preparation:
    """Ray task: load the sweep's models on this worker and describe them (plus the cost-curve points to time)."""
    return _worker(config, cpus, quiet).prepare(cost_curves, done_target, done_draft)


def cell_task(config: sweep.SweepConfig, cpus: int | None, quiet: bool, task: CellTask,
              selection_sha256: str) -> CellOutcome:
    """Ray task: measure one cell on this worker (its models loaded once per worker process)."""
    return _worker(config, cpus, quiet).run(task, selection_sha256)


def _one_line(err: BaseException) -> str:
    cause = getattr(err, "cause", None)  # ray.exceptions.RayTaskError: the exception the cell raised
    if isinstance(cause, BaseException):
        text = f"{type(cause).__name__}: {cause}"
    else:
        text = f"{type(err).__name__}: {err}"
    text = " ".join(text.split())
    return text if len(text) <= 400 else text[:397] + "..."


def _connect(ray: Any, executor: ExecutorConfig) -> bool:
    """Join or start Ray; True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    kw: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
    if executor.ray_address is None:  # a fresh instance on this machine only (RAY_ADDRESS still wins, as in Ray)
        ray.init(address="local", **kw)
    else:
        probe_ray_address(executor.ray_address)  # bounded: ray.init alone would retry for many minutes
        try:
            ray.init(address=executor.ray_address, **kw)
        except Exception as e:  # noqa: BLE001 — Ray raises several kinds here; all mean "cannot join"
            raise ValueError(f"--ray-address {executor.ray_address}: cannot join the Ray cluster "
                             f"({' '.join(str(e).split())[:200]})") from None
    return True


def cell_resources(ray: Any, config: sweep.SweepConfig, executor: ExecutorConfig) -> dict[str, Any]:
    """Ray options of every task: one GPU per cell on CUDA, else ``cpus_per_cell`` CPUs (checked to fit a node)."""
    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    gpus = max((n.get("GPU", 0) for n in nodes), default=0)
    cuda = str(config.device).startswith("cuda") or (config.device == "auto" and gpus > 0)
    if cuda:
        if gpus < 1:
            raise ValueError(f"--device {config.device}: the Ray cluster has no GPU")
        return {"num_gpus": 1, "num_cpus": 1}
    cpus = max((n.get("CPU", 0) for n in nodes), default=0)
    if executor.cpus_per_cell > cpus:
        raise ValueError(f"--cpus-per-cell {executor.cpus_per_cell}: no node of the Ray cluster has that many "
                         f"CPUs (largest: {cpus:g}); valid: 1..{int(cpus)}")
    return {"num_cpus": executor.cpus_per_cell}


def run_sweep_distributed(config: sweep.SweepConfig, out_dir: str | Path, executor: ExecutorConfig,
                          command: str = "", progress: Callable[[str], None] | None = None, show_bar: bool = True,
                          on_cell: Callable[[CellRow], None] | None = None, force_new: bool = False,
                          system_check: dict | None = None, quiet: bool = False, extend: bool = False) -> records.Run:
    """Run (or resume) the sweep into ``out_dir`` with its cells on the Ray cluster of ``executor``; returns the
    run read back (the arguments are :func:`measure.sweep.run_sweep`'s; module docstring).

    Raises :class:`CellsFailed` after writing every cell that succeeded when
    some cells failed on their workers.
    """
    say = progress or (lambda _m: None)
    opened = sweep.open_run(config, out_dir, command, say, force_new, system_check, cluster_hardware=CLUSTER_HARDWARE,
                            extend=extend)
    return run_distributed(config, executor, opened.writer, opened.meta, opened.prompts, opened.selection,
                           progress=say, show_bar=show_bar, on_cell=on_cell, quiet=quiet)


# long: the driver's side of a Ray sweep in order (join, prepare, submit, collect with retries, record); the parts
#   share the ray handle, the writer and the cleanup in one try/finally
def run_distributed(config: sweep.SweepConfig, executor: ExecutorConfig, writer: records.RunWriter,
                    meta: Mapping[str, Any], prompts: Mapping[str, Any], selection: Mapping[str, Any],
                    progress: Callable[[str], None] | None = None, show_bar: bool = True,
                    on_cell: Callable[[CellRow], None] | None = None, quiet: bool = True) -> records.Run:
    """Measure the unfinished cells of ``writer``'s run on Ray and write them as they arrive (module docstring)."""
    say = progress or (lambda _m: None)
    ray = import_ray()
    started = False
    loading: list[Any] = []  # the preparation task while it runs: cancelled the same way
    refs: dict[Any, CellTask] = {}  # the cells queued or running: cancelled on Ctrl-C or an error
    try:
        with writer.recording():  # a cluster that cannot be joined closes the run "failed", saying why
            writer.update(**meta, executor={"kind": executor.kind, "ray_address": executor.ray_address,
                                            "cpus_per_cell": executor.cpus_per_cell,
                                            "max_retries": executor.max_retries}, failed_cells={})
            started = _connect(ray, executor)
            opts = cell_resources(ray, config, executor)
            cpus = opts["num_cpus"] if "num_gpus" not in opts else None
            say(f"Ray: {ray.cluster_resources().get('CPU', 0):g} CPUs, {ray.cluster_resources().get('GPU', 0):g} "
                f"GPUs; each cell asks for {', '.join(f'{k}={v}' for k, v in opts.items())}")
            # max_calls=0: a worker process keeps its models for the next cell (Ray's default for GPU tasks is 1)
            prepare = ray.remote(**opts, max_calls=0, max_retries=executor.max_retries)(prepare_task)
            # a resume times only the points not on disk (curves cut short by an interrupted append included)
            cost = bool(config.cost_curves)
            on_disk = records.load_run(writer.path)  # read once: its cells table is not written before the cells
            done_t, done_d = sweep.cost_points_done(on_disk) if cost else (set(), set())
            say(f"loading {config.target} ({config.engine}) on a worker"
                + (" and timing the cost curves' missing points" if done_t or done_d
                   else " and timing cost curves" if cost else ""))
            loading.append(prepare.remote(config, cpus, quiet, cost, done_t, done_d))
            try:
                prep: Preparation = ray.get(loading[0])
            except ray.exceptions.RayError as e:
                raise ValueError(f"loading the models on a Ray worker failed: {_one_line(e)}") from None
            loading.clear()
            writer.check_fingerprint(prep.target_fingerprint)
            writer.update(models=dict(prep.models), versions={**meta["versions"], **prep.worker.versions},
                          prompts=dict(prep.prompts), hardware=dict(prep.worker.hardware),
                          workers={**writer.meta.get("workers", {}), prep.worker.label: dict(prep.worker.hardware)})
            if prep.cost_target or prep.cost_draft:
                writer.append("cost_draft", prep.cost_draft)
                writer.append("cost_target", prep.cost_target)
                writer.update(cost_hardware=prep.worker.label)
                sweep.screen_cost(writer, None, say)  # timed on a worker: an out-of-line point is dropped
            done_cells: list[CellRow] = on_disk.rows(CellRow)
            for c in done_cells:
                if on_cell:
                    on_cell(c)
            names = list(prep.draft_names)
            todo = [CellTask(p.cell_id(names), config.drafts[p.draft_index], p.gamma, float(p.temperature), p.domain)
                    for p in sweep.pending_cells(config, names, list(prompts), writer)]
            run_cell_remote = ray.remote(**opts, max_calls=0, max_retries=executor.max_retries,
                                         retry_exceptions=False)(cell_task)
            sha = str(selection.get("texts_sha256"))
            refs = {run_cell_remote.remote(config, cpus, quiet, task, sha): task for task in todo}
            bar = None
            if show_bar and todo:
                from tqdm import tqdm

                bar = tqdm(total=len(todo), desc="measure (ray)", unit="cell", file=sys.stderr, dynamic_ncols=True)
            failed: dict[str, str] = {}
            try:
                while refs:
                    ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)  # wakes for Ctrl-C
                    if not ready:
                        continue
                    task = refs.pop(ready[0])
                    try:
                        out: CellOutcome = ray.get(ready[0])
                    except ray.exceptions.RayError as e:
                        failed[task.cell_id] = _one_line(e)
                        say(f"cell {task.cell_id} failed after up to {executor.max_retries} retries: "
                            f"{failed[task.cell_id]}")
                        writer.update(failed_cells=failed)
                        continue
                    diff = records.fingerprint_diff(dict(prep.target_fingerprint), dict(out.target_fingerprint))
                    if diff:
                        failed[task.cell_id] = (f"worker {out.worker.host} loaded a different model "
                                                f"({'; '.join(diff)})")
                        writer.update(failed_cells=failed)
                        continue
                    _write_outcome(writer, out)
                    done_cells.append(out.row)
                    writer.update(summary=sweep.summarize(done_cells, prep.synthetic))
                    if bar is not None:
                        bar.update(1)
                        bar.clear()
                    if on_cell:
                        on_cell(out.row)
                    if bar is not None:
                        bar.refresh()
            finally:
                if bar is not None:
                    bar.close()
            writer.update(summary=sweep.summarize(done_cells, prep.synthetic), failed_cells=failed)
            if failed:
                raise CellsFailed(failed)
    finally:
        for ref in [*loading, *refs]:  # Ctrl-C or an error: stop what is still queued or running
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()
    return records.load_run(writer.path)


def _write_outcome(writer: records.RunWriter, out: CellOutcome) -> None:
    """Append a cell's rows as the local executor does (its ``cells.csv`` row last) and note its worker."""
    for table in CELL_TABLES:
        writer.append(table, out.tables.get(table, ()))
    if out.peer_errors:
        writer.meta["peer_errors"] = {**writer.meta.get("peer_errors", {}), **out.peer_errors}
    workers = writer.meta.setdefault("workers", {})
    workers.setdefault(out.worker.label, dict(out.worker.hardware))
    writer.finish_cell(out.row)
