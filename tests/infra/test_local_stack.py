"""Issue 13, item 4: the local production-like stack end to end.

``infra/local/stack start`` (SeaweedFS, PostgreSQL, Prefect server on PostgreSQL, process worker, all on
127.0.0.1 with free ports), ``stack deploy`` (``deployments/prefect.yaml``), then runs triggered through the
Prefect REST API exactly as the UI's "Run" button does (``POST /deployments/{id}/create_flow_run``):

1. an uninterrupted release into ``s3://das-runs/a``: outputs, certificate, ledger and manifest are in SeaweedFS;
2. the same release into ``s3://das-runs/b``, with the worker and its flow-run process SIGKILLed in the middle of
   measurement; the worker is restarted by ``stack start`` and the run finished by the ``resume-release``
   deployment: exactly one committed ledger entry per planned key (no double spend) and release files
   byte-identical to run 1 (seeded test mode; the store is not part of the config hash).

Every run pauses after planning until it is approved (the REST call the UI's Resume form makes), with nothing
drawn before. The stack is locked down (issue 22): the refusals of the Prefect API (no auth, no CSRF token), of
SeaweedFS's filer (no JWT) and of the S3 roles, the UI's API address, and the worker's user are checked.

PostgreSQL missing is a failure with the install command, never a skip.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from dasflow.io.store import S3Store
from tests.dag.helpers import release_dict, seed_inputs
from tests.infra.stack_module import STACK_PY, stack_module
from tests.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.xdist_group("local-stack")]
REPO = Path(__file__).resolve().parents[2]
BUCKET = "das-runs"
PLANNED = ["counts/state", "counts/state_sex"]


def _run_stack(env: dict[str, str], command: str, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(STACK_PY), command], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    module = stack_module()
    try:
        module._pg_bin("initdb")
        module._pg_bin("pg_ctl")
    except module.StackError as exc:
        pytest.fail(f"the local stack needs PostgreSQL: {exc}")
    state = Path(tempfile.mkdtemp(prefix="dasflow-stack-"))
    gate = state / "gate"
    gate.mkdir()
    gate.chmod(0o1777)  # the worker runs as an unprivileged user
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AWS_", "PREFECT_", "DASFLOW_"))}
    env.update({"DASFLOW_STACK_DIR": str(state), "PREFECT_UI_ENABLED": "true",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_WORKER_QUERY_SECONDS": "1",
                "DASFLOW_TEST_MODE": "1", "DASFLOW_PRODUCTS": "counts=tests.infra.gated_counts",
                "DASFLOW_TEST_GATE": str(gate),
                "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")})
    for name in module.DEFAULT_PORTS:
        env[f"DASFLOW_STACK_{name.upper()}_PORT"] = str(free_port())
    try:
        started = _run_stack(env, "start")
        assert started.returncode == 0, started.stdout + started.stderr
        assert "postgres        ok" in started.stdout and "worker          ok" in started.stdout, started.stdout
        deployed = _run_stack(env, "deploy")
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        handle = module.load(state)
        yield {"env": env, "state": state, "gate": gate, "handle": handle, "module": module}
    finally:
        stopped = _run_stack(env, "stop", timeout=120)
        status = _run_stack(env, "status", timeout=60)
        shutil.rmtree(state, ignore_errors=True)
    assert stopped.returncode == 0, stopped.stderr
    assert status.returncode == 1 and status.stdout.count("DOWN") == 4, status.stdout


def _api(stack: dict[str, Any], method: str, path: str, body: Any = None) -> Any:
    result = stack["module"]._api(stack["handle"], method, path, body, timeout=30)
    return result


def _paused_then_approved(stack: dict[str, Any], run_id: str, prefix: str, timeout: float = 240) -> None:
    """Wait for the gate (the deployment run's ``release-r1`` subflow PAUSED, plan frozen, nothing drawn), then
    approve as the UI's Resume form does."""
    deadline = time.time() + timeout
    while True:
        children = _api(stack, "POST", "/flow_runs/filter",
                        {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}})
        paused = [c for c in children if c["state"]["type"] == "PAUSED"]
        if paused:
            break
        assert time.time() < deadline, "the release never paused for approval"
        assert _api(stack, "GET", f"/flow_runs/{run_id}")["state"]["type"] not in ("FAILED", "CRASHED")
        time.sleep(1)
    objects = _objects(stack, f"{prefix}/runs/r1/")
    assert "ledger/plan.json" in objects and not any(k.startswith(("measurements/", "ledger/entries/"))
                                                     for k in objects)
    resumed = _api(stack, "POST", f"/flow_runs/{paused[0]['id']}/resume",
                   {"run_input": {"approve": True, "approver": "stack test operator"}})
    assert resumed["status"] == "ACCEPT", resumed


def _trigger(stack: dict[str, Any], flow: str, deployment: str, parameters: dict[str, Any]) -> str:
    """What the UI's "Run" button does: POST /deployments/{id}/create_flow_run with the form's parameters."""
    dep = _api(stack, "GET", f"/deployments/name/{flow}/{deployment}")
    run = _api(stack, "POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": parameters})
    return str(run["id"])


def _wait_final(stack: dict[str, Any], run_id: str, timeout: float = 300) -> str:
    deadline = time.time() + timeout
    while time.time() < deadline:
        state = _api(stack, "GET", f"/flow_runs/{run_id}")["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return str(state)
        time.sleep(1)
    raise AssertionError(f"flow run {run_id} did not finish in {timeout} s")


def _s3(stack: dict[str, Any], role: str = "admin") -> Any:
    return stack["module"]._s3_client(stack["handle"], role)


def _prepare(stack: dict[str, Any], prefix: str) -> tuple[str, str]:
    client = _s3(stack)
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    uri = f"s3://{BUCKET}/{prefix}"
    seed_inputs(S3Store(uri, client=client))
    path = stack["state"] / f"release-{prefix}.json"
    path.write_text(json.dumps(release_dict(uri)))
    return uri, str(path)


def _objects(stack: dict[str, Any], prefix: str) -> dict[str, bytes]:
    client = _s3(stack)
    keys = [o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
            for o in page.get("Contents", [])]
    return {k[len(prefix):]: client.get_object(Bucket=BUCKET, Key=k)["Body"].read() for k in keys}


def _committed(objects: dict[str, bytes]) -> list[str]:
    return sorted(k.removeprefix("ledger/entries/").removesuffix(".committed.json")
                  for k in objects if k.startswith("ledger/entries/") and k.endswith(".committed.json"))


@pytest.fixture(scope="module")
def uninterrupted(stack: dict[str, Any]) -> dict[str, bytes]:
    """Release ``a``: a deployment run approved in the UI and never interrupted — the baseline the crash tests
    compare with, whichever test asks for it first (xdist may order the module's tests differently)."""
    (stack["gate"] / "open").write_text("")
    _, config = _prepare(stack, "a")
    run_id = _trigger(stack, "dasflow-release-from-file", "release-from-file", {"request": {"config_path": config}})
    _paused_then_approved(stack, run_id, "a")
    assert _wait_final(stack, run_id) == "COMPLETED"
    return _objects(stack, "a/runs/r1/")


def test_ui_triggered_release_writes_outputs_certificate_and_ledger_to_seaweedfs(
        uninterrupted: dict[str, bytes]) -> None:
    """Item 4 (a): a deployment run on the PostgreSQL-backed server, picked up by the process worker."""
    objects = uninterrupted
    assert json.loads(objects["approval.json"])["approver"] == "stack test operator"
    release = {k.removeprefix("release/") for k in objects if k.startswith("release/")}
    assert {"counts/state.csv", "counts/state_sex.csv", "CERTIFICATE.md", "ledger.csv", "MANIFEST.json"} <= release
    assert objects["release/CERTIFICATE.md"].startswith(b"**TEST RELEASE")
    manifest = json.loads(objects["release/MANIFEST.json"])
    assert "counts/state.csv" in json.dumps(manifest)
    assert _committed(objects) == PLANNED
    assert sorted(k for k in objects if k.startswith("measurements/")) == [
        "measurements/counts/state.parquet", "measurements/counts/state_sex.parquet"]
    rows = objects["release/ledger.csv"].decode().splitlines()
    assert len(rows) == 1 + len(PLANNED)


def test_worker_sigkilled_mid_run_then_restarted_and_resumed_spends_once(stack: dict[str, Any],
                                                                        uninterrupted: dict[str, bytes]) -> None:
    """Item 4 (b): SIGKILL of the worker and its flow-run process while measuring ``state_sex`` (``state``
    already committed); restart; resume through the ``resume-release`` deployment; no double spend."""
    gate: Path = stack["gate"]
    (gate / "open").unlink(missing_ok=True)
    (gate / "waiting").unlink(missing_ok=True)
    uri, config = _prepare(stack, "b")
    run_id = _trigger(stack, "dasflow-release-from-file", "release-from-file", {"request": {"config_path": config}})
    _paused_then_approved(stack, run_id, "b")
    deadline = time.time() + 240
    while not (gate / "waiting").exists():
        assert time.time() < deadline, "the run never reached the measurement gate"
        assert _api(stack, "GET", f"/flow_runs/{run_id}")["state"]["type"] not in ("FAILED", "CRASHED")
        time.sleep(0.5)
    flow_pid = int((gate / "waiting").read_text())
    worker_pid = int((stack["state"] / "worker.pid").read_text())
    worker = psutil.Process(worker_pid)
    victims = [*worker.children(recursive=True), worker]
    assert flow_pid in {p.pid for p in victims}, "the flow run is not a child of the worker"
    for proc in victims:
        proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(victims, timeout=30)

    crashed = _objects(stack, "b/runs/r1/")
    assert "release/MANIFEST.json" not in crashed
    assert _committed(crashed) == ["counts/state"]
    down = _run_stack(stack["env"], "status", timeout=60)
    assert down.returncode == 1 and "worker          DOWN" in down.stdout, down.stdout

    (gate / "open").write_text("")
    restarted = _run_stack(stack["env"], "start")
    assert restarted.returncode == 0, restarted.stdout + restarted.stderr
    resume_id = _trigger(stack, "dasflow-resume-gated", "resume-release", {"release_id": "r1", "store": uri})
    assert _wait_final(stack, resume_id) == "COMPLETED"

    resumed = _objects(stack, "b/runs/r1/")
    assert _committed(resumed) == PLANNED  # exactly one committed entry per planned key
    entries = sorted(k for k in resumed if k.startswith("ledger/entries/"))
    assert entries == [f"ledger/entries/{key}.{state}.json" for key in PLANNED
                       for state in ("committed", "reserved")]
    baseline = {k: v for k, v in uninterrupted.items() if k.startswith("release/")}
    released = {k: v for k, v in resumed.items() if k.startswith("release/")}
    assert set(released) == set(baseline)
    differing = sorted(k for k in baseline if released[k] != baseline[k])
    assert not differing, f"release files differ from the uninterrupted run: {differing}"


def test_every_door_is_locked(stack: dict[str, Any]) -> None:
    """The refusals: the Prefect API without credentials (401) or without a CSRF token (403); SeaweedFS's filer
    without a JWT (read, upload, delete: 401); the publisher role on confidential objects and the pipeline role on
    the publication bucket (AccessDenied). The UI is told the API's real address; the worker is not root."""
    import urllib.error
    import urllib.request

    from botocore.exceptions import ClientError

    module, handle = stack["module"], stack["handle"]
    with pytest.raises(urllib.error.HTTPError) as no_auth:
        module._request(handle, "GET", "/flow_runs/count", None, 30, auth=False, csrf=False)
    assert no_auth.value.code == 401
    with pytest.raises(urllib.error.HTTPError) as no_csrf:
        module._request(handle, "POST", "/flow_runs/count", {}, 30, csrf=False)
    assert no_csrf.value.code == 403
    assert isinstance(module._api(handle, "POST", "/flow_runs/count", {}), int)
    with urllib.request.urlopen(f"{handle.ui_url}/ui-settings", timeout=30) as resp:
        assert json.loads(resp.read())["api_url"] == handle.api_url
    admin = _s3(stack)
    admin.put_object(Bucket=BUCKET, Key="locks/confidential/persons.csv", Body=b"ID|AGE\n1|40\n")
    filer = f"http://127.0.0.1:{handle.ports['weed_filer']}/buckets/{BUCKET}/locks/confidential/persons.csv"
    for method, body in (("GET", None), ("PUT", b"x"), ("DELETE", None)):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(filer, data=body, method=method), timeout=30)
        assert refused.value.code == 401, method
    assert admin.get_object(Bucket=BUCKET, Key="locks/confidential/persons.csv")["Body"].read().startswith(b"ID")
    with pytest.raises(ClientError, match="AccessDenied"):
        _s3(stack, "publisher").get_object(Bucket=BUCKET, Key="locks/confidential/persons.csv")
    with pytest.raises(ClientError, match="AccessDenied"):
        _s3(stack, "pipeline").put_object(Bucket="das-release", Key="x", Body=b"x")
    assert _s3(stack, "pipeline").get_object(Bucket=BUCKET, Key="locks/confidential/persons.csv")["Body"].read()
    worker = psutil.Process(int((stack["state"] / "worker.pid").read_text()))
    users = {p.uids().real for p in worker.children(recursive=True) if "prefect" in " ".join(p.cmdline())}
    fallback = stack["state"] / "worker.root"
    if os.geteuid() == 0 and shutil.which("setfacl"):  # CI installs acl: the fallback is never needed there
        assert not fallback.exists(), fallback.read_text()
    if os.geteuid() == 0 and not fallback.exists():
        assert users and 0 not in users, "the worker runs as root"
    elif fallback.exists():  # this host's Python is not readable by an unprivileged user: said, not hidden
        status = _run_stack(stack["env"], "status", timeout=60)
        assert "WARNING: the worker runs as root" in status.stdout


def test_a_killed_flow_run_is_marked_crashed_and_resumes_by_itself(stack: dict[str, Any],
                                                                   uninterrupted: dict[str, bytes]) -> None:
    """Self-healing: the flow-run process dies in the middle of measurement (SIGKILL, worker alive); the run is
    marked Crashed, the automation schedules it again, the release resumes without an operator (approved once,
    not asked again), the dead attempt's release subflow is marked Crashed (not left Running), and the ledger
    holds exactly one committed entry per key with release files byte-identical to run 1."""
    gate: Path = stack["gate"]
    (gate / "open").unlink(missing_ok=True)
    (gate / "waiting").unlink(missing_ok=True)
    _, config = _prepare(stack, "c")
    run_id = _trigger(stack, "dasflow-release-from-file", "release-from-file", {"request": {"config_path": config}})
    _paused_then_approved(stack, run_id, "c")
    deadline = time.time() + 240
    while not (gate / "waiting").exists():
        assert time.time() < deadline, "the run never reached the measurement gate"
        time.sleep(0.5)
    os.kill(int((gate / "waiting").read_text()), signal.SIGKILL)
    (gate / "open").write_text("")
    seen: set[str] = set()
    deadline = time.time() + 400
    while True:
        state = _api(stack, "GET", f"/flow_runs/{run_id}")["state"]["type"]
        seen.add(state)
        if state == "COMPLETED":
            break
        assert time.time() < deadline, f"the crashed run did not heal by itself (states seen: {sorted(seen)})"
        time.sleep(1)
    history = {s["type"] for s in _api(stack, "GET", f"/flow_run_states/?flow_run_id={run_id}")}
    assert "CRASHED" in history, history
    children = _api(stack, "POST", "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run_id]}}})
    states = sorted((c["state"]["type"], c["name"], c["created"]) for c in children)
    history_list = [(s["type"], s["name"], s["timestamp"]) for s in
                    _api(stack, "GET", f"/flow_run_states/?flow_run_id={run_id}")]
    assert [t for t, _, _ in states].count("COMPLETED") == 1 and "RUNNING" not in {t for t, _, _ in states} \
        and "PAUSED" not in {t for t, _, _ in states}, (states, history_list)
    grandchildren = _api(stack, "POST", "/flow_runs/filter", {"flow_runs": {
        "parent_flow_run_id": {"any_": [c["id"] for c in children]}}})
    stale = [(r["name"], r["state"]["type"]) for r in grandchildren if r["state"]["type"] in ("RUNNING", "PAUSED")]
    assert stale == [], stale  # the dead attempt's product subflow is marked, not left Running
    objects = _objects(stack, "c/runs/r1/")
    assert _committed(objects) == PLANNED
    baseline = {k.removeprefix("release/"): v for k, v in uninterrupted.items() if k.startswith("release/")}
    tables = sorted(k for k in baseline if k.endswith(".csv"))  # the certificate names the code version
    assert tables and {k: objects[f"release/{k}"] for k in tables} == {k: baseline[k] for k in tables}
