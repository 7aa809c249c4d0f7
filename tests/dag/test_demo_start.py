"""``dasflow demo`` starts the process's temporary Prefect server while it generates the synthetic census; with a
configured Prefect API it starts nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from prefect.server.api.server import SubprocessASGIServer
from prefect.settings import PREFECT_API_URL, temporary_settings

from dasflow.flows.cli import start_api_early


def test_a_configured_api_starts_no_temporary_server() -> None:
    before = {t.name for t in threading.enumerate()}
    instances = dict(SubprocessASGIServer._instances)
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        wait = start_api_early()
    wait()
    assert "prefect-api-start" not in {t.name for t in threading.enumerate()} - before
    assert SubprocessASGIServer._instances == instances


_EPHEMERAL = """
import httpx
from prefect.client.orchestration import get_client
from prefect.server.api.server import SubprocessASGIServer
from dasflow.flows.cli import start_api_early
start_api_early()()
server = SubprocessASGIServer()
assert server.running and httpx.get(server.api_url + "/health").status_code == 200
with get_client(sync_client=True) as client:  # what the flow uses: the server already started, no second one
    assert str(client.api_url).rstrip("/") == server.api_url.rstrip("/"), (client.api_url, server.api_url)
    client.hello()
assert len(SubprocessASGIServer._instances) == 1
print("ok")
"""


@pytest.mark.slow
def test_with_a_fresh_prefect_home_the_temporary_server_started_early_is_the_flows(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"} | {"PREFECT_HOME": str(tmp_path / "home")}
    out = subprocess.run([sys.executable, "-c", _EPHEMERAL], env=env, capture_output=True, text=True, timeout=300,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]
