"""Timings of the local production-like stack (infra/local/stack.py), side by side with the peer it replaces in
the tests: a Prefect server on SQLite (``prefect server start`` with its default database, as
tests/dag/test_fault_injection.py starts it).

    .venv/bin/python benchmarks/infra_stack.py      # about 3 minutes; prints a Markdown table

Measures: cold ``stack start`` (fresh state: initdb, migrations on PostgreSQL), warm ``start`` (idempotent, all
running), ``deploy``, ``stop``, restart on existing state (all four components, the Prefect server on an already
migrated PostgreSQL), and the peer: a Prefect server alone on a fresh SQLite home, start to healthy.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STACK = [sys.executable, str(REPO / "infra/local/stack.py")]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def timed(args: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(args, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{args} failed: {done.stdout}{done.stderr}")
    return time.perf_counter() - t0


def sqlite_server_start() -> float:
    home = tempfile.mkdtemp(prefix="dasflow-bench-sqlite-")
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": home, "PREFECT_UI_ENABLED": "false",
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(Path(sys.executable).with_name("prefect")), "server", "start", "--host",
                             "127.0.0.1", "--port", str(port)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=2):
                    return time.perf_counter() - t0
            except OSError:
                time.sleep(0.2)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    state = Path(tempfile.mkdtemp(prefix="dasflow-bench-stack-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PREFECT_", "DASFLOW_"))}
    env.update({"DASFLOW_STACK_DIR": str(state), "PREFECT_UI_ENABLED": "false"})
    for name in ("s3", "weed_master", "weed_volume", "weed_filer", "s3_grpc", "weed_master_grpc", "weed_volume_grpc",
                 "weed_filer_grpc", "postgres", "prefect"):
        env[f"DASFLOW_STACK_{name.upper()}_PORT"] = str(free_port())
    rows: list[tuple[str, float]] = []
    try:
        rows.append(("stack start, cold (initdb + migrations)", timed([*STACK, "start"], env)))
        rows.append(("stack start, warm (all running: checks only)", timed([*STACK, "start"], env)))
        rows.append(("stack deploy (4 deployments)", timed([*STACK, "deploy"], env)))
        rows.append(("stack stop", timed([*STACK, "stop"], env)))
        rows.append(("stack start, existing state", timed([*STACK, "start"], env)))
        timed([*STACK, "stop"], env)
        sqlite = sqlite_server_start()
    finally:
        subprocess.run([*STACK, "stop"], env=env, capture_output=True, check=False)
        shutil.rmtree(state, ignore_errors=True)
    print("| step | wall s |\n|---|---|")
    for name, secs in rows:
        print(f"| {name} | {secs:.1f} |")
    print(f"| peer: Prefect server on SQLite, fresh home, start to healthy | {sqlite:.1f} |")
    print(f"| ratio cold stack start / SQLite server start | {rows[0][1] / sqlite:.2f} |")


if __name__ == "__main__":
    main()
