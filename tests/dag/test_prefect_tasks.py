"""Prefect wiring: retries heal transient store faults and never retry bad input or ledger refusals."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prefect import flow, task
from prefect.testing.utilities import prefect_test_harness

from dasflow.errors import InputError, LedgerRefusal
from dasflow.io.store import StoreError, StoreFault, StoreUnavailable
from dasflow.tasks import stages as task_stages
from dasflow.tasks.stages import TASK_OPTS, is_transient, progress_reporter

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("prefect-harness")]


def test_transient_classification() -> None:
    assert is_transient(StoreError("503 from S3"))
    assert is_transient(ConnectionError("reset"))
    assert is_transient(StoreUnavailable("endpoint unreachable after 5 attempts"))
    assert not is_transient(StoreFault("no S3 credentials"))
    assert not is_transient(InputError("bad row", file="f", row=2, column="X"))
    assert not is_transient(LedgerRefusal("over cap"))
    assert not is_transient(ValueError("bug"))


def test_measure_progress_is_throttled_in_time_and_always_ends_at_100(monkeypatch: pytest.MonkeyPatch) -> None:
    """One artifact update per ``PROGRESS_SECONDS`` of measuring (each is an API call), and the last key's."""
    sent: list[float] = []
    monkeypatch.setattr(task_stages, "update_progress_artifact",
                        lambda artifact_id, progress: sent.append(round(progress, 1)))
    now = [0.0]
    report = progress_reporter(object(), clock=lambda: now[0])  # type: ignore[arg-type]
    for done in range(1, 201):  # 200 keys, 0.05 s each: 10 s
        now[0] = done * 0.05
        report(done, 200, f"k{done}")
    assert sent == [20.0, 40.0, 60.0, 80.0, 100.0]
    sent.clear()
    progress_reporter(None)(3, 3, "k")  # no artifact (no run context): nothing sent
    assert sent == []


@pytest.fixture(scope="module")
def harness() -> Iterator[None]:
    with prefect_test_harness(server_startup_timeout=120):
        yield


def test_store_fault_is_retried_and_input_error_is_not(harness: None) -> None:
    calls = {"store": 0, "input": 0}

    @task(**{**TASK_OPTS, "retry_delay_seconds": 0})
    def flaky_store() -> str:
        calls["store"] += 1
        if calls["store"] < 3:
            raise StoreError("transient 503")
        return "ok"

    @task(**{**TASK_OPTS, "retry_delay_seconds": 0})
    def bad_input() -> str:
        calls["input"] += 1
        raise InputError("bad value", file="persons.csv", row=7, column="QAGE")

    @flow
    def both() -> str:
        out = flaky_store()
        try:
            bad_input()
        except InputError:
            return out + "+refused"
        return out

    assert both() == "ok+refused"
    assert calls == {"store": 3, "input": 1}
