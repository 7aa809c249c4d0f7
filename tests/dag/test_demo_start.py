"""The flow commands (``demo``, ``run``, ``resume``) start their temporary Prefect server before Prefect is
imported (``dasflow.flows.temporary_api``): it is the server the flows then report to, every thread and child
process sees it, this process never imports Prefect's server, and it is stopped at the end. With an API
configured (environment or Prefect settings), or a server that does not start, Prefect's own behaviour applies."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

from dasflow.flows import temporary_api
from dasflow.flows.temporary_api import TemporaryApi, serving_flows


def test_a_configured_or_disabled_api_starts_no_temporary_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert temporary_api.launch() is None
    monkeypatch.delenv("PREFECT_API_URL")
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_ENABLED", "false")
    assert temporary_api.launch() is None


def _stand_in(code: str) -> TemporaryApi:
    """A process standing in for the server (nothing listens on its port)."""
    return TemporaryApi(subprocess.Popen([sys.executable, "-c", code]), temporary_api._free_port())


def test_an_api_configured_in_prefect_settings_wins_and_the_early_server_is_stopped() -> None:
    api = _stand_in("import time; time.sleep(60)")
    process = api.process
    assert process is not None
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}), serving_flows(api) as ready:
        assert ready() is None
        assert process.poll() is not None and api.process is None  # stopped at once
        assert get_current_settings().api.url == "http://127.0.0.1:9/api"  # untouched


def test_a_server_that_exits_leaves_prefect_settings_alone() -> None:
    api = _stand_in("raise SystemExit(1)")
    before = dict(os.environ)
    with serving_flows(api) as ready:
        assert ready() is None
        assert api.process is None
        assert get_current_settings().api.url is None
    assert dict(os.environ) == before


_EARLY = """
import os, sys, threading
from dasflow.flows import temporary_api
api = temporary_api.launch()
assert api is not None and "prefect" not in sys.modules  # started before Prefect is imported
process = api.process
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.settings import get_current_settings

@flow(name="early-api-probe")
def probe() -> int:
    return 7

with temporary_api.serving_flows(api) as ready:
    url = ready()
    assert url == api.api_url, (url, api.api_url)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(get_current_settings().api.url))  # a fresh context
    thread.start(); thread.join()
    assert seen == [url] and os.environ["PREFECT_API_URL"] == url
    assert probe() == 7
    with get_client(sync_client=True) as client:
        assert str(client.api_url).rstrip("/") == url.rstrip("/")
        assert [r.name for r in client.read_flows()] == ["early-api-probe"]  # the run is on this server
assert process.poll() is not None  # stopped with the block
assert "PREFECT_API_URL" not in os.environ and get_current_settings().api.url is None
assert "prefect.server.api.server" not in sys.modules  # Prefect's server was never imported here
print("ok")
"""


@pytest.mark.slow
def _run_fresh(script: str, tmp_path: Path, timeout: int) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh interpreter with no Prefect API configured and a fresh Prefect home; it must print
    "ok" last."""
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", "PREFECT_UI_URL")}
    env["PREFECT_HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=timeout,
                         check=False)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
    return out


def test_with_a_fresh_prefect_home_the_early_server_is_the_flows(tmp_path: Path) -> None:
    out = _run_fresh(_EARLY, tmp_path, 300)
    assert "Error logging to API" not in out.stderr and "View at" not in out.stderr


_ENTRY = """
import sys
import dasflow.cli as cli
from dasflow.flows import temporary_api
assert "pandas" not in sys.modules and "prefect" not in sys.modules, "the entry point imports too much"
assert cli._early_api(["status", "r1"]) is None and cli._early_api(["demo", "--help"]) is None
api = cli._early_api(["demo", "--store", "x"])
assert api is not None and api.process is not None
assert "pandas" not in sys.modules and "prefect" not in sys.modules  # launched before the heavy imports
assert temporary_api.launch() is api  # the flow command takes the early server over: one server
process = api.process
try:
    cli.main(["demo", "--persons", "many"])  # a usage error: no flow runs, the early server stops
except SystemExit as exc:
    assert exc.code == 2
assert api.process is None and process.wait(timeout=10) is not None
print("ok")
"""


def test_the_entry_point_launches_a_flow_commands_server_before_its_imports(tmp_path: Path) -> None:
    _run_fresh(_ENTRY, tmp_path, 120)


def test_without_block_registration_the_server_keeps_no_registration_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []

    class Popen:
        def __init__(self, args: list[str], env: dict[str, str]) -> None:
            seen.append(env)

    monkeypatch.setattr(temporary_api.subprocess, "Popen", Popen)
    monkeypatch.delenv("PREFECT_API_BLOCKS_REGISTER_ON_START", raising=False)
    monkeypatch.delenv("PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION", raising=False)
    temporary_api._spawn(9)
    monkeypatch.setenv("PREFECT_API_BLOCKS_REGISTER_ON_START", "true")  # an operator's choice: memo left alone
    temporary_api._spawn(9)
    assert seen[0]["PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION"] == "false"
    assert "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION" not in seen[1]


def test_only_the_console_script_freezes_the_garbage_collector(tmp_path: Path) -> None:
    """``gc.freeze()`` (exit-time collections skipped) only when the command owns its process: ``main()`` with
    the process's argv; a caller of ``main(argv)`` (a test, an embedding program) keeps its collector as it
    was, even when the command fails (here: refused by the ledger, exit 3)."""
    store = tmp_path / "store"
    script = ("import gc, sys\nfrom dasflow import cli\n"
              f"argv = ['account', 'show', 'nope', '--store', {str(store)!r}]\n"
              "assert cli.main(argv) == 3 and gc.get_freeze_count() == 0\n"
              "sys.argv = ['dasflow', *argv]\n"
              "assert cli.main() == 3 and gc.get_freeze_count() > 0\n"
              "print('ok')\n")
    _run_fresh(script, tmp_path, 120)
