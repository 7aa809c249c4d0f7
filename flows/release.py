"""The production release flow: freeze config → plan against the cap → validate (all products, before any
noise) → one subflow per product (preprocess → measure → post-process) → release."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from dasflow.config import ReleaseConfig, load_release_config, parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore, open_store
from dasflow.pipeline.run import freeze_config
from tasks.stages import (
    measure_task,
    plan_task,
    postprocess_task,
    preprocess_task,
    release_task,
    validate_task,
)


@flow(name="dasflow-product", flow_run_name="{product}-{release_id}", log_prints=True)
def product_flow(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    """One product of a release: preprocess → measure → post-process."""
    prepared = preprocess_task(release_id, store_uri, product)
    measured = measure_task(release_id, store_uri, product)
    post = postprocess_task(release_id, store_uri, product)
    return {"preprocess": prepared, "measure": measured, "postprocess": post}


@flow(name="dasflow-release", log_prints=True)
def release_flow(config: dict[str, Any]) -> dict[str, Any]:
    """Run (or resume) one release. ``config`` is a release config object (see ``dasflow.config``)."""
    cfg = parse_release_config(config)
    ctx = freeze_config(cfg)
    store_uri = ctx.store.uri
    plan = plan_task(cfg.release_id, store_uri)
    print(f"release {cfg.release_id}: plan frozen, total rho = {plan['rho']} "
          f"(epsilon at delta=1e-10: {plan['epsilon_at_delta']})")
    validated = {p.name: validate_task(cfg.release_id, store_uri, p.name) for p in cfg.products}
    products = {p.name: product_flow(cfg.release_id, store_uri, p.name) for p in cfg.products}
    released = release_task(cfg.release_id, store_uri)
    return {"release_id": cfg.release_id, "store": store_uri, "plan": plan, "validate": validated,
            "products": products, "release": released}


def run_release(cfg: ReleaseConfig) -> dict[str, Any]:
    """Run the release flow with Prefect result storage in the release's own store (local stores)."""
    if cfg.task_runner != "thread":
        raise InputError("task_runner 'dask' (Dask scale-out) is not built in this version; use 'thread'",
                         column="task_runner")
    store = open_store(cfg.store)
    options: dict[str, Any] = {"flow_run_name": f"release-{cfg.release_id}"}
    if isinstance(store, LocalStore):
        options["result_storage"] = store.local_path(f"runs/{cfg.release_id}/prefect-results")
        options["persist_result"] = True
    payload = cfg.model_dump(mode="json")
    result: dict[str, Any] = release_flow.with_options(**options)(payload)
    return result


def run_release_file(path: str | Path) -> dict[str, Any]:
    return run_release(load_release_config(path))


class ReleaseRequest(BaseModel):
    """Parameters of a release started from the Prefect UI or a schedule (rendered as a form)."""

    config_path: str = Field(description="path of the release config JSON on the worker (see README)")


@flow(name="dasflow-release-from-file", log_prints=True)
def release_from_file(request: ReleaseRequest) -> dict[str, Any]:
    """Run (or resume) the release described by a config file: the deployment entry point."""
    return run_release(load_release_config(request.config_path))
