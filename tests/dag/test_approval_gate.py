"""The approval gate on a real Prefect server: a gated release pauses after planning with its plan shown, draws
nothing until an operator resumes it with an approval through the Prefect client, and records who approved; a
rejection stops it with nothing drawn; a resume of an approved release does not ask again."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
from prefect.flow_runs import resume_flow_run
from prefect.testing.utilities import prefect_test_harness

import dasflow.flows.approval
from dasflow.flows.release import run_release
from dasflow.io.store import LocalStore
from dasflow.pipeline.approval import NotApproved
from tests.dag import counts_product  # noqa: F401  (registers the product)
from tests.dag.helpers import local_release

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect-harness")]


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


def _start(cfg: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def body() -> None:
        try:
            out["result"] = run_release(cfg, require_approval=True)
        except BaseException as exc:  # the test inspects it
            out["error"] = exc

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread, out


def _paused_run(name: str, timeout: float = 120) -> Any:
    deadline = time.time() + timeout
    with get_client(sync_client=True) as client:
        while time.time() < deadline:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
            if runs and runs[0].state is not None and runs[0].state.is_paused():
                return runs[0]
            time.sleep(0.5)
    raise AssertionError(f"flow run {name} did not pause")


def _drawn(store: LocalStore, release_id: str) -> list[str]:
    return store.list(f"runs/{release_id}/measurements/") + [
        k for k in store.list(f"runs/{release_id}/ledger/") if k.endswith((".reserved.json", ".committed.json"))]


def test_release_pauses_for_approval_and_draws_nothing_before(harness: None, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dasflow.flows.approval, "APPROVAL_POLL_SECONDS", 1)
    store, cfg = local_release(tmp_path, release_id="gated")
    thread, out = _start(cfg)
    run = _paused_run("release-gated")
    assert store.exists("runs/gated/ledger/plan.json") and _drawn(store, "gated") == []
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts()
        plan = next(a for a in artifacts if a.key == "plan-gated")
        assert "| counts | 2 | 3/4" in str(plan.data) and "RNG mode: **test**" in str(plan.data)
    time.sleep(2)
    assert _drawn(store, "gated") == [] and "result" not in out  # still waiting, still nothing drawn
    resume_flow_run(run.id, run_input={"approve": True, "approver": "Ada Operator", "comment": "plan checked"})
    thread.join(300)
    assert "error" not in out, out.get("error")
    record = json.loads(store.get("runs/gated/approval.json"))
    assert record["approved"] is True and record["approver"] == "Ada Operator"
    assert record["flow_run_id"] == str(run.id)
    assert record["plan_sha256"] == store.sha256("runs/gated/ledger/plan.json")
    assert len(store.list("runs/gated/measurements/")) == 2
    _check_reports(store)
    # a resume of the approved release goes on without pausing (and re-measures nothing)
    again = run_release(cfg, require_approval=True)
    assert again["products"]["counts"]["measure"]["drawn_now"] == 0


def test_a_rejected_plan_stops_with_nothing_drawn(harness: None, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dasflow.flows.approval, "APPROVAL_POLL_SECONDS", 1)
    store, cfg = local_release(tmp_path, release_id="rejected")
    thread, out = _start(cfg)
    run = _paused_run("release-rejected")
    resume_flow_run(run.id, run_input={"approve": False, "approver": "Bo Reviewer"})
    thread.join(300)
    assert isinstance(out.get("error"), NotApproved) and "Bo Reviewer" in str(out["error"])
    assert _drawn(store, "rejected") == []
    with pytest.raises(NotApproved):  # the first decision on a plan stands
        run_release(cfg, require_approval=True)


def test_plan_summary_shows_the_accounts_remaining_budget(tmp_path: Path) -> None:
    """Production mode: the approval page shows per product the own and converted budget, the total, the cap,
    what the account reserved for this release and what remains (100 - 3/4)."""
    from dasflow.pipeline import stages
    from dasflow.pipeline.approval import plan_markdown, plan_summary
    from dasflow.pipeline.run import freeze_config

    store, cfg = local_release(tmp_path, release_id="prod1", seed=None)
    ctx = freeze_config(cfg, store)
    for p in cfg.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    summary = plan_summary(ctx)
    assert summary["rng_mode"] == "production" and summary["total_rho"] == "3/4" and summary["cap_rho"] == "1"
    assert summary["products"]["counts"]["rho"] == "3/4" and summary["products"]["counts"]["keys"] == 2
    assert summary["account"]["reserved_for_release"] == summary["products"]["counts"]["converted_rho"]
    assert summary["account"]["remaining"] == str(100 - Fraction(summary["account"]["reserved_for_release"]))
    text = plan_markdown(summary)
    assert "account `counts-account`" in text and f"**{summary['account']['remaining']}" in text
    assert _drawn(store, "prod1") == []


def test_one_concurrency_slot_per_release(harness: None) -> None:
    """A second run of a release cannot take the release's slot while the first holds it; another release can."""
    from dasflow.flows.approval import release_slot

    with release_slot("slot-a"):
        with release_slot("slot-b", wait_seconds=5):
            pass
        t0 = time.time()
        with pytest.raises(TimeoutError), release_slot("slot-a", wait_seconds=2):
            pass
        assert time.time() - t0 >= 2
    with release_slot("slot-a", wait_seconds=5):  # released when the holder ends
        pass


def _check_reports(store: LocalStore) -> None:
    """The release's reports are artifacts readable in place: no link a browser cannot follow."""
    with get_client(sync_client=True) as client:
        arts = {a.key: a for a in client.read_artifacts() if a.key and a.key.endswith("gated")}
    assert {"plan-gated", "ledger-gated", "certificate-gated", "accuracy-gated", "validation-gated",
            "timings-gated", "stage-metrics-gated"} <= set(arts)
    assert all(a.type in ("markdown", "table") for a in arts.values())
    assert not any("s3://" in str(a.data) or "file://" in str(a.data) for a in arts.values())
    assert arts["certificate-gated"].data == store.get_text("runs/gated/release/CERTIFICATE.md")
    ledger = json.loads(str(arts["ledger-gated"].data))
    assert ledger[-1]["product"] == "TOTAL" and "planned rho = 3/4" in ledger[-1]["budget"]
    assert "2/2 committed, spent rho = 3/4" in ledger[-1]["state"] and len(ledger) == 3
    accuracy = json.loads(str(arts["accuracy-gated"].data))
    assert [(r["product"], r["level"], r["keys"]) for r in accuracy] == [("counts", "state", 1),
                                                                        ("counts", "state_sex", 1)]
    assert json.loads(str(arts["validation-gated"].data))[0]["passed"] is True
    timings = json.loads(str(arts["timings-gated"].data))
    tasks = {r["task"].rsplit("-", 1)[0] for r in timings}
    assert {"validate", "plan-and-freeze", "preprocess", "measure", "postprocess", "release-files"} <= tasks
    assert all(r["seconds"] >= 0 for r in timings)
    metrics = json.loads(str(arts["stage-metrics-gated"].data))
    assert [(r["stage"], r["product"]) for r in metrics] == [("validate", "counts"), ("preprocess", "counts"),
                                                             ("measure", "counts"), ("postprocess", "counts"),
                                                             ("tables", "counts"), ("release", "all")]
    assert all(r["wall s"] >= 0 and r["CPU s"] >= 0 and r["peak RSS MB"] > 0 for r in metrics)


def test_a_flow_run_process_exits_when_its_worker_dies(tmp_path: Path) -> None:
    """No orphans: a process running ``exit_with_worker`` ends within seconds of its parent's SIGKILL."""
    import os
    import signal
    import subprocess
    import sys

    import psutil

    ready = tmp_path / "watching"
    child = ("from dasflow.flows.approval import exit_with_worker; import time; exit_with_worker(0.2); "
             f"open({str(ready)!r}, 'w').close(); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"c = subprocess.Popen([sys.executable, '-c', {child!r}]); print(c.pid, flush=True); "
                               "time.sleep(60)"], stdout=subprocess.PIPE, text=True, cwd=str(REPO))
    assert parent.stdout is not None
    pid = int(parent.stdout.readline())
    up = time.time() + 120  # importing prefect takes seconds on a loaded machine
    while not ready.exists():  # the child is up and watching its parent
        assert time.time() < up and psutil.pid_exists(pid), "the child never started watching"
        time.sleep(0.1)
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.time() + 15
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.time() < deadline, "the orphaned child kept running"
        time.sleep(0.2)
