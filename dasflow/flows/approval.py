"""The approval gate and the per-release concurrency slot (Prefect half; the library half is
``dasflow.pipeline.approval``).

A gated release pauses after its plan is frozen and reserved, shows the plan in the UI (a markdown artifact, and
the description of the Resume form) and waits for an operator's :class:`Approval` — Prefect's
``pause_flow_run(wait_for_input=...)``. Schedules and automations start gated runs only, and nothing in dasflow
ever resumes a paused run, so they can prepare a release but never approve it. The decision is recorded in the
store with the approver's name and the flow run id before anything is drawn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from prefect.artifacts import create_markdown_artifact
from prefect.concurrency.sync import concurrency
from prefect.context import FlowRunContext
from prefect.flow_runs import pause_flow_run
from prefect.input import RunInput
from pydantic import Field

from dasflow.pipeline.approval import plan_markdown, plan_summary, read_approval, record_decision, require_approved
from dasflow.pipeline.run import open_run
from dasflow.tasks.reports import artifact_key as _artifact_key

#: how long a gated release waits for its operator before the run fails (resuming it asks again)
APPROVAL_TIMEOUT_SECONDS = 7 * 24 * 3600
#: how often a paused release checks whether it was resumed
APPROVAL_POLL_SECONDS = 10


class Approval(RunInput):
    """The operator's decision on a release's frozen plan (the UI's Resume form)."""

    approve: bool = Field(default=False, description="tick to draw the noise of exactly the plan shown above")
    approver: str = Field(min_length=1, max_length=200, description="your name (kept in the audit record)")
    comment: str = Field(default="", max_length=2000, description="optional note for the audit record")


def approval_gate(release_id: str, store_uri: str) -> dict[str, Any]:
    """Inside a release flow, after ``plan-and-freeze``: return the approval record, pausing for the operator
    when the plan has none yet. Raises ``NotApproved`` (nothing drawn) on a rejection."""
    ctx = open_run(release_id, store_uri)
    record = read_approval(ctx)
    if record is None:
        text = plan_markdown(plan_summary(ctx))
        create_markdown_artifact(key=_artifact_key("plan", release_id), markdown=text,
                                 description=f"budget plan of {release_id}, waiting for approval")
        print(f"release {release_id}: plan frozen; waiting for an operator to approve it in the Prefect UI "
              "(flow run -> Resume)")
        decision = pause_flow_run(wait_for_input=Approval.with_initial_data(description=text),
                                  timeout=APPROVAL_TIMEOUT_SECONDS, poll_interval=APPROVAL_POLL_SECONDS,
                                  key=f"approve-{release_id}")
        run = FlowRunContext.get()
        record = record_decision(ctx, approved=decision.approve, approver=decision.approver,
                                 comment=decision.comment,
                                 flow_run_id=str(run.flow_run.id) if run and run.flow_run else None)
    require_approved(record, release_id)
    print(f"release {release_id}: plan approved by {record['approver']} ({record['decided_at']})")
    return record


def slot_name(release_id: str) -> str:
    return f"dasflow-release-{release_id}"


@contextlib.contextmanager
def release_slot(release_id: str, *, wait_seconds: float = 900) -> Iterator[None]:
    """Hold the release's single concurrency slot (a Prefect global concurrency limit of 1, created on first
    use) for the duration of a run: a second run of the same release waits, then fails. The slot is a lease the
    holder renews; a crashed holder's lease expires after a minute, so a resume of a crashed run gets it."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(slot_name(release_id), limit=1)
    with concurrency(slot_name(release_id), occupy=1, timeout_seconds=wait_seconds, lease_duration=60,
                     strict=True):
        yield


def end_stale_release_runs(release_id: str) -> list[str]:
    """Mark Crashed the ``release-<id>`` flow runs left Running or Paused by a dead attempt — those whose parent
    deployment run is this very run (an earlier attempt, rescheduled after a crash) or has ended — and their live
    product subflows. Subflows send no heartbeats of their own, so without this they would stay "Running" for
    ever. A run started outside a deployment (no parent) is left alone. Returns the ids marked."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    run = FlowRunContext.get()
    me = run.flow_run.id if run and run.flow_run else None
    marked: list[str] = []
    live = FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PAUSED,
                                                                StateType.PENDING]))
    message = "its deployment run died or was restarted; the release resumes in a new run"
    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[f"release-{release_id}"]), state=live))
        for stale in runs:
            if stale.parent_task_run_id is None or stale.id == me:
                continue
            parent = client.read_task_run(stale.parent_task_run_id).flow_run_id
            parent_state = client.read_flow_run(parent).state if parent else None
            if parent == me or (parent_state is not None and parent_state.is_final()):
                products = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[stale.id]), state=live))
                for run_ in (stale, *products):
                    client.set_flow_run_state(run_.id, Crashed(message=message), force=True)
                    marked.append(str(run_.id))
    if marked:
        print(f"release {release_id}: marked {len(marked)} orphaned run(s) of a dead attempt as Crashed")
    return marked


def exit_with_worker(poll_seconds: float = 2.0) -> None:
    """In a deployment's flow-run process: exit at once (code 70) when the worker that started it dies, instead of
    running on as an orphan whose log pipe is gone (it would crash later, at random, with ``BrokenPipeError``).
    Exiting at any point is safe (the measure-once protocol); the run is then marked Crashed and resumed by the
    self-healing automations. A daemon thread compares the parent process id with the one at start."""
    import os
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:
                os._exit(70)

    threading.Thread(target=watch, name="dasflow-exit-with-worker", daemon=True).start()
