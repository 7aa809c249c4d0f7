"""Fast checks of infra/local/stack.py that need no server: state directory, frozen ports, secret file modes,
the command surface, and a status report of a stack that is not running (item 2: status/health checks)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.infra.stack_module import STACK_PY, stack_module
from tests.servers import free_port

stack_mod = stack_module()


def test_load_freezes_ports_and_keeps_secrets_private(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DASFLOW_STACK_POSTGRES_PORT", "61234")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    first = stack_mod.load(tmp_path / "st")
    assert first.ports["postgres"] == 61234 and first.ports["prefect"] == 4200
    monkeypatch.setenv("DASFLOW_STACK_POSTGRES_PORT", "61235")
    again = stack_mod.load(tmp_path / "st")
    assert again == first  # ports and credentials are generated once, then read back
    assert stat.S_IMODE((tmp_path / "st/secrets.json").stat().st_mode) == 0o600
    assert (tmp_path / "st/.gitignore").read_text() == "*\n"
    assert first.database_url.startswith("postgresql+asyncpg://postgres:")
    assert first.database_url.endswith("@127.0.0.1:61234/prefect")
    assert first.client_env()["AWS_ENDPOINT_URL"] == f"http://127.0.0.1:{first.ports['s3']}"
    assert json.loads((tmp_path / "st/ports.json").read_text())["postgres"] == 61234


def test_start_uses_given_s3_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "opkey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "opsecret")
    loaded = stack_mod.load(tmp_path / "st")
    assert (loaded.s3_key, loaded.s3_secret) == ("opkey", "opsecret")


def _run(args: list[str], state: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PREFECT_", "DASFLOW_"))}
    env["DASFLOW_STACK_DIR"] = str(state)
    for name in stack_mod.DEFAULT_PORTS:
        env[f"DASFLOW_STACK_{name.upper()}_PORT"] = str(free_port())
    return subprocess.run([sys.executable, str(STACK_PY), *args], env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_usage_error_exits_2(tmp_path: Path) -> None:
    done = _run(["restart"], tmp_path / "st")
    assert done.returncode == 2 and "usage:" in done.stderr


def test_status_of_a_stopped_stack_is_all_down_and_stop_is_idempotent(tmp_path: Path) -> None:
    status = _run(["status"], tmp_path / "st")
    assert status.returncode == 1
    lines = status.stdout.splitlines()
    assert [line.split()[:2] for line in lines] == [[name, "DOWN"] for name in stack_mod.COMPONENTS]
    assert _run(["stop"], tmp_path / "st").returncode == 0
    assert _run(["stop"], tmp_path / "st").returncode == 0


def test_env_prints_client_exports(tmp_path: Path) -> None:
    done = _run(["env"], tmp_path / "st")
    assert done.returncode == 0
    keys = [line.split("=", 1)[0] for line in done.stdout.splitlines()]
    assert keys == ["export AWS_ENDPOINT_URL", "export AWS_ACCESS_KEY_ID", "export AWS_SECRET_ACCESS_KEY",
                    "export AWS_DEFAULT_REGION", "export PREFECT_API_URL", "export PREFECT_API_AUTH_STRING",
                    "export DASFLOW_HOME"]
    publisher = _run(["env", "publisher"], tmp_path / "st")
    assert publisher.returncode == 0
    key = [line for line in done.stdout.splitlines() if "AWS_ACCESS_KEY_ID" in line]
    assert key and key[0] not in publisher.stdout  # one S3 identity per role
    assert _run(["env", "root"], tmp_path / "st").returncode == 2


def test_roles_and_lockdown_settings(tmp_path: Path) -> None:
    """Each role its own S3 credentials; the server requires auth and CSRF and tells the UI its own API URL;
    SeaweedFS gets JWT keys for every data path and an identity per role."""
    loaded = stack_mod.load(tmp_path / "st")
    keys = {role: loaded.client_env(role)["AWS_ACCESS_KEY_ID"] for role in ("admin", "pipeline", "publisher")}
    assert len(set(keys.values())) == 3
    server = loaded.server_env()
    assert server["PREFECT_SERVER_CSRF_PROTECTION_ENABLED"] == "true"
    assert server["PREFECT_SERVER_API_AUTH_STRING"] == loaded.client_env()["PREFECT_API_AUTH_STRING"]
    assert server["PREFECT_UI_API_URL"] == loaded.api_url and "*" not in server["PREFECT_SERVER_CORS_ALLOWED_ORIGINS"]
    stack_mod.write_seaweedfs_security(loaded)
    toml = (tmp_path / "st/security.toml").read_text()
    for section in ("jwt.signing", "jwt.signing.read", "jwt.filer_signing", "jwt.filer_signing.read"):
        assert f"[{section}]" in toml
    identities = {i["name"]: i for i in json.loads((tmp_path / "st/s3.json").read_text())["identities"]}
    assert not any(a.startswith(("Write:das-release", "Read:das-release")) for a in identities["pipeline"]["actions"])
    assert "Read:das-runs" not in identities["publisher"]["actions"]  # never the confidential inputs
    for name in ("security.toml", "s3.json", "secrets.json"):
        assert stat.S_IMODE((tmp_path / "st" / name).stat().st_mode) == 0o600


def test_stale_pid_file_is_ignored(tmp_path: Path) -> None:
    loaded = stack_mod.load(tmp_path / "st")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "st/worker.pid").write_text(f"{dead.pid}\n")
    assert stack_mod._pid(loaded, "worker") is None
    assert stack_mod.check_worker(loaded) == (False, "no worker process")
    (tmp_path / "st/worker.pid").write_text(f"{os.getpid()}\n")
    assert stack_mod._pid(loaded, "worker") == os.getpid()
