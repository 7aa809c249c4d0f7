"""Crash-safe resume, end to end: ``dasflow run`` as a subprocess against a real Prefect server, SIGKILLed at
every stage boundary and in the middle of measurement, each attempt resuming the last crash.

After the last resume: exactly one committed ledger entry (and one NMF) per planned key, total spent = plan
total, and the release files byte-identical to an uninterrupted run (seeded test mode). Two processes running the same
release at once never produce two entries for a key. Over-cap and bad-input runs exit 3 and 2 with nothing spent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from dasflow.flows import prefect_server
from dasflow.io.store import LocalStore
from dasflow.pipeline.inputs import mark_synthetic
from tests.dag.helpers import release_dict, release_files, seed_inputs
from tests.servers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.xdist_group("prefect-server")]
REPO = Path(__file__).resolve().parents[2]
DASFLOW = str(Path(sys.executable).with_name("dasflow"))

#: in the order a run reaches them
FAULT_POINTS = [
    "stage:validate:counts:before-manifest",
    "stage:plan:before-freeze",
    "stage:preprocess:counts:before-manifest",
    "measure:after-reserve:counts/state",
    "measure:after-nmf:counts/state",
    "measure:after-commit:counts/state",
    "measure:after-reserve:counts/state_sex",
    "stage:measure:counts:done",
    "stage:postprocess:counts:before-manifest",
    "stage:release:before-manifest",
]


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[dict[str, str]]:
    """``prefect server start`` on 127.0.0.1 with its own PREFECT_HOME (SQLite, seeded from the tests' database
    template when there is one: ``dasflow.flows.prefect_server``); yields the client env."""
    home = tempfile.mkdtemp(prefix="dasflow-prefect-server-")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false", "PREFECT_API_URL": ""}
    env.pop("PREFECT_API_URL")
    # Prefect's empty schema from the suite's template when one was built already (else Prefect migrates)
    prefect_server.seed(Path(home) / "prefect.db", prefect_server.template_path())
    log = open(Path(home) / "server.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            raise RuntimeError((Path(home) / "server.log").read_text()[-3000:])
        time.sleep(0.5)
    client_env = {**os.environ, "PREFECT_HOME": home, "PREFECT_API_URL": url,
                  "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DASFLOW_TEST_MODE": "1",
                  "DASFLOW_PRODUCTS": "counts=tests.plugin_product.plugin",
                  "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    client_env.pop("DASFLOW_FAULT_AT", None)
    try:
        yield client_env
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


def make_release(root: Path, **kw: object) -> Path:
    store = LocalStore(root / "store")
    seed_inputs(store)
    path = root / "release.json"
    path.write_text(json.dumps(release_dict(str(root / "store"), **kw)))  # type: ignore[arg-type]
    return path


def dasflow(env: dict[str, str], *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    run_env = dict(env)
    if fault:
        run_env["DASFLOW_FAULT_AT"] = fault
    return subprocess.run([DASFLOW, *args], env=run_env, capture_output=True, text=True, timeout=300, cwd=REPO)


def ledger_state(store_dir: Path) -> dict[str, list[str]]:
    entries = sorted(p.relative_to(store_dir / "runs/r1/ledger/entries").as_posix()
                     for p in (store_dir / "runs/r1/ledger/entries").rglob("*.json"))
    nmfs = sorted(p.name for p in (store_dir / "runs/r1/measurements").rglob("*.parquet"))
    return {"entries": entries, "nmfs": nmfs}


@pytest.fixture(scope="session")
def baseline(prefect_api: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    root = tmp_path_factory.mktemp("baseline")
    result = dasflow(prefect_api, "run", str(make_release(root)))
    assert result.returncode == 0, result.stderr[-3000:]
    return release_files(root / "store", "r1")


EXPECTED_ENTRIES = ["counts/state.committed.json", "counts/state.reserved.json",
                    "counts/state_sex.committed.json", "counts/state_sex.reserved.json"]


def test_sigkill_at_every_stage_boundary_then_resume_gives_identical_release_and_single_spend(
        prefect_api: dict[str, str], baseline: dict[str, bytes], tmp_path: Path) -> None:
    """One release SIGKILLed at every fault point, in pipeline order: the first run dies at the first point and
    each later attempt dies at the next one, so every point is reached by an attempt that itself resumed a crash
    (a run again while nothing is frozen, ``dasflow resume`` after); the last resume finishes. After each crash
    nothing looks complete and the ledger holds only planned entries; at the end exactly one committed entry
    (and one NMF) per planned key, spent = plan total, and the release files of an uninterrupted run."""
    config = make_release(tmp_path)
    store = tmp_path / "store"
    frozen = False
    for point in [*FAULT_POINTS, None]:
        attempt = dasflow(prefect_api, "resume", "r1", "--store", str(store), fault=point) if frozen else \
            dasflow(prefect_api, "run", str(config), fault=point)
        if point is None:
            assert attempt.returncode == 0, attempt.stderr[-3000:]
            break
        assert attempt.returncode == -signal.SIGKILL, (point, attempt.returncode, attempt.stderr[-2000:])
        assert not (store / "runs/r1/release/MANIFEST.json").exists(), point
        assert set(ledger_state(store)["entries"]) <= set(EXPECTED_ENTRIES), point
        frozen = (store / "runs/r1/config.json").exists()
        assert frozen != point.startswith("stage:validate:"), point  # validation runs before freezing
    assert ledger_state(store) == {"entries": EXPECTED_ENTRIES, "nmfs": ["state.parquet", "state_sex.parquet"]}
    assert release_files(store, "r1") == baseline
    status = dasflow(prefect_api, "ledger", "r1", "--store", str(store), "--format", "json")
    record = json.loads(status.stdout)
    assert record["spent"]["rho"] == record["plan_total"]["rho"] == "3/4"
    assert [e["state"] for e in record["entries"]] == ["committed", "committed"]


def test_two_concurrent_runs_of_one_release_never_spend_twice(
        prefect_api: dict[str, str], baseline: dict[str, bytes], tmp_path: Path) -> None:
    config = make_release(tmp_path)
    procs = [subprocess.Popen([DASFLOW, "run", str(config)], env=prefect_api, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    codes = [p.returncode for p in procs]
    assert 0 in codes, outs
    assert ledger_state(tmp_path / "store") == {"entries": EXPECTED_ENTRIES,
                                                "nmfs": ["state.parquet", "state_sex.parquet"]}
    if codes != [0, 0]:  # a loser may only fail after the winner published; resume finishes it identically
        assert dasflow(prefect_api, "resume", "r1", "--store", str(tmp_path / "store")).returncode == 0
    assert release_files(tmp_path / "store", "r1") == baseline


def test_over_cap_release_exits_3_with_nothing_spent(prefect_api: dict[str, str], tmp_path: Path) -> None:
    result = dasflow(prefect_api, "run", str(make_release(tmp_path, cap="1/2")))
    assert result.returncode == 3, result.stderr[-2000:]
    assert "exceeds the release cap" in result.stderr
    assert not (tmp_path / "store/runs/r1/ledger/entries").exists()
    assert not (tmp_path / "store/runs/r1/measurements").exists()


def test_bad_input_exits_2_naming_file_row_column(prefect_api: dict[str, str], tmp_path: Path) -> None:
    config = make_release(tmp_path)
    persons = tmp_path / "store/confidential/counts/persons.csv"
    lines = persons.read_text().splitlines()
    lines[4] = "99,1"
    persons.write_text("\n".join(lines) + "\n")
    mark_synthetic(LocalStore(tmp_path / "store"), "confidential/counts/", generator_note="a corrupted fixture")
    result = dasflow(prefect_api, "run", str(config))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "file confidential/counts/persons.csv, row 5, column STATE" in result.stderr
    assert not (tmp_path / "store/runs/r1/measurements").exists()
    assert not (tmp_path / "store/runs/r1/ledger").exists()
    assert not (tmp_path / "store/runs/r1/config.json").exists()  # refused before freezing: the id is reusable
    lines[4] = "06,1"  # the operator fixes the input and runs the same config again under the same id
    persons.write_text("\n".join(lines) + "\n")
    mark_synthetic(LocalStore(tmp_path / "store"), "confidential/counts/", generator_note="the fixed fixture")
    fixed = dasflow(prefect_api, "run", str(config))
    assert fixed.returncode == 0, fixed.stderr[-2000:]


def test_demo_runs_end_to_end_and_a_second_run_resumes(prefect_api: dict[str, str], tmp_path: Path) -> None:
    """README's first command (smaller): synthetic census + PHSafe + SafeTab-P; again on the same store = resume."""
    store = tmp_path / "demo"
    first = dasflow(prefect_api, "demo", "--store", str(store), "--persons", "1000", "--seed", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "certificate:" in first.stdout and "CERTIFICATE.md" in first.stdout
    rid = "demo-1000-seed3"
    files = release_files(store, rid)
    assert {"phsafe/PH1_num.csv", "safetab-p/t1/t1_US.csv", "CERTIFICATE.md", "MANIFEST.json"} <= set(files)
    assert files["CERTIFICATE.md"].startswith(b"**TEST RELEASE")
    entries = sorted(p.name for p in (store / "runs" / rid / "ledger/entries").rglob("*.json"))
    second = dasflow(prefect_api, "demo", "--store", str(store), "--persons", "1000", "--seed", "3")
    assert second.returncode == 0, second.stderr[-3000:]
    assert sorted(p.name for p in (store / "runs" / rid / "ledger/entries").rglob("*.json")) == entries
    assert release_files(store, rid) == files


def test_sigkill_among_mapped_parts_then_resume_on_dask(prefect_api: dict[str, str], tmp_path: Path) -> None:
    """TopDown's post-processing parts as mapped tasks: SIGKILL after some parts are done (thread runner), then
    resume on a Dask LocalCluster: the finished parts are reused (not rewritten), nothing is measured again, and
    the release files equal an uninterrupted run's."""
    from tests.dag.helpers import topdown_release

    def config(root: Path) -> Path:
        path = root / "release.json"
        path.write_text(json.dumps(topdown_release(root, "r1", persons=3000)))
        return path

    clean = dasflow(prefect_api, "run", str(config(tmp_path / "clean")))
    assert clean.returncode == 0, clean.stderr[-3000:]
    steps = sorted(p.parent.name for p in (tmp_path / "clean/store/runs/r1/postprocessed/topdown/parts")
                   .glob("*/level-*/*.json"))
    assert steps, "TopDown ran in parts"
    crashed = dasflow(prefect_api, "run", str(config(tmp_path / "crash")),
                      fault="postprocess:part-done:topdown/level-1/*")
    assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr[-2000:])
    parts = tmp_path / "crash/store/runs/r1/postprocessed/topdown/parts"
    before = {p: p.stat().st_mtime_ns for p in parts.rglob("*") if p.is_file()}
    assert any(p.name == "all.json" and p.parent.name == "level-1" for p in before)  # written, then killed
    assert not (tmp_path / "crash/store/runs/r1/release/MANIFEST.json").exists()
    ledger = sorted(p.name for p in (tmp_path / "crash/store/runs/r1/ledger/entries").rglob("*.json"))
    resumed = dasflow(prefect_api, "resume", "r1", "--store", str(tmp_path / "crash/store"), "--task-runner", "dask")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # finished parts reused as they were
    assert sorted(p.name for p in (tmp_path / "crash/store/runs/r1/ledger/entries").rglob("*.json")) == ledger
    assert release_files(tmp_path / "crash/store", "r1") == release_files(tmp_path / "clean/store", "r1")
