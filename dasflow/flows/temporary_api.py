"""The command's temporary Prefect API server, started before Prefect is imported.

With no Prefect API configured, Prefect starts a temporary server on the first API call of a flow: a uvicorn
subprocess serving ``prefect.server.api.server:create_app`` (``SubprocessASGIServer``). With a fresh Prefect
home that start is the slowest step before a flow runs (the server's imports and ~110 SQLite migrations: ≈ 10 s
on an idle 2-core machine, BENCHMARKS.md "Demo"), and starting it through Prefect's class means importing
Prefect's whole server (FastAPI, SQLAlchemy, the ORM) in this process first.

:func:`launch` starts the same server process (Prefect 3.8's command line and environment for it) as the
command's first act, with nothing but the standard library, so that it migrates its database on the other core
while this process imports Prefect, numpy and the products and generates the demo's census.
:func:`serving_flows` then hands it to the flows as a configured API (``PREFECT_API_URL``, for this process's
flows and the Dask workers it starts) and stops it when the command ends. Whenever the early server is not the
one Prefect would use — an API configured in the environment or in the Prefect profile, the temporary server
disabled — or it does not answer, it is stopped and Prefect's own behaviour applies unchanged.

The early server registers no block types (``PREFECT_API_BLOCKS_REGISTER_ON_START=false`` unless set): the
flows save no block documents (result storage is a local path), and a ``prefect server start`` on the same
Prefect home registers them on its own start.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dasflow.flows import prefect_server  # standard library only at import: Prefect is imported by its process

#: uvicorn's exit code when the port is taken (Prefect retries on another port too)
_PORT_TAKEN = 3
#: launches tried (a port taken between choosing it and binding it)
_ATTEMPTS = 3
#: settings of the server process: Prefect's own for its temporary server, and no block registration
SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
SERVER_DEFAULTS = {"PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
#: with no block registration, no memo of it either: the memo imports every Prefect collection (prefect-dask and
#: so distributed) and hashes the block registry on each start, ≈ 1 s of the server's start, to skip nothing
NO_REGISTRATION = {"PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false"}
#: the commands that run a flow: their temporary Prefect server (when no API is configured) starts first thing
FLOW_COMMANDS = frozenset({"demo", "run", "resume"})


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _disabled(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("0", "false", "no", "off")


@dataclass
class TemporaryApi:
    """A started server process and its port (see the module docstring)."""

    process: subprocess.Popen[bytes] | None
    port: int
    attempts: int = 1
    started: float = field(default_factory=time.perf_counter)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait(self, timeout: float) -> str | None:
        """The API URL once ``/health`` answers 200; ``None`` (the process stopped) if the server exited or did
        not answer within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.process is not None and time.monotonic() < deadline:
            code = self.process.poll()
            if code == _PORT_TAKEN and self.attempts < _ATTEMPTS:
                self.port = _free_port()
                self.process, self.attempts = _spawn(self.port), self.attempts + 1
                continue
            if code is not None:
                break
            with contextlib.suppress(OSError, urllib.error.URLError), \
                    urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return self.api_url
            time.sleep(0.1)
        self.stop()
        return None

    def stop(self) -> None:
        """Terminate the server (idempotent), as Prefect stops its own: 5 s grace, then kill."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _spawn(port: int) -> subprocess.Popen[bytes]:
    spec = importlib.util.find_spec("prefect")  # locates the package without importing it
    assert spec is not None and spec.submodule_search_locations is not None
    app_dir = Path(next(iter(spec.submodule_search_locations))).parent
    env = SERVER_DEFAULTS | dict(os.environ) | SERVER_ENV
    if _disabled(env["PREFECT_API_BLOCKS_REGISTER_ON_START"]):
        env = NO_REGISTRATION | env
    return subprocess.Popen([sys.executable, "-m", prefect_server.__name__, "--app-dir", str(app_dir),
                             "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
                             "--port", str(port), "--log-level", "error", "--lifespan", "on"], env=env)


_LAUNCHED: list[TemporaryApi] = []


def launch() -> TemporaryApi | None:
    """Start the temporary server now, unless the environment configures a Prefect API or disables the
    temporary server (a profile's settings are checked by :func:`serving_flows`, once Prefect is imported).
    A server this process launched earlier and has not stopped is returned instead of a second one (the
    ``dasflow`` entry point launches it before its own imports)."""
    if os.environ.get("PREFECT_API_URL") or _disabled(os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED")):
        return None
    running = [api for api in _LAUNCHED if api.process is not None]
    if running:
        return running[-1]
    port = _free_port()
    api = TemporaryApi(_spawn(port), port)
    atexit.register(api.stop)
    _LAUNCHED[:] = [api]
    return api


@contextlib.contextmanager
def serving_flows(api: TemporaryApi | None) -> Iterator[Callable[[], str | None]]:
    """Yields ``ready``: called before the block's first flow runs, it waits for ``api`` and points Prefect at it
    for the rest of the block (returns its URL) when it is the server Prefect would start itself — no API
    configured, the temporary server enabled — and it answers; otherwise it stops ``api`` and leaves Prefect's
    settings alone (returns ``None``: Prefect starts its own server if it needs one).

    Prefect is pointed at the server as a configured API, for every thread and child process (the Prefect
    settings of this context and the process-global ones, and ``PREFECT_API_URL`` in the environment, restored
    afterwards), with no UI URL (the temporary server serves none, as Prefect's own). When the block ends, the
    logs and events still queued for the API are sent, then the server stops."""
    from prefect.context import refresh_global_settings_context
    from prefect.events.worker import EventsWorker
    from prefect.logging import get_logger
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_SERVER_EPHEMERAL_ENABLED,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        PREFECT_UI_URL,
        get_current_settings,
        temporary_settings,
    )

    def restore(saved: dict[str, str | None]) -> None:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        refresh_global_settings_context()

    def drain() -> None:
        APILogWorker.drain_all(timeout=5)
        EventsWorker.drain_all(timeout=5)

    with contextlib.ExitStack() as stack:
        if api is not None:
            stack.callback(api.stop)

        def ready() -> str | None:
            if api is None or api.process is None:
                return None
            if get_current_settings().api.url or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
                api.stop()
                return None
            url = api.wait(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()))
            if url is None:
                return None
            get_logger("dasflow").info(f"temporary Prefect server on {url} (started "
                                       f"{time.perf_counter() - api.started:.1f} s ago)")
            names = {"PREFECT_API_URL": url, "PREFECT_UI_URL": ""}
            stack.callback(restore, {name: os.environ.get(name) for name in names})
            os.environ.update(names)
            refresh_global_settings_context()
            stack.enter_context(temporary_settings({PREFECT_API_URL: url, PREFECT_UI_URL: ""}))
            stack.callback(drain)
            return url

        yield ready
