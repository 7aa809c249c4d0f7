"""Prefect tasks: thin wrappers over ``dasflow.pipeline.stages`` that take and return small manifests.

Big data never travels through Prefect results: every task opens the release from its store by id, writes its
outputs there itself, and returns a JSON-sized summary. Retries are for transient store faults only; bad input
(``InputError``) and ledger refusals (``LedgerRefusal``) fail at once.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, cast
from uuid import UUID

from prefect import task
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.context import TaskRunContext

from dasflow.config import parse_release_config
from dasflow.errors import InputError, LedgerRefusal
from dasflow.io.store import StoreError, StoreUnavailable
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, candidate_context, open_run
from dasflow.release.ledger_archive import archive_ledger
from dasflow.release.stage import product_release_files, release_stage
from dasflow.tasks.reports import artifact_key, product_validation_artifact, release_reports


def is_transient(exc: BaseException) -> bool:
    """Whether a failure may heal on retry: not bad input, not a ledger refusal, not a programming error."""
    if isinstance(exc, InputError | LedgerRefusal):
        return False
    return isinstance(exc, StoreError | StoreUnavailable | OSError | ConnectionError | TimeoutError)


def _transient(task_: Any, task_run: Any, state: Any) -> bool:
    """Prefect retry condition: retry transient store / network faults only."""
    try:
        state.result()
    except Exception as exc:
        return is_transient(exc)
    return False


_artifact_key = artifact_key  # the name flows import


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    return {"stage": record.get("stage"), "product": record.get("product"),
            "outputs": {k: {"sha256": v.get("sha256"), "rows": v.get("rows")}
                        for k, v in record.get("outputs", {}).items()}}


TASK_OPTS: dict[str, Any] = {"retries": 2, "retry_delay_seconds": 1, "retry_condition_fn": _transient,
                             "cache_policy": NO_CACHE}


@task(name="plan-and-freeze", **TASK_OPTS)
def plan_task(release_id: str, store_uri: str) -> dict[str, Any]:
    """Plan every product and check the plan against the cap, before any noise."""
    return stages.plan_stage(open_run(release_id, store_uri)).as_record()


@task(name="validate", **TASK_OPTS)
def validate_task(config: dict[str, Any], product: str) -> dict[str, Any]:
    """The fail-closed validation gate, before the config is frozen; its summary is a table artifact (also on
    failure)."""
    ctx = candidate_context(parse_release_config(config))
    try:
        return _summary(stages.validate_stage(ctx, product))
    finally:
        product_validation_artifact(ctx, product)


@task(name="preprocess", **TASK_OPTS)
def preprocess_task(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    return _summary(stages.preprocess_stage(open_run(release_id, store_uri), product))


@task(name="measure", **TASK_OPTS)
def measure_task(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    """Measure-once for every planned key of the product, with a progress bar in the Prefect UI."""
    ctx = open_run(release_id, store_uri)
    artifact_id = cast(UUID, create_progress_artifact(progress=0.0, key=_artifact_key("measure", release_id, product),
                                                      description=f"{product}: planned keys measured"))

    return stages.measure_stage(ctx, product, progress_reporter(artifact_id))


@task(name="measure-batches", **TASK_OPTS)
def measure_batches_task(release_id: str, store_uri: str, product: str) -> list[list[list[str]]]:
    """The product's segments to draw on the workers before its measure task, in batches (empty: none)."""
    return stages.measure_batches(_shared_run(release_id, store_uri), product)


@task(name="measure-batch", task_run_name="measure-{product}-{batch[0][1]}", **TASK_OPTS)
def measure_batch_task(release_id: str, store_uri: str, product: str, batch: list[list[str]]) -> dict[str, Any]:
    """One batch of segments drawn measure-once on a worker (nothing committed; the measure task commits): it
    reads its partitions' counts from the store and writes its NMF segments there, returning a small summary."""
    return stages.measure_batch(_shared_run(release_id, store_uri), product, batch) | {"process": os.getpid()}


#: seconds between two updates of a progress artifact (the last key always updates it)
PROGRESS_SECONDS = 2.0


def progress_reporter(artifact_id: UUID | None,
                      clock: Callable[[], float] = time.monotonic) -> Callable[[int, int, str], None]:
    """A measure stage's progress callback: updates the artifact at most every ``PROGRESS_SECONDS`` and when the
    last key is done (each update is an API call and a stored artifact version, so not one per key)."""
    last = clock()

    def progress(done: int, total: int, key: str) -> None:
        nonlocal last
        now = clock()
        if artifact_id is not None and (done == total or now - last >= PROGRESS_SECONDS):
            last = now
            update_progress_artifact(artifact_id=artifact_id, progress=100.0 * done / total)

    return progress


_CONTEXTS: dict[tuple[str, str, str], RunContext] = {}


def _shared_run(release_id: str, store_uri: str) -> RunContext:
    """One context per release and frozen config in this process: the post-processing tasks a process runs
    share the public inputs and product objects (TopDown's spine is built once per worker, not once per task)."""
    ctx = open_run(release_id, store_uri)
    return _CONTEXTS.setdefault((release_id, store_uri, ctx.config_sha256), ctx)


@task(name="postprocess", **TASK_OPTS)
def postprocess_task(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    """Combine the stored parts (or post-process in one piece) and write the estimates."""
    return _summary(stages.postprocess_stage(_shared_run(release_id, store_uri), product))


@task(name="postprocess-waves", **TASK_OPTS)
def postprocess_waves_task(release_id: str, store_uri: str, product: str, slots: int) -> list[list[Any]]:
    """The product's post-processing parts grouped into tasks for ``slots`` workers: waves of batches (empty:
    one piece)."""
    waves = stages.postprocess_waves(_shared_run(release_id, store_uri), product, slots)
    return [[[list(pair) for pair in batch] for batch in wave] for wave in waves]


@task(name="postprocess-batch", task_run_name="postprocess-{product}-from-{batch[0][0]}-{batch[0][1]}", **TASK_OPTS)
def postprocess_batch_task(release_id: str, store_uri: str, product: str, batch: list[list[str]]) -> dict[str, Any]:
    """One batch of a product's post-processing parts, run in order on one worker: it reads its inputs from the
    store and writes its parts there, and returns only a small summary (never tables through the scheduler)."""
    record = stages.postprocess_batch(_shared_run(release_id, store_uri), product, batch)
    return record | {"process": os.getpid()}


@task(name="release-files", **TASK_OPTS)
def product_release_task(release_id: str, store_uri: str, product: str) -> dict[str, Any]:
    """The product's release tables (output-validated) and derived files, as soon as its post-processing is
    done; the release stage then only checks them against their record."""
    return _summary(product_release_files(open_run(release_id, store_uri), product))


@task(name="release", **TASK_OPTS)
def release_task(release_id: str, store_uri: str) -> dict[str, Any]:
    """Release files, certificate and manifest; the ledger archived create-only to ``DASFLOW_LEDGER_ARCHIVE`` when
    set; the reports (certificate, accuracy and validation summaries, ledger with totals, per-stage timings) as
    artifacts readable in the Prefect UI."""
    ctx = open_run(release_id, store_uri)
    manifest = release_stage(ctx)
    archive = os.environ.get("DASFLOW_LEDGER_ARCHIVE")  # e.g. s3://<LedgerBucket> (infra/aws/dasflow.yaml)
    if archive:
        archived = archive_ledger(ctx, archive)
        print(f"release {release_id}: ledger archived create-only to {archived['archive']} "
              f"({archived['objects']} objects, {archived['written_now']} new)")
    run = TaskRunContext.get()
    release_reports(ctx, run.task_run.flow_run_id if run and run.task_run else None)
    return {"files": len(manifest["files"]), "manifest": f"{ctx.root}/release/MANIFEST.json"}
