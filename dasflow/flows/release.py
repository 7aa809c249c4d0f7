"""The production release flow: validate (all products, before anything is frozen) → freeze config → plan
against the cap → one subflow per product (preprocess → measure → post-process → its release files; products
side by side with ``product_lanes`` > 1) → release (ledger audit, certificate, accuracy report, manifest)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.futures import PrefectConcurrentFuture, PrefectFuture
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from dasflow.config import ReleaseConfig, load_release_config, parse_release_config
from dasflow.errors import DasflowError, InputError
from dasflow.flows.approval import approval_gate, end_stale_release_runs, exit_with_worker, release_slot
from dasflow.io.store import LocalStore, open_store
from dasflow.pipeline import stages
from dasflow.pipeline.run import candidate_context, code_version, freeze_config, open_run
from dasflow.tasks.stages import (
    measure_batch_task,
    measure_batches_task,
    measure_task,
    plan_task,
    postprocess_batch_task,
    postprocess_task,
    postprocess_waves_task,
    preprocess_task,
    product_release_task,
    release_task,
    validate_task,
)


@flow(name="dasflow-product", flow_run_name="{product}-{release_id}", log_prints=True)
def product_flow(release_id: str, store_uri: str, product: str, measure_on_workers: bool = False) -> dict[str, Any]:
    """One product of a release: preprocess → measure → post-process → its release files (tables and derived
    files, in this product's lane rather than one after another in the release stage).

    Post-processing runs on the flow's task runner — threads, or the workers of a Dask cluster — never in the
    flow process: the task plan (``postprocess_waves_task``) is made on every worker process at once, so each
    loads the public inputs it keeps for its parts while the first, serial wave runs; a product whose
    post-processing comes in independent parts (TopDown: per state, per family of parents) has them grouped
    into batches sized for the worker slots (``task_waves``), each wave's batches mapped onto the runner; they
    read and write their parts in the store (only small summaries travel through the scheduler). The
    post-process task, on the runner too, then combines the stored parts.

    With ``measure_on_workers`` on a Dask cluster, a segmented product's measurements (TopDown's keys below the
    state level) are drawn first on the workers, in batches of segments by state (``measure_batches``; each
    segment measure-once in the ledger, nothing committed); the measure task then commits every key, drawing
    only what no batch drew. Otherwise the measure task draws everything itself (one state's counts in memory
    at a time)."""
    prepared = preprocess_task(release_id, store_uri, product)
    slots, processes = _worker_slots()
    drawn_ahead: list[dict[str, Any]] = []
    if measure_on_workers and processes != [None]:
        segments = measure_batches_task(release_id, store_uri, product)
        if segments:
            drawn_ahead = measure_batch_task.map(unmapped(release_id), unmapped(store_uri), unmapped(product),
                                                 segments).result()
    measured = measure_task(release_id, store_uri, product)
    plans = []
    for address in processes:
        with _pinned(address):
            plans.append(postprocess_waves_task.submit(release_id, store_uri, product, slots))
    batches: list[dict[str, Any]] = []
    for wave in plans[0].result():
        futures = postprocess_batch_task.map(unmapped(release_id), unmapped(store_uri), unmapped(product), wave)
        batches.extend(futures.result())  # every batch of a wave before the next wave
    post = postprocess_task.submit(release_id, store_uri, product).result()
    for plan in plans[1:]:
        plan.wait()
    files = product_release_task(release_id, store_uri, product)
    return {"preprocess": prepared, "measure": measured, "postprocess": post, "release_files": files,
            "measure_batches": len(drawn_ahead), "measure_processes": sorted({b["process"] for b in drawn_ahead}),
            "postprocess_parts": sum(b["parts"] for b in batches), "postprocess_batches": len(batches),
            "part_processes": sorted({b["process"] for b in batches})}


def _worker_slots() -> tuple[int, list[str | None]]:
    """Parallel task slots of the current flow's task runner — the Dask cluster's worker threads, or this
    machine's cores for threads — and its worker processes (Dask worker addresses; ``[None]``: this process)."""
    runner = getattr(FlowRunContext.get(), "task_runner", None)
    dask_runners = sys.modules.get("prefect_dask.task_runners")  # not imported: no Dask runner (≈ 1 s to import)
    if dask_runners is not None and isinstance(runner, dask_runners.DaskTaskRunner):
        nthreads: dict[str, int] = runner.client.nthreads()
        return max(1, sum(nthreads.values())), list(sorted(nthreads)) or [None]
    return os.cpu_count() or 1, [None]


@contextlib.contextmanager
def _pinned(address: str | None) -> Iterator[None]:
    """Tasks submitted inside go to the Dask worker at ``address`` if it is still there (a placement hint:
    any worker may run them)."""
    if address is None:
        yield
        return
    import dask

    with dask.annotate(workers=[address], allow_other_workers=True):  # type: ignore[attr-defined]
        yield


@task(name="product", task_run_name="{product}", cache_policy=NO_CACHE)
def product_task(config: dict[str, Any], store_uri: str, product: str) -> dict[str, Any]:
    """One product's subflow (:func:`product_flow`) as a task of the release flow, so that several products can
    run side by side; its own tasks run on the release's task runner (threads or the Dask cluster)."""
    cfg = parse_release_config(config)
    return product_flow.with_options(task_runner=task_runner(cfg))(cfg.release_id, store_uri, product,
                                                                   bool(cfg.measure_on_workers))


def _no_start_after_a_failure(futures: list[PrefectFuture[Any]]) -> None:
    """When one of ``futures`` ends in any state but Completed, cancel those that have not started: the
    callback runs in the finishing thread before it takes the next queued product."""
    waiting = [f.wrapped_future for f in futures if isinstance(f, PrefectConcurrentFuture)]

    def on_done(done: concurrent.futures.Future[Any]) -> None:
        if done.cancelled() or done.exception() is not None or not done.result().is_completed():
            for other in waiting:
                other.cancel()

    for future in waiting:
        future.add_done_callback(on_done)


def product_runner(lanes: int) -> TaskRunner[Any]:
    """The release flow's task runner: ``lanes`` products' subflows at a time, in this process."""
    runner: TaskRunner[Any] = ThreadPoolTaskRunner(max_workers=max(1, lanes))
    return runner


@flow(name="dasflow-release", log_prints=True, task_runner=product_runner(1))
def release_flow(config: dict[str, Any], require_approval: bool = False) -> dict[str, Any]:
    """Run (or resume) one release. ``config`` is a release config object (see ``dasflow.config``). With
    ``require_approval`` (every deployment run) the flow pauses after planning until an operator approves the
    plan in the UI (``flows/approval.py``); nothing is drawn before.

    The products' validations, then their subflows, are submitted to the flow's task runner, the subflows
    largest plan first (``largest_first``): as many run at a time as it has threads (one by default, so that
    one product's data is in memory at a time, as a national run needs; ``run_release(product_lanes=...)``,
    ``dasflow run --product-lanes N``). They are independent once the plan is frozen: each measures only its
    own planned keys, each key under its own create-only ledger entries, with noise that depends on no other
    draw (the CSPRNG, or in test mode a generator derived from seed and key alone), so the release bytes do
    not depend on how many run at once, or in which order. After a failure no further product starts (those
    running finish, all of it resumable) and the first failure (in start order)
    is raised."""
    cfg = parse_release_config(config)
    store_uri = candidate_context(cfg).store.uri  # an existing release must have this very config
    # validation before freezing: a refused input leaves the release id reusable, and nothing is planned on it.
    # With product lanes the products validate side by side (each streams its own files; Great Expectations runs
    # under one lock), the costliest first (``validation_order``); after a failure no further validation starts,
    # and the first failure (in start order) is raised
    checks = {name: validate_task.submit(config, name) for name in stages.validation_order(cfg)}
    _no_start_after_a_failure(list(checks.values()))
    validated = {name: future.result() for name, future in checks.items()}
    freeze_config(cfg)
    plan = plan_task(cfg.release_id, store_uri)
    print(f"release {cfg.release_id}: plan frozen, total rho = {plan['rho']} "
          f"(epsilon at delta=1e-10: {plan['epsilon_at_delta']})")
    if require_approval:
        approval_gate(cfg.release_id, store_uri)
    started = {name: product_task.submit(config, store_uri, name)  # the largest first: they end the release
               for name in stages.largest_first(open_run(cfg.release_id, store_uri))}
    _no_start_after_a_failure(list(started.values()))
    done = {name: future.result() for name, future in started.items()}  # the first failure, in start order
    products = {p.name: done[p.name] for p in cfg.products}
    released = release_task(cfg.release_id, store_uri)
    return {"release_id": cfg.release_id, "store": store_uri, "plan": plan, "validate": validated,
            "products": products, "release": released}


def task_runner(cfg: ReleaseConfig) -> TaskRunner[Any]:
    """The task runner of the per-product flows: threads in this process, or the Dask cluster at
    ``dask_address`` (its workers must reach the release's store: a shared path or S3)."""
    if cfg.task_runner == "thread":
        return ThreadPoolTaskRunner()
    if not cfg.dask_address:
        raise InputError("task_runner 'dask' needs dask_address (run_release starts a local cluster if unset)",
                         column="dask_address")
    from prefect_dask.task_runners import DaskTaskRunner

    runner: TaskRunner[Any] = DaskTaskRunner(address=cfg.dask_address)
    return runner


def _api_url() -> str:
    """The Prefect API the flow reports to: the configured server, or this process's temporary server (started
    now), so task runs on local Dask workers are recorded on the same server as their flow."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    configured = get_current_settings().api.url
    if configured:
        return str(configured)
    server = SubprocessASGIServer()
    server.start()
    return str(server.api_url)


@contextlib.contextmanager
def local_dask_cluster(cfg: ReleaseConfig, workers: int = 2) -> Iterator[ReleaseConfig]:
    """``cfg`` with a Dask scheduler address: the configured one, or a ``distributed.LocalCluster`` of
    ``workers`` single-threaded worker processes on 127.0.0.1 for the duration of the run — child processes of
    this one on this machine, so they draw the measurements too unless ``measure_on_workers`` is false."""
    if cfg.task_runner != "dask" or cfg.dask_address:
        yield cfg
        return
    import dask
    from distributed import LocalCluster

    with dask.config.set(WORKER_DASK_CONFIG), LocalCluster(  # type: ignore[no-untyped-call]
            n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
            env=WORKER_THREADS | {"PREFECT_API_URL": _api_url()}) as cluster:
        try:
            yield cfg.model_copy(update={"dask_address": cluster.scheduler_address,
                                         "measure_on_workers": cfg.measure_on_workers is not False})
        finally:
            stop_workers(cluster)


def stop_workers(cluster: Any, timeout: float = 30.0) -> None:
    """Close a local cluster's workers while its scheduler is still up, before the cluster itself closes: each
    worker stops its heartbeat and then leaves. Closing the scheduler and the workers together races a
    worker's last heartbeat against the closed scheduler, and the worker process logs the failure with a
    traceback (dask/distributed#7192) on the operator's terminal at the end of a good run. Waits at most
    ``timeout`` seconds; the cluster's own close handles anything left."""
    cluster.scale(0)
    deadline = time.monotonic() + timeout
    while cluster.scheduler_info.get("workers") and time.monotonic() < deadline:
        time.sleep(0.05)


#: A worker runs one task per thread; numeric libraries must not start their own thread pools on top (they
#: would oversubscribe the cores and spin). Dask's nanny sets these too; an agency's cluster should as well.
WORKER_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: Dask settings of the scheduler and workers dasflow starts (measured, BENCHMARKS.md "Scale-out"): the nanny's
#: default ``MALLOC_TRIM_THRESHOLD_=65536`` turns off glibc's dynamic mmap threshold, so every large numpy
#: temporary is a fresh mmap whose pages fault in again — TopDown's parts took 2× the CPU (most of it system
#: time) on a worker than in one process; the worker's statistical profiler samples every thread's stack each
#: 10 ms: both off. The idle services' periods — the event-loop tick (20 ms), the system monitor's psutil samples
#: (500 ms) and the memory monitor (100 ms) in the scheduler, every nanny and every worker — cost a 2-worker
#: LocalCluster ≈ 0.13 CPU-s per second doing nothing; at 1 s, 5 s and 1 s ≈ 0.02. On an agency's cluster: a
#: Dask config file on the scheduler and workers (docs/scale-out.md, dasflow-worker.yaml).
WORKER_DASK_CONFIG: dict[str, Any] = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                                      "distributed.worker.profile.enabled": False,
                                      "distributed.admin.tick.interval": "1s",
                                      "distributed.admin.system-monitor.interval": "5s",
                                      "distributed.worker.memory.monitor-interval": "1s"}

#: Seconds to reach a configured Dask scheduler before the release gives up (nothing has run by then).
CONNECT_TIMEOUT = 15.0


def probe_worker(store_uri: str, key: str) -> dict[str, Any]:
    """Run on every worker by :func:`check_cluster`: the worker's dasflow code version, whether it reads the
    probe object ``key`` of the release's store (same store, same credentials), its Prefect API and the
    thread settings of its numeric libraries."""
    try:
        seen = open_store(store_uri).get(key).decode()
    except Exception as exc:  # reported by the client, whatever the worker's store raises
        seen = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    import dask

    return {"code": code_version(), "probe": seen, "api": os.environ.get("PREFECT_API_URL"),
            "threads": {k: os.environ.get(k) for k in WORKER_THREADS},
            "malloc_trim": os.environ.get("MALLOC_TRIM_THRESHOLD_"),
            "profiler": bool(dask.config.get("distributed.worker.profile.enabled", True))}


def connect_scheduler(address: str) -> Any:
    """A ``distributed.Client`` of the scheduler at ``address``; one line (DasflowError) if it does not answer
    within ``CONNECT_TIMEOUT`` seconds. The CLI calls it before waiting for its temporary Prefect server, so a
    wrong ``--dask-address`` fails at once."""
    from distributed import Client

    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as exc:
        raise DasflowError(f"Dask scheduler {address} is unreachable ({type(exc).__name__}: "
                           f"{str(exc).splitlines()[0] if str(exc) else 'no answer'}); start the cluster or "
                           "fix --dask-address") from None


def check_cluster(cfg: ReleaseConfig) -> dict[str, dict[str, Any]]:
    """Before a release runs on the Dask cluster at ``dask_address``: the scheduler answers, and every worker
    has this dasflow code and sees the release's store — it reads an object the client has just written
    there (a local directory a worker cannot see, or a same-named directory on the worker's own disk, is
    refused; so are missing S3 credentials on a worker). Workers without this flow's ``PREFECT_API_URL``, with
    multi-threaded numeric libraries, Dask's malloc trim threshold or its profiler get a warning. One line per
    failure; nothing is drawn before."""
    import uuid

    address = str(cfg.dask_address)
    client = connect_scheduler(address)
    store = open_store(cfg.store)
    token = uuid.uuid4().hex
    key = f"cluster-probes/{token}"
    try:
        with client:
            store.put(key, token.encode())
            answers: dict[str, dict[str, Any]] = client.run(probe_worker, store.uri, key)
    finally:
        store.delete(key)
    if not answers:
        raise DasflowError(f"Dask scheduler {address} has no workers; start some (docs/scale-out.md)")
    mine = code_version()
    for worker, seen in sorted(answers.items()):
        if seen["probe"] != token:
            where = "a local directory" if isinstance(store, LocalStore) else "the store"
            raise InputError(f"Dask worker {worker} cannot read the release store {store.uri} ({where}; "
                             f"{seen['probe'] or 'other content'}): use an s3:// store, or a directory every "
                             "worker shares, with the worker's credentials (docs/scale-out.md)", column="store")
        if seen["code"] != mine:
            raise InputError(f"Dask worker {worker} runs dasflow code {seen['code']}, this client {mine}: install "
                             "the same dasflow on every worker", column="dask_address")
    api = os.environ.get("PREFECT_API_URL")
    for worker, seen in sorted(answers.items()):
        if api and seen["api"] != api:
            print(f"warning: Dask worker {worker} reports to Prefect API {seen['api']}, this flow to {api}: its "
                  "task runs will not show in this flow run (set PREFECT_API_URL on the workers)")
        if any(v != "1" for v in seen["threads"].values()):
            print(f"warning: Dask worker {worker} has {seen['threads']}; set them to 1 (one task per thread)")
        if seen["malloc_trim"] is not None or seen["profiler"]:
            print(f"warning: Dask worker {worker} runs with MALLOC_TRIM_THRESHOLD_={seen['malloc_trim']} and "
                  f"profiler {'on' if seen['profiler'] else 'off'}: post-processing may cost up to 2x the CPU "
                  "(docs/scale-out.md, worker settings)")
    return answers


def run_release(cfg: ReleaseConfig, *, require_approval: bool = False, product_lanes: int = 1) -> dict[str, Any]:
    """Run the release flow with Prefect result storage in the release's own store (local stores), with
    ``product_lanes`` products at a time."""
    store = open_store(cfg.store)
    options: dict[str, Any] = {"flow_run_name": f"release-{cfg.release_id}",
                               "task_runner": product_runner(product_lanes)}
    if isinstance(store, LocalStore):
        options["result_storage"] = store.local_path(f"runs/{cfg.release_id}/prefect-results")
        options["persist_result"] = True
    if cfg.task_runner == "dask" and cfg.dask_address:
        check_cluster(cfg)  # an agency's cluster: reachable, same code, sees the store
    with local_dask_cluster(cfg) as run_cfg:
        payload = run_cfg.model_dump(mode="json")
        result: dict[str, Any] = release_flow.with_options(**options)(payload, require_approval)
    return result


def run_release_file(path: str | Path) -> dict[str, Any]:
    return run_release(load_release_config(path))


class ReleaseRequest(BaseModel):
    """Parameters of a release started from the Prefect UI or a schedule (rendered as a form)."""

    config_path: str = Field(description="path of the release config JSON on the worker (see README)")


@flow(name="dasflow-release-from-file", log_prints=True)
def release_from_file(request: ReleaseRequest) -> dict[str, Any]:
    """Run (or resume) the release described by a config file, gated by an operator's approval."""
    exit_with_worker()
    cfg = load_release_config(request.config_path)
    with release_slot(cfg.release_id):
        end_stale_release_runs(cfg.release_id)
        return run_release(cfg, require_approval=True)
