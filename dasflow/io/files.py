"""Local file access to store objects for readers that need a path (pyarrow CSV readers, Census formats)."""

from __future__ import annotations

import atexit
import functools
import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import LocalStore, ObjectStore, RestrictedStore


def arrow_reason(exc: BaseException) -> str:
    """A pyarrow CSV error's reason (first line, ≤ 200 characters) without the offending row's text that pyarrow
    appends to a column-count error ("Expected 17 columns, got 16: <row>"): the row is confidential and the
    message reaches logs and the operator's terminal."""
    return re.sub(r"(got \d+):.*", r"\1", str(exc).splitlines()[0])[:200]


def input_prefix(inputs: Mapping[str, str], name: str, default: str) -> str:
    """The store prefix of a named release input (``default`` when the release config does not name it)."""
    prefix = inputs.get(name, default)
    return prefix if prefix.endswith("/") else prefix + "/"


_CACHE_PREFIX = "dasflow-cache-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@functools.cache
def cache_dir() -> Path:
    """This process's private download cache for objects of remote stores (mode 0700; every file 0600), removed
    when the process exits. Caches left by processes that died (SIGKILL) are removed here, at the next start.
    Copies of confidential inputs live only here, never in a shared or world-readable place."""
    base = Path(tempfile.gettempdir())
    for stale in base.glob(f"{_CACHE_PREFIX}{os.getuid()}-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    path = base / f"{_CACHE_PREFIX}{os.getuid()}-{os.getpid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    os.chmod(path, 0o700)
    atexit.register(shutil.rmtree, path, True)
    return path


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically, readable by this user only (0600 from creation on)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def local_file(store: ObjectStore, key: str) -> Path:
    """A local path holding the object ``key``: the file itself for a local store, else a cached download
    (named by the content hash, so a changed object is fetched again) in this process's private cache."""
    if isinstance(store, LocalStore):
        return store.local_path(key)
    if isinstance(store, RestrictedStore) and isinstance(store.inner, LocalStore):
        store.exists(key)  # a restricted view refuses forbidden keys here
        return store.inner.local_path(key)
    data = store.get(key)
    path = cache_dir() / hashlib.sha256(data).hexdigest() / Path(key).name
    if not path.exists():
        path.parent.mkdir(mode=0o700, exist_ok=True)
        _write_private(path, data)
    return path


def local_dir(store: ObjectStore, prefix: str) -> Path:
    """A local directory holding every object directly under ``prefix`` (the folder itself for a local store;
    for S3, a download cache keyed by the objects' content hashes)."""
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    base = store.inner if isinstance(store, RestrictedStore) else store
    if isinstance(base, LocalStore):
        store.list(prefix)  # a restricted view refuses forbidden prefixes here
        return base.local_path(prefix.rstrip("/"))
    keys = [k for k in store.list(prefix) if "/" not in k[len(prefix):]]
    blobs = {k: store.get(k) for k in keys}
    digest = hashlib.sha256()
    for k in sorted(blobs):
        digest.update(k.encode() + b"\0" + hashlib.sha256(blobs[k]).digest())
    target = cache_dir() / digest.hexdigest()
    if not target.exists():
        tmp = target.with_name(target.name + f".{threading.get_ident()}.tmp")
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        for k, data in blobs.items():
            _write_private(tmp / Path(k).name, data)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished the same download first
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def parquet_folders(store: ObjectStore, prefix: str, what: str) -> dict[str, list[str]] | None:
    """The ``.parquet`` objects under ``prefix`` grouped by the folder holding them (e.g. one folder per state:
    ``units/{SS}/part-*.parquet``), keyed by the folder's last path segment, in key order; None when every file
    lies directly under ``prefix`` (one unpartitioned input). ``InputError`` naming the prefix when there are no
    files, files both directly under it and in folders, or two folders with the same last segment."""
    keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
    if not keys:
        raise InputError(f"no {what}", file=prefix)
    folders: dict[str, list[str]] = {}
    paths: dict[str, str] = {}
    flat = False
    for key in keys:
        rel = key[len(prefix):]
        if "/" not in rel:
            flat = True
            continue
        folder = rel.rsplit("/", 1)[0]
        name = folder.rsplit("/", 1)[-1]
        if paths.setdefault(name, folder) != folder:
            raise InputError(f"folders {paths[name]}/ and {folder}/ have the same name {name!r}: one partition "
                             "each", file=prefix)
        folders.setdefault(name, []).append(key)
    if not folders:
        return None
    if flat:
        raise InputError(f"{what}: files both directly under the prefix and in folders: one layout only",
                         file=prefix)
    return dict(sorted(folders.items()))


def read_parquet_keys(store: ObjectStore, keys: Sequence[str], columns: Sequence[str]) -> pa.Table:
    """The Parquet objects ``keys``, reduced to ``columns`` (only those are decoded) and concatenated;
    ``InputError`` naming the file and the first missing column."""
    parts = []
    for key in keys:
        source = pa.BufferReader(store.get(key))
        names = pq.read_schema(source).names
        missing = [c for c in columns if c not in names]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}", file=key, column=missing[0])
        parts.append(pq.read_table(source, columns=list(columns)))
    return pa.concat_tables(parts)


def read_parquet_records(store: ObjectStore, prefix: str, columns: Sequence[str], what: str) -> pa.Table:
    """Every ``.parquet`` object under ``prefix``, reduced to ``columns`` and concatenated; ``InputError``
    naming the prefix when there are none, or the file and the first missing column."""
    keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
    if not keys:
        raise InputError(f"no {what}", file=prefix)
    return read_parquet_keys(store, keys, columns)
