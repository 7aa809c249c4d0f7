"""The production release flow: validate (all products, before anything is frozen) → freeze config → plan
against the cap → one subflow per product (preprocess → measure → post-process) → release."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, unmapped
from prefect.task_runners import TaskRunner, ThreadPoolTaskRunner
from pydantic import BaseModel, Field

from dasflow.config import ReleaseConfig, load_release_config, parse_release_config
from dasflow.errors import InputError
from dasflow.flows.approval import approval_gate, end_stale_release_runs, exit_with_worker, release_slot
from dasflow.io.store import LocalStore, open_store
from dasflow.pipeline.run import candidate_context, freeze_config
from dasflow.tasks.stages import (
    measure_task,
    plan_task,
    postprocess_part_task,
    postprocess_steps_task,
    postprocess_task,
    preprocess_task,
    release_task,
    validate_task,
)


@flow(name="dasflow-product", flow_run_name="{product}-{release_id}", log_prints=True)
def product_flow(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    """One product of a release: preprocess → measure → post-process.

    A product whose post-processing comes in independent parts (TopDown: per state, per family of parents)
    maps each step's parts onto the flow's task runner — threads, or the workers of a Dask cluster — and the
    post-process task then combines the stored parts."""
    prepared = preprocess_task(release_id, store_uri, product)
    measured = measure_task(release_id, store_uri, product)
    parts: list[dict[str, Any]] = []
    for step in postprocess_steps_task(release_id, store_uri, product):
        futures = postprocess_part_task.map(unmapped(release_id), unmapped(store_uri), unmapped(product),
                                            unmapped(step["step"]), step["parts"])
        parts.extend(futures.result())  # every part of a step before the next step
    post = postprocess_task(release_id, store_uri, product)
    return {"preprocess": prepared, "measure": measured, "postprocess": post, "postprocess_parts": len(parts),
            "part_processes": sorted({p["process"] for p in parts})}


@flow(name="dasflow-release", log_prints=True)
def release_flow(config: dict[str, Any], require_approval: bool = False) -> dict[str, Any]:
    """Run (or resume) one release. ``config`` is a release config object (see ``dasflow.config``). With
    ``require_approval`` (every deployment run) the flow pauses after planning until an operator approves the
    plan in the UI (``flows/approval.py``); nothing is drawn before."""
    cfg = parse_release_config(config)
    store_uri = candidate_context(cfg).store.uri  # an existing release must have this very config
    # validation before freezing: a refused input leaves the release id reusable, and nothing is planned on it
    validated = {p.name: validate_task(config, p.name) for p in cfg.products}
    freeze_config(cfg)
    plan = plan_task(cfg.release_id, store_uri)
    print(f"release {cfg.release_id}: plan frozen, total rho = {plan['rho']} "
          f"(epsilon at delta=1e-10: {plan['epsilon_at_delta']})")
    if require_approval:
        approval_gate(cfg.release_id, store_uri)
    per_product = product_flow.with_options(task_runner=task_runner(cfg))
    products = {p.name: per_product(cfg.release_id, store_uri, p.name) for p in cfg.products}
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
    ``workers`` single-threaded worker processes on 127.0.0.1 for the duration of the run."""
    if cfg.task_runner != "dask" or cfg.dask_address:
        yield cfg
        return
    from distributed import LocalCluster

    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,  # type: ignore[no-untyped-call]
                      host="127.0.0.1", dashboard_address=None, env={"PREFECT_API_URL": _api_url()}) as cluster:
        yield cfg.model_copy(update={"dask_address": cluster.scheduler_address})


def run_release(cfg: ReleaseConfig, *, require_approval: bool = False) -> dict[str, Any]:
    """Run the release flow with Prefect result storage in the release's own store (local stores)."""
    store = open_store(cfg.store)
    options: dict[str, Any] = {"flow_run_name": f"release-{cfg.release_id}"}
    if isinstance(store, LocalStore):
        options["result_storage"] = store.local_path(f"runs/{cfg.release_id}/prefect-results")
        options["persist_result"] = True
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
