"""DAG benchmark: Prefect orchestration overhead per task against a real Prefect server, and a large PHSafe
release through the flow (time per stage, peak RSS, bytes through Prefect results).

    .venv/bin/python benchmarks/dag.py --persons 10000000 [--tasks 200]

Starts ``prefect server start`` on 127.0.0.1 (SQLite, its own PREFECT_HOME) and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def start_server() -> tuple[subprocess.Popen[bytes], str, str]:
    from tests.servers import free_port

    home = tempfile.mkdtemp(prefix="dasflow-bench-prefect-")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_UI_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2):
                return proc, url, home
        except OSError:
            time.sleep(0.5)
    raise RuntimeError("prefect server did not start")


def overhead(n_tasks: int) -> dict[str, float]:
    """Per-task overhead: a flow of n trivial tasks vs the same function called directly."""
    from prefect import flow, task

    def work(i: int) -> int:
        return i * 2

    t = task(work, name="noop", persist_result=False)

    @flow(name="bench-overhead")
    def many(n: int) -> int:
        return sum(t(i) for i in range(n))

    many(2)  # warm up (flow registration)
    t0 = time.perf_counter()
    many(n_tasks)
    with_prefect = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(n_tasks):
        work(i)
    direct = time.perf_counter() - t0
    return {"tasks": n_tasks, "flow_seconds": with_prefect, "per_task_ms": 1000 * (with_prefect - direct) / n_tasks}


def phsafe_release(persons: int, workdir: Path) -> dict[str, object]:
    from dasflow import synth
    from dasflow.config import parse_release_config
    from dasflow.flows.release import run_release
    from dasflow.io.store import LocalStore

    store = LocalStore(workdir / "store")
    t0 = time.perf_counter()
    states = [s for s in sorted(synth.reference.states()) if s != "72"]
    synth.generate(store.local_path("confidential/synth"), persons=persons, seed=1, states=states,
                   formats=("phsafe",))
    gen_seconds = time.perf_counter() - t0
    geo = store.local_path("public/phsafe/geo.csv")
    geo.parent.mkdir(parents=True, exist_ok=True)
    os.replace(store.local_path("confidential/synth/phsafe/geo.csv"), geo)
    text = (REPO / "dasflow/demo_data/phsafe-us-config.json").read_text()
    cfg = parse_release_config({
        "release_id": "bench", "universe": "US", "store": str(workdir / "store"),
        "inputs": {"phsafe": "confidential/synth/phsafe/", "phsafe_geo": "public/phsafe/"},
        "products": [{"name": "phsafe", "config_text": text}], "cap": {"rho": "2"},
        "rng": {"mode": "production"}})
    t0 = time.perf_counter()
    run_release(cfg)
    total = time.perf_counter() - t0
    stage_seconds = task_durations()
    results_dir = store.local_path("runs/bench/prefect-results")
    result_bytes = sum(p.stat().st_size for p in results_dir.rglob("*") if p.is_file()) if results_dir.exists() else 0
    return {"persons": persons, "synth_seconds": round(gen_seconds, 1), "release_seconds": round(total, 1),
            "stage_seconds": stage_seconds, "prefect_result_bytes": result_bytes,
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def task_durations() -> dict[str, float]:
    """Wall time of every task run of the last flow runs, by task name (from the Prefect API)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(limit=200)
    out: dict[str, float] = {}
    for r in runs:
        if r.start_time and r.end_time:
            name = r.name.rsplit("-", 1)[0]
            out[name] = round(out.get(name, 0.0) + (r.end_time - r.start_time).total_seconds(), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=1_000_000)
    ap.add_argument("--tasks", type=int, default=200)
    args = ap.parse_args()
    proc, url, home = start_server()
    os.environ.update({"PREFECT_API_URL": url, "PREFECT_HOME": home, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"})
    work = Path(tempfile.mkdtemp(prefix="dasflow-bench-dag-"))
    try:
        result = {"overhead": overhead(args.tasks), "release": phsafe_release(args.persons, work)}
        print(json.dumps(result, indent=1))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
