"""Object stores: a local directory (the embedded default) and S3 through boto3, behind one interface.

Every write is atomic (a reader sees the whole object or nothing) and ``put_if_absent`` is a create-only write
(``O_EXCL`` semantics on disk via ``link(2)`` of a finished temp file; ``If-None-Match: *`` on S3). The privacy
ledger's one-entry-per-key guarantee rests on ``put_if_absent`` alone, so it holds across processes and hosts.

Large objects stream both ways: ``writer(key)`` is a file-like sink whose object appears only when it is
closed without error (a temp file renamed into place on disk; a multipart upload completed on S3 — aborted, so
nothing appears, on an error), with its SHA-256 computed as the bytes go by; ``reader(key)`` is a seekable
file of the object that never holds it in memory (the file itself on disk; a temporary file on S3).

``restricted(...)`` returns a view that refuses any key under the given prefixes: post-processing gets a view
that cannot resolve ``confidential/`` keys at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import tempfile
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, TypeVar
from urllib.parse import urlparse

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import DasflowError, InputError, IntegrityError

#: threads of a local store's ``put_many`` (each mostly waits for its fsync)
_PUT_THREADS = 8
#: bytes of one part of an S3 multipart upload (S3's minimum part is 5 MiB, except the last)
S3_PART_BYTES = 8 * 2**20
#: bytes read at a time when an object is streamed (hashes, copies to a temporary file)
_READ_CHUNK = 2**20


class StoreError(DasflowError):
    """A store operation failed (missing object, refused key, transport error)."""


class ForbiddenKey(StoreError):
    """The key lies under a prefix this store view may not resolve."""


class StoreFault(DasflowError):
    """The store could not be used at all: no credentials, access refused, or unreachable. Deliberately not a
    ``StoreError``: code that reads a ``StoreError`` as "object absent" must never read an outage that way."""


class StoreUnavailable(StoreFault):
    """The store could not be reached (or kept failing transiently) after bounded retries; a resume heals it."""


_T = TypeVar("_T")

#: S3 error codes that may heal on retry (throttling, server-side faults).
_TRANSIENT_S3_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                                 "RequestTimeTooSkewed", "InternalError", "ServiceUnavailable", "500", "502",
                                 "503", "504"})


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _check_key(key: str) -> str:
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in key.split("/")):
        raise StoreError(f"invalid object key {key!r}")
    return key


class ObjectWriter(io.RawIOBase):
    """A streaming put: a writable binary file whose object is published atomically when ``close()`` (or the end
    of a ``with`` block) succeeds, and never if the block raises or ``abort()`` is called. ``sha256`` and
    ``size`` are known as soon as it is closed."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self._hash = hashlib.sha256()
        self.size = 0
        self._done = False

    @property
    def sha256(self) -> str:
        return self._hash.hexdigest()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._done:
            raise StoreError(f"write to {self.key!r} after it was closed")
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._write(view)
        self.size += len(view)
        return len(view)

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        """Publish the object (idempotent)."""
        if not self._done:
            self._done = True
            self._publish()
        super().close()

    def abort(self) -> None:
        """Drop everything written; the object is not created or changed."""
        if not self._done:
            self._done = True
            self._discard()
        super().close()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if kind is None:
            self.close()
        else:
            self.abort()

    def _write(self, data: memoryview) -> None:
        raise NotImplementedError

    def _publish(self) -> None:
        raise NotImplementedError

    def _discard(self) -> None:
        raise NotImplementedError


class _SpooledWriter(ObjectWriter):
    """The generic streaming put of a store without its own: spooled to a temporary file, then one ``put``."""

    def __init__(self, store: ObjectStore, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close() / abort())

    def _write(self, data: memoryview) -> None:
        self._file.write(data)

    def _publish(self) -> None:
        try:
            self._file.seek(0)
            self._store.put(self.key, self._file.read())
        finally:
            self._file.close()

    def _discard(self) -> None:
        self._file.close()


class ObjectStore(ABC):
    """Interface of every store. Keys are relative POSIX paths ("runs/r1/config.json")."""

    uri: str

    @abstractmethod
    def put(self, key: str, data: bytes) -> str:
        """Atomically write ``data`` (replacing any object); return its SHA-256."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` only if it does not exist; True if this call created it."""

    def put_many(self, items: Mapping[str, bytes]) -> dict[str, str]:
        """Write several objects, each exactly as ``put`` does (atomic, durable); return key → SHA-256. All are
        written when it returns, in no particular order among themselves (a store may write them at once)."""
        return {key: self.put(key, data) for key, data in items.items()}

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The object's bytes; ``StoreError`` if it does not exist."""

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether the object exists."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """All keys under ``prefix`` (a folder prefix ending in "/" or a key prefix), sorted."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object if present (used for scratch data only, never for ledger entries)."""

    def sha256(self, key: str) -> str:
        """Hex SHA-256 of the stored object's content."""
        return sha256_bytes(self.get(key))

    def head(self, key: str, size: int) -> bytes:
        """The object's first ``size`` bytes (a content check that need not read a whole input file)."""
        return self.get(key)[:size]

    def writer(self, key: str) -> ObjectWriter:
        """A streaming put of ``key`` (:class:`ObjectWriter`): use it in a ``with`` block; the object appears,
        complete, only when the block ends without error."""
        _check_key(key)
        return _SpooledWriter(self, key)

    def reader(self, key: str) -> IO[bytes]:
        """The object as a seekable binary file (close it after use); ``StoreError`` if it does not exist."""
        out = tempfile.TemporaryFile()  # noqa: SIM115 (the caller's to close)
        out.write(self.get(key))
        out.seek(0)
        return out

    def write_parquet(self, key: str, tables: Iterable[pa.Table], schema: pa.Schema | None = None) -> tuple[str, int]:
        """Stream ``tables`` (same schema) into one Parquet object, one row group each (zstd, statistics); an
        empty iterable writes a file of ``schema`` with no rows. Returns (sha256, rows)."""
        rows = 0
        with self.writer(key) as sink:
            writer: pq.ParquetWriter | None = None
            try:
                for table in tables:
                    if writer is None:
                        writer = pq.ParquetWriter(sink, table.schema, compression="zstd", write_statistics=True)
                    writer.write_table(table, row_group_size=max(table.num_rows, 1))
                    rows += table.num_rows
                if writer is None:
                    if schema is None:
                        raise StoreError(f"{key}: no tables and no schema to write")
                    writer = pq.ParquetWriter(sink, schema, compression="zstd", write_statistics=True)
            finally:
                if writer is not None:
                    writer.close()
        return sink.sha256, rows

    def get_text(self, key: str) -> str:
        return self.get(key).decode("utf-8")

    def put_text(self, key: str, text: str) -> str:
        return self.put(key, text.encode("utf-8"))

    def put_parquet(self, key: str, frame: pd.DataFrame) -> tuple[str, int]:
        """Write a DataFrame as Parquet (deterministic bytes for equal frames); return (sha256, rows)."""
        table = pa.Table.from_pandas(frame, preserve_index=False)
        buf = io.BytesIO()
        pq.write_table(table, buf, compression="zstd", write_statistics=True)
        data = buf.getvalue()
        return self.put(key, data), table.num_rows

    def get_parquet(self, key: str) -> pd.DataFrame:
        frame: pd.DataFrame = pq.read_table(io.BytesIO(self.get(key))).to_pandas()
        return frame

    def restricted(self, forbidden_prefixes: Iterable[str]) -> ObjectStore:
        """A view of this store that refuses every key under ``forbidden_prefixes``."""
        return RestrictedStore(self, tuple(forbidden_prefixes))


class _LocalWriter(ObjectWriter):
    """Streaming put of a local store: a temp file beside the target, fsync'd and renamed over it on close."""

    def __init__(self, path: Path, key: str) -> None:
        super().__init__(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        fd, self._tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        self._file = os.fdopen(fd, "wb")

    def _write(self, data: memoryview) -> None:
        self._file.write(data)

    def _publish(self) -> None:
        try:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            os.replace(self._tmp, self._path)
        except BaseException:
            self._discard()
            raise

    def _discard(self) -> None:
        self._file.close()
        Path(self._tmp).unlink(missing_ok=True)


class LocalStore(ObjectStore):
    """A local directory. Atomic put = temp file + ``os.replace``; create-only = ``os.link`` of a temp file."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.root.mkdir(parents=True, exist_ok=True)
        self.uri = self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root / _check_key(key)

    def _temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def put(self, key: str, data: bytes) -> str:
        path = self._path(key)
        tmp = self._temp(path, data)
        os.replace(tmp, path)
        return sha256_bytes(data)

    def put_many(self, items: Mapping[str, bytes]) -> dict[str, str]:
        """Concurrent ``put``s: each file is still written, fsync'd and renamed on its own, but the waits for the
        disk overlap (the file system commits concurrent fsyncs together: ≈ 10× fewer waits for small files)."""
        if len(items) < 2:
            return super().put_many(items)
        with ThreadPoolExecutor(max_workers=min(_PUT_THREADS, len(items))) as pool:
            shas = list(pool.map(self.put, items.keys(), items.values()))
        return dict(zip(items.keys(), shas, strict=True))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)  # fails with EEXIST if the key exists: atomic create-only of complete content
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def sha256(self, key: str) -> str:
        """Streamed: memory stays flat whatever the file's size (national inputs are tens of GB)."""
        try:
            with self._path(key).open("rb") as fh:
                return hashlib.file_digest(fh, "sha256").hexdigest()
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

    def head(self, key: str, size: int) -> bytes:
        try:
            with self._path(key).open("rb") as fh:
                return fh.read(size)
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

    def writer(self, key: str) -> ObjectWriter:
        return _LocalWriter(self._path(key), key)

    def reader(self, key: str) -> IO[bytes]:
        try:
            return self._path(key).open("rb")
        except FileNotFoundError:
            raise StoreError(f"no object {key!r} in {self.uri}") from None

    def list(self, prefix: str = "") -> list[str]:
        base = self.root / prefix.rsplit("/", 1)[0] if "/" in prefix else self.root
        if not base.is_dir():
            return []
        out = []
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                if name.startswith(".") and name.endswith(".tmp"):
                    continue
                rel = Path(dirpath, name).relative_to(self.root).as_posix()
                if rel.startswith(prefix):
                    out.append(rel)
        return sorted(out)

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def local_path(self, key: str) -> Path:
        """Filesystem path of a key (local stores only)."""
        return self._path(key)


class _S3Writer(ObjectWriter):
    """Streaming put of an S3 store: a multipart upload of ``S3_PART_BYTES`` parts, completed on close (S3 makes
    the object visible only then, whole) and aborted on an error; an object smaller than one part is a single
    ``put_object``. At most one part is held in memory."""

    def __init__(self, store: S3Store, key: str) -> None:
        super().__init__(key)
        self._store = store
        self._buf = bytearray()
        self._upload: str | None = None
        self._parts: list[dict[str, Any]] = []

    def _write(self, data: memoryview) -> None:
        self._buf += data
        while len(self._buf) >= S3_PART_BYTES:
            self._send(bytes(self._buf[:S3_PART_BYTES]))
            del self._buf[:S3_PART_BYTES]

    def _send(self, part: bytes) -> None:
        st, key = self._store, self._store._key(self.key)
        if self._upload is None:
            self._upload = str(st._call(f"multipart upload of {self.key!r}", lambda: st.client.create_multipart_upload(
                Bucket=st.bucket, Key=key))["UploadId"])
        number = len(self._parts) + 1
        etag = st._call(f"part {number} of {self.key!r}", lambda: st.client.upload_part(
            Bucket=st.bucket, Key=key, UploadId=self._upload, PartNumber=number, Body=part))["ETag"]
        self._parts.append({"ETag": etag, "PartNumber": number})

    def _publish(self) -> None:
        from botocore.exceptions import ClientError

        st = self._store
        try:
            if self._upload is None:
                st.put(self.key, bytes(self._buf))
                return
            if self._buf:
                self._send(bytes(self._buf))
            upload, parts = self._upload, {"Parts": self._parts}
            st._call(f"completion of {self.key!r}", lambda: st.client.complete_multipart_upload(
                Bucket=st.bucket, Key=st._key(self.key), UploadId=upload, MultipartUpload=parts))
        except ClientError as exc:
            self._discard()
            raise StoreError(f"streamed put of {self.key!r} failed: {exc}") from None
        except BaseException:
            self._discard()
            raise
        finally:
            self._buf = bytearray()

    def _discard(self) -> None:
        self._buf = bytearray()
        if self._upload is not None:
            st, upload = self._store, self._upload
            self._upload = None
            # nothing was published either way; S3's lifecycle rules collect an upload whose abort failed
            with contextlib.suppress(Exception):
                st.client.abort_multipart_upload(Bucket=st.bucket, Key=st._key(self.key), UploadId=upload)


class S3Store(ObjectStore):
    """An ``s3://bucket/prefix`` store through boto3.

    Endpoint and credentials come from the standard AWS chain (``AWS_ENDPOINT_URL``, profiles, instance roles)
    unless given explicitly. Create-only writes use ``If-None-Match: *`` (AWS since 2024, moto, SeaweedFS).
    """

    #: retries after the first attempt of a call, and the backoff (seconds, doubled per retry, capped)
    retries: int = 4
    backoff: float = 0.5
    max_backoff: float = 8.0

    def __init__(self, uri: str, *, endpoint_url: str | None = None, client: Any = None) -> None:
        parsed = urlparse(uri)
        if parsed.scheme != "s3" or not parsed.netloc:
            raise InputError(f"not an s3:// URI: {uri!r}")
        self.bucket = parsed.netloc
        self.prefix = parsed.path.strip("/")
        self.uri = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        if client is None:
            import boto3

            client = boto3.client("s3", endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL"))
        self.client = client

    def _key(self, key: str) -> str:
        _check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, what: str, call: Callable[[], _T]) -> _T:
        """``call()`` with bounded exponential backoff on transient faults (endpoint unreachable, timeouts,
        dropped connections, throttling, 5xx), then ``StoreUnavailable``; missing credentials or refused access
        fail at once (``StoreFault``).
        Other ``ClientError``s are re-raised for the caller to interpret (e.g. a refused create-only write)."""
        from botocore.exceptions import (
            BotoCoreError,
            ClientError,
            ConnectionError,
            HTTPClientError,
            IncompleteReadError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        for attempt in range(self.retries + 1):
            try:
                return call()
            except (NoCredentialsError, PartialCredentialsError):
                raise StoreFault(f"{what} in {self.uri}: no S3 credentials (set AWS_ACCESS_KEY_ID and "
                                 "AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)") from None
            except ClientError as exc:
                error = exc.response.get("Error", {})
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
                code = str(error.get("Code", ""))
                if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "NoSuchBucket"):
                    raise StoreFault(f"{what} in {self.uri}: {code} ({error.get('Message', 'refused')})") from None
                if code not in _TRANSIENT_S3_CODES and not (isinstance(status, int) and status >= 500):
                    raise
                reason = f"{code or status}"
            except (ConnectionError, HTTPClientError, IncompleteReadError) as exc:
                reason = type(exc).__name__
            except BotoCoreError as exc:
                raise StoreFault(f"{what} in {self.uri}: {type(exc).__name__}: {exc}") from None
            if attempt < self.retries:
                time.sleep(min(self.max_backoff, self.backoff * 2 ** attempt))
        raise StoreUnavailable(f"{what} in {self.uri}: the S3 endpoint is unavailable ({reason}) after "
                               f"{self.retries + 1} attempts; retry or resume when it is back")

    def put(self, key: str, data: bytes) -> str:
        from botocore.exceptions import ClientError

        # A single PUT is atomic on S3: readers see the old object or the new one, never a part.
        try:
            self._call(f"put of {key!r}",
                       lambda: self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data))
        except ClientError as exc:
            raise StoreError(f"put of {key!r} failed: {exc}") from None
        return sha256_bytes(data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(f"create-only put of {key!r}", lambda: self.client.put_object(
                Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*"))
            return True
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise StoreError(f"create-only put of {key!r} failed: {exc}") from exc

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            return self._call(f"get of {key!r}", lambda: bytes(
                self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()))
        except ClientError as exc:
            raise self._get_error(key, exc) from (None if _missing(exc) else exc)

    def writer(self, key: str) -> ObjectWriter:
        _check_key(key)
        return _S3Writer(self, key)

    def reader(self, key: str) -> IO[bytes]:
        """The object copied into a temporary file in chunks (never whole in memory); a transfer that fails
        part-way is retried from the start."""
        from botocore.exceptions import ClientError

        def fetch() -> IO[bytes]:
            out = tempfile.TemporaryFile()  # noqa: SIM115 (the caller's to close)
            try:
                body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
                for chunk in body.iter_chunks(_READ_CHUNK):
                    out.write(chunk)
                out.seek(0)
            except BaseException:
                out.close()
                raise
            return out

        try:
            return self._call(f"get of {key!r}", fetch)
        except ClientError as exc:
            raise self._get_error(key, exc) from (None if _missing(exc) else exc)

    def _get_error(self, key: str, exc: Exception) -> StoreError:
        """A failed GET as one line: a missing object, or the failure."""
        if _missing(exc):
            return StoreError(f"no object {key!r} in {self.uri}")
        return StoreError(f"get of {key!r} failed: {exc}")

    def sha256(self, key: str) -> str:
        """Hashed as the body streams in (memory flat whatever the object's size, no temporary file: the key
        may be a confidential input); a transfer that fails part-way is retried from the start."""
        from botocore.exceptions import ClientError

        def digest() -> str:
            h = hashlib.sha256()
            body = self.client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"]
            for chunk in body.iter_chunks(_READ_CHUNK):
                h.update(chunk)
            return h.hexdigest()

        try:
            return self._call(f"get of {key!r}", digest)
        except ClientError as exc:
            raise self._get_error(key, exc) from (None if _missing(exc) else exc)

    def head(self, key: str, size: int) -> bytes:
        """A ranged GET of the first ``size`` bytes (an empty object has none: S3 answers InvalidRange)."""
        from botocore.exceptions import ClientError

        try:
            return self._call(f"get of {key!r}", lambda: bytes(self.client.get_object(
                Bucket=self.bucket, Key=self._key(key), Range=f"bytes=0-{max(size, 1) - 1}")["Body"].read()))
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code")
            if code == "InvalidRange":
                return b""
            if code in ("NoSuchKey", "404"):
                raise StoreError(f"no object {key!r} in {self.uri}") from None
            raise StoreError(f"get of {key!r} failed: {exc}") from exc

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._call(f"head of {key!r}", lambda: self.client.head_object(Bucket=self.bucket, Key=self._key(key)))
            return True
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise StoreError(f"head of {key!r} failed: {exc}") from exc

    def list(self, prefix: str = "") -> list[str]:
        if prefix and (prefix.startswith("/") or ".." in prefix.split("/")):
            raise StoreError(f"invalid list prefix {prefix!r}")
        full = (f"{self.prefix}/" if self.prefix else "") + prefix
        strip = len(self.prefix) + 1 if self.prefix else 0
        from botocore.exceptions import ClientError

        def pages() -> list[str]:
            out: list[str] = []
            for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=full):
                out.extend(obj["Key"][strip:] for obj in page.get("Contents", []))
            return out

        try:
            return sorted(self._call(f"list of {prefix!r}", pages))
        except ClientError as exc:
            raise StoreError(f"list of {prefix!r} failed: {exc}") from None

    def delete(self, key: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self._call(f"delete of {key!r}",
                       lambda: self.client.delete_object(Bucket=self.bucket, Key=self._key(key)))
        except ClientError as exc:
            raise StoreError(f"delete of {key!r} failed: {exc}") from None


class RestrictedStore(ObjectStore):
    """A view of another store that cannot read, write or list keys under the forbidden prefixes."""

    def __init__(self, inner: ObjectStore, forbidden: tuple[str, ...]) -> None:
        self.inner = inner
        self.forbidden = forbidden
        self.uri = inner.uri

    def _ok(self, key: str) -> str:
        for prefix in self.forbidden:
            if key.startswith(prefix):
                raise ForbiddenKey(f"key {key!r} is not readable from this stage (under {prefix!r})")
        return key

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(self._ok(key), data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(self._ok(key), data)

    def put_many(self, items: Mapping[str, bytes]) -> dict[str, str]:
        for key in items:
            self._ok(key)  # every key is checked before anything is written
        return self.inner.put_many(items)

    def get(self, key: str) -> bytes:
        return self.inner.get(self._ok(key))

    def sha256(self, key: str) -> str:
        return self.inner.sha256(self._ok(key))

    def head(self, key: str, size: int) -> bytes:
        return self.inner.head(self._ok(key), size)

    def writer(self, key: str) -> ObjectWriter:
        return self.inner.writer(self._ok(key))

    def reader(self, key: str) -> IO[bytes]:
        return self.inner.reader(self._ok(key))

    def exists(self, key: str) -> bool:
        return self.inner.exists(self._ok(key))

    def list(self, prefix: str = "") -> list[str]:
        if prefix:
            self._ok(prefix)
        return [k for k in self.inner.list(prefix) if not any(k.startswith(p) for p in self.forbidden)]

    def delete(self, key: str) -> None:
        self.inner.delete(self._ok(key))


class FrozenStore(ObjectStore):
    """A view that serves the objects under ``guarded`` prefixes only as frozen: each read is checked against the
    SHA-256 recorded for its key (``frozen``), and a key under a guarded prefix that was not frozen, or whose bytes
    changed, raises ``IntegrityError`` naming it. Guarded keys cannot be written or deleted through the view;
    every other key passes through unchanged."""

    #: how the errors name the digests: taken by the plan (frozen), or by a validation (``by="validation"``)
    _PHRASES: ClassVar[dict[str, tuple[str, str]]] = {"plan": ("frozen with the plan", "the plan froze it"),
                "validation": ("digested by its validation", "its validation digested it")}

    def __init__(self, inner: ObjectStore, frozen: Mapping[str, str], guarded: Iterable[str], *,
                 by: str = "plan") -> None:
        self.inner = inner
        self.frozen = dict(frozen)
        self.guarded = tuple(guarded)
        self.uri = inner.uri
        self._taken, self._since = self._PHRASES[by]

    def _guarded(self, key: str) -> bool:
        return any(key.startswith(p) for p in self.guarded)

    def _writable(self, key: str) -> str:
        if self._guarded(key):
            raise ForbiddenKey(f"key {key!r} is a frozen input: it is never written after the plan is frozen")
        return key

    def get(self, key: str) -> bytes:
        if not self._guarded(key):
            return self.inner.get(key)
        want = self.frozen.get(key)
        if want is None:
            raise IntegrityError(f"{self.uri}/{key}: not among the inputs {self._taken} (added later)")
        if not self.inner.exists(key):
            raise self._deleted(key)
        data = self.inner.get(key)
        if sha256_bytes(data) != want:
            raise IntegrityError(f"{self.uri}/{key}: changed since {self._since} (its SHA-256 no longer matches)")
        return data

    def sha256(self, key: str) -> str:
        if not self._guarded(key):
            return self.inner.sha256(key)
        return sha256_bytes(self.get(key))

    def head(self, key: str, size: int) -> bytes:
        return self.get(key)[:size] if self._guarded(key) else self.inner.head(key, size)

    def reader(self, key: str) -> IO[bytes]:
        return io.BytesIO(self.get(key)) if self._guarded(key) else self.inner.reader(key)

    def _deleted(self, key: str) -> IntegrityError:
        return IntegrityError(f"{self.uri}/{key}: {self._taken} but no longer in the store (deleted)")

    def exists(self, key: str) -> bool:
        """A frozen object that is gone is an ``IntegrityError``, not a missing optional input."""
        found = self.inner.exists(key)
        if not found and key in self.frozen and self._guarded(key):
            raise self._deleted(key)
        return found

    def list(self, prefix: str = "") -> list[str]:
        """The inner listing; a frozen object under ``prefix`` that is gone is an ``IntegrityError``."""
        keys = self.inner.list(prefix)
        present = set(keys)
        gone = sorted(k for k in self.frozen if k.startswith(prefix) and self._guarded(k) and k not in present)
        if gone:
            raise self._deleted(gone[0])
        return keys

    def put(self, key: str, data: bytes) -> str:
        return self.inner.put(self._writable(key), data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.inner.put_if_absent(self._writable(key), data)

    def put_many(self, items: Mapping[str, bytes]) -> dict[str, str]:
        for key in items:
            self._writable(key)
        return self.inner.put_many(items)

    def writer(self, key: str) -> ObjectWriter:
        return self.inner.writer(self._writable(key))

    def delete(self, key: str) -> None:
        self.inner.delete(self._writable(key))


def open_store(uri: str | os.PathLike[str], *, endpoint_url: str | None = None) -> ObjectStore:
    """A store for ``uri``: ``s3://bucket/prefix``, ``file:///dir`` or a plain directory path."""
    text = os.fspath(uri)
    if text.startswith("s3://"):
        return S3Store(text, endpoint_url=endpoint_url)
    if text.startswith("file://"):
        return LocalStore(urlparse(text).path)
    if "://" in text:
        raise InputError(f"unsupported store URI {text!r} (use a directory, file:// or s3://)")
    return LocalStore(text)


def new_token() -> str:
    """A random identifier for one process's attempt (audit trail of who reserved what)."""
    return uuid.uuid4().hex


def _missing(exc: Exception) -> bool:
    """Whether a botocore ClientError says the object does not exist."""
    response = getattr(exc, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("NoSuchKey", "404")
