"""Output validation, the release manifest, and publication to a separate store.

Order (issue 12 item 4): the release files are validated, then ``MANIFEST.json`` — SHA-256 and row count of
every file under ``runs/{id}/release/`` — is written **last**, so a manifest exists only for a complete,
validated release. Publishing copies exactly the files the manifest lists (each re-hashed against it) to a
store that is separate from the release's own store (which holds ``confidential/``), then writes
``PUBLICATION.json`` last. Nothing carries a timestamp, so publishing the same release again is
byte-identical; an existing published object with different bytes is never overwritten (refused).

A test release (seeded randomness) can only be published as an explicitly marked test publication, under
``test-releases/`` instead of ``releases/`` (DESIGN §4).
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import urlparse

import pandas as pd
import pyarrow.parquet as pq

from dasflow.errors import DasflowError
from dasflow.io.delimited import integer_counts
from dasflow.io.store import ObjectStore, StoreError, open_store, sha256_bytes
from dasflow.pipeline.run import RunContext, code_version
from dasflow.pipeline.stages import verify_release
from dasflow.products.plugin import overrides

MANIFEST = "MANIFEST.json"
PUBLICATION = "PUBLICATION.json"


class PublicationRefused(DasflowError):
    """Publication refused: incomplete or tampered release, test release as production, target not separate,
    or a different release already published under the same id."""


class OutputInvalid(DasflowError):
    """A release file failed output validation."""


def release_prefix(ctx: RunContext) -> str:
    return f"{ctx.root}/release/"


def _dumps(obj: Any) -> bytes:
    return (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()


def row_count(key: str, data: bytes) -> int:
    """Rows of a release file: data rows of a delimited table (header excluded), rows of a Parquet file,
    lines of any other text file."""
    if key.endswith(".parquet"):
        return int(pq.ParquetFile(io.BytesIO(data)).metadata.num_rows)
    lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
    if key.endswith((".csv", ".txt")):
        return max(lines - 1, 0)
    return lines


# ------------------------------------------------------------------------------------------- validation
#: rows of a delimited release file parsed at a time when it is checked
CHECK_ROWS = 1_000_000
_CHUNK = 2**20


def _check_table(key: str, fh: IO[bytes]) -> None:
    """A release table parses (chunk by chunk: memory stays flat) and its COUNT column holds integers; a
    failure names the file's row. A delimited table that Arrow reads whole with integer counts passes without
    the pandas parse (:func:`~dasflow.io.delimited.integer_counts`: the same verdict for ≈ 5× less CPU; it
    reads ``fh`` itself, synchronously, so rewinding ``fh`` for the pandas parse is safe)."""
    if not key.endswith(".parquet"):
        if integer_counts(fh):
            return
        fh.seek(0)
    try:
        if key.endswith(".parquet"):
            pf = pq.ParquetFile(fh)
            frames: Iterator[pd.DataFrame] = (pf.read_row_group(i).to_pandas() for i in range(pf.num_row_groups))
            columns = list(pf.schema_arrow.names)
        else:
            reader = pd.read_csv(fh, sep="|", dtype=str, keep_default_na=False, chunksize=CHECK_ROWS)
            frames = iter(reader)
            columns = []
        offset = 0
        for frame in frames:
            columns = list(frame.columns)
            if "COUNT" in frame.columns:
                counts = pd.to_numeric(frame["COUNT"], errors="coerce")
                bad = (counts.isna() | (counts % 1 != 0)).to_numpy()
                if bad.any():
                    row = int(bad.argmax())
                    raise OutputInvalid(f"{key}: row {offset + row + 2}, column COUNT: not an integer: "
                                        f"{frame['COUNT'].iloc[row]!r}")
            offset += len(frame)
    except OutputInvalid:
        raise
    except Exception as exc:
        raise OutputInvalid(f"{key}: unreadable table: {exc}") from None
    if not columns:
        raise OutputInvalid(f"{key}: no columns")


def _file_record(key: str, fh: IO[bytes]) -> dict[str, Any]:
    """SHA-256 and rows (:func:`row_count`) of a file, read in chunks."""
    digest = hashlib.sha256()
    newlines = size = 0
    last = b""
    while chunk := fh.read(_CHUNK):
        digest.update(chunk)
        newlines += chunk.count(b"\n")
        size += len(chunk)
        last = chunk[-1:]
    if key.endswith(".parquet"):
        fh.seek(0)
        rows = int(pq.ParquetFile(fh).metadata.num_rows)
    else:
        lines = newlines + (0 if last == b"\n" or not size else 1)
        rows = max(lines - 1, 0) if key.endswith((".csv", ".txt")) else lines
    return {"sha256": digest.hexdigest(), "rows": rows, "bytes": size}


def validate_release(ctx: RunContext) -> dict[str, dict[str, Any]]:
    """Validate every file under ``runs/{id}/release/`` (except the manifest and publication record), one file
    at a time, streamed (never every file in memory).

    Every product has files; every table parses, and a COUNT column holds integers; each product's files pass
    its plugin's production output validator (``check_release_files``, given that product's files only).
    Returns each file's SHA-256, rows and size. Raises :class:`OutputInvalid`.
    """
    store = ctx.post_store()
    prefix = release_prefix(ctx)
    keys = sorted(k for k in store.list(prefix) if k not in (prefix + MANIFEST, prefix + PUBLICATION))
    for p in ctx.config.products:
        if not any(k.startswith(f"{prefix}{p.name}/") for k in keys):
            raise OutputInvalid(f"product {p.name!r} has no release files under {prefix}{p.name}/")
    records: dict[str, dict[str, Any]] = {}
    for key in keys:
        with store.reader(key) as fh:
            records[key] = _file_record(key, fh)
            if records[key]["bytes"] == 0:
                raise OutputInvalid(f"{key}: empty file")
            if key.endswith((".csv", ".parquet", ".txt")):
                fh.seek(0)
                _check_table(key, fh)
    for p in ctx.config.products:  # each product's own production output validator (PHSafe: R16)
        plugin = ctx.plugin(p.name)
        if not overrides(plugin, "check_release_files"):
            continue
        own = f"{prefix}{p.name}/"
        try:
            plugin.check_release_files({k[len(own):]: store.get(k) for k in keys if k.startswith(own)},
                                       ctx.product_config(p.name))
        except DasflowError as exc:
            raise OutputInvalid(f"{p.name} release files: {exc}") from None
    return records


def write_release_manifest(ctx: RunContext) -> dict[str, Any]:
    """Validate the release, then write ``MANIFEST.json`` (SHA-256 and rows of every file) last."""
    records = validate_release(ctx)
    manifest = {
        "release_id": ctx.release_id, "config_sha256": ctx.config_sha256, "code_version": code_version(),
        "test_release": ctx.config.is_test, "universe": ctx.config.universe,
        "files": {k: {"sha256": r["sha256"], "rows": r["rows"]} for k, r in sorted(records.items())},
    }
    ctx.post_store().put(release_prefix(ctx) + MANIFEST, _dumps(manifest))
    return manifest


# ------------------------------------------------------------------------------------------- publication
def _location(uri: str) -> tuple[str, str]:
    """(scheme+authority, normalised path) of a store URI, for the separation check."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "file", str(Path(parsed.path if parsed.scheme else uri).resolve()).rstrip("/") + "/"
    return f"{parsed.scheme}://{parsed.netloc}", "/" + parsed.path.strip("/") + "/" if parsed.path.strip("/") \
        else "/"


def _separate(source: ObjectStore, target: ObjectStore) -> bool:
    """Neither store contains the other (so the publication can never see ``confidential/``), and an object-store
    target is in another bucket: a bucket is the unit of access policy, and the store's holds confidential data."""
    (s_host, s_path), (t_host, t_path) = _location(source.uri), _location(target.uri)
    if s_host != t_host:
        return True
    if s_host != "file":
        return False
    return not (s_path.startswith(t_path) or t_path.startswith(s_path))


def publish(ctx: RunContext, target_store_uri: str, *, test_publication: bool = False) -> dict[str, Any]:
    """Copy the release to ``target_store_uri`` under ``releases/{id}/`` (``test-releases/{id}/`` for a test
    publication) and write ``PUBLICATION.json`` there last; return that record.

    Refused (:class:`PublicationRefused`): a test release without ``test_publication=True``; a production
    release with ``test_publication=True``; a target store that contains or is inside the release's store;
    no manifest (incomplete release); a file whose bytes no longer match the manifest; a different object
    already published under the same key. Re-publishing the same release writes the same bytes.
    """
    verify_release(ctx)  # config, plan, commits, NMFs and stage manifests against the frozen chain
    if ctx.config.is_test and not test_publication:
        raise PublicationRefused(f"release {ctx.release_id} is a TEST release (seeded randomness): it can never "
                                 "be published as production; pass test_publication=True for a marked test "
                                 "publication")
    if test_publication and not ctx.config.is_test:
        raise PublicationRefused(f"release {ctx.release_id} is a production release: publish it as production")
    target = open_store(target_store_uri)
    if not _separate(ctx.store, target):
        raise PublicationRefused(f"publication target {target.uri} is not separate from the release store "
                                 f"{ctx.store.uri} (which holds the confidential inputs)")
    post = ctx.post_store()
    prefix = release_prefix(ctx)
    try:
        manifest_bytes = post.get(prefix + MANIFEST)
    except StoreError:
        raise PublicationRefused(f"release {ctx.release_id} has no {MANIFEST}: not complete") from None
    manifest = json.loads(manifest_bytes)
    if manifest.get("release_id") != ctx.release_id or manifest.get("config_sha256") != ctx.config_sha256 \
            or manifest.get("test_release") != ctx.config.is_test:
        raise PublicationRefused(f"{prefix}{MANIFEST} does not belong to this release's frozen config")
    dest = f"{'test-releases' if ctx.config.is_test else 'releases'}/{ctx.release_id}/"
    copies: dict[str, bytes] = {}
    for key, info in sorted(manifest["files"].items()):
        if not key.startswith(prefix):
            raise PublicationRefused(f"manifest lists {key!r}, outside the release")
        data = post.get(key)
        if sha256_bytes(data) != info["sha256"]:
            raise PublicationRefused(f"{key}: bytes do not match the manifest (changed after validation)")
        copies[dest + key[len(prefix):]] = data
    copies[dest + MANIFEST] = manifest_bytes
    for key, data in copies.items():
        if not target.put_if_absent(key, data) and target.sha256(key) != sha256_bytes(data):
            raise PublicationRefused(f"{target.uri}/{key} already holds different bytes: a published release is "
                                     "never overwritten")
    record = {"release_id": ctx.release_id, "config_sha256": ctx.config_sha256,
              "manifest_sha256": sha256_bytes(manifest_bytes), "kind": "test" if ctx.config.is_test else
              "production", "files": len(copies), "location": dest}
    data = _dumps(record)
    if not target.put_if_absent(dest + PUBLICATION, data) and target.get(dest + PUBLICATION) != data:
        raise PublicationRefused(f"{target.uri}/{dest}{PUBLICATION} records a different publication")
    return record
