"""Local file access to store objects for readers that need a path (pyarrow CSV readers, Census formats)."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import LocalStore, ObjectStore, RestrictedStore
from dasflow.privacy import accounting


def input_prefix(inputs: Mapping[str, str], name: str, default: str) -> str:
    """The store prefix of a named release input (``default`` when the release config does not name it)."""
    prefix = inputs.get(name, default)
    return prefix if prefix.endswith("/") else prefix + "/"


def config_json(text: str, product: str) -> Any:
    """A product config's JSON with exact decimals (``accounting.load_json_exact``); ``InputError`` if malformed."""
    try:
        return accounting.load_json_exact(text)
    except ValueError as exc:
        raise InputError(f"{product} config is not valid JSON: {exc}", file=f"{product} config") from None


def local_file(store: ObjectStore, key: str) -> Path:
    """A local path holding the object ``key``: the file itself for a local store, else a cached download
    (named by the content hash, so a changed object is fetched again; the cache is private to this user)."""
    if isinstance(store, LocalStore):
        return store.local_path(key)
    if isinstance(store, RestrictedStore) and isinstance(store.inner, LocalStore):
        store.exists(key)  # a restricted view refuses forbidden keys here
        return store.inner.local_path(key)
    data = store.get(key)
    cache = Path(tempfile.gettempdir()) / f"dasflow-cache-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    path = cache / hashlib.sha256(data).hexdigest() / Path(key).name
    if not path.exists():
        path.parent.mkdir(exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
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
    target = Path(tempfile.gettempdir()) / f"dasflow-cache-{os.getuid()}" / digest.hexdigest()
    if not target.exists():
        tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
        tmp.mkdir(parents=True, exist_ok=True)
        for k, data in blobs.items():
            (tmp / Path(k).name).write_bytes(data)
        try:
            os.rename(tmp, target)
        except OSError:  # another process finished the same download first
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def read_parquet_records(store: ObjectStore, prefix: str, columns: Sequence[str], what: str) -> pa.Table:
    """Every ``.parquet`` object under ``prefix``, reduced to ``columns`` and concatenated; ``InputError``
    naming the prefix when there are none, or the file and the first missing column."""
    keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
    if not keys:
        raise InputError(f"no {what}", file=prefix)
    parts = []
    for key in keys:
        table = pq.read_table(io.BytesIO(store.get(key)))
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}", file=key, column=missing[0])
        parts.append(table.select(list(columns)))
    return pa.concat_tables(parts)
