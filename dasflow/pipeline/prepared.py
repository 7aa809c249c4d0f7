"""Prepared frames in the store: written whole or one partition at a time, read back one name at a time.

A product whose plugin declares preprocessing partitions (``ProductPlugin.partitions``) is prepared partition by
partition: each partition's frames go under ``runs/{id}/prepared/{product}/part={p}/`` with a part manifest
written last, so a resumed preprocess skips the partitions already done and the process holds one partition's
records at a time. The measure stage reads a prepared frame by name (:class:`PartitionedPrepared`): the frames of
that name in every partition, combined by the plugin (``combine_prepared``: tabulations add up across disjoint
partitions), never every name at once.

Privacy: nothing here draws noise or changes a value. The combined frame equals the frame ``prepare`` gives on
the whole input (the plugin's promise, tested per product), so the measurement sees the same exact counts and
the plan's sensitivities hold unchanged. Everything written stays under ``prepared/``, which the
post-processing store view cannot resolve.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import IO, Any, Protocol

import pandas as pd
import pyarrow.parquet as pq

from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import ObjectStore, StoreError

#: a partition id is one path segment of the store
PART_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

Combine = Callable[[str, Sequence[pd.DataFrame]], pd.DataFrame]


def put_frames(store: ObjectStore, prefix: str, frames: Mapping[str, pd.DataFrame]) -> dict[str, dict[str, Any]]:
    """Write each frame as ``{prefix}{name}.parquet`` (names in sorted order); the outputs of a manifest."""
    outputs: dict[str, dict[str, Any]] = {}
    for name, frame in sorted(frames.items()):
        key = f"{prefix}{name}.parquet"
        sha, rows = store.put_parquet(key, frame)
        outputs[key] = {"sha256": sha, "rows": rows, "name": name}
    return outputs


def part_prefix(root: str, product: str, part: str) -> str:
    """Where one partition's prepared frames live: ``{root}/prepared/{product}/part={part}/``."""
    if not PART_ID.fullmatch(part):
        raise InputError(f"{product}: partition id {part!r} is not one path segment of letters, digits, '_.-'")
    return f"{root}/prepared/{product}/part={part}/"


def done_part(store: ObjectStore, prefix: str, binding: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The outputs of a partition prepared for this ``binding`` (input hashes, code version, config) whose files
    are intact; None if it must be (re)done."""
    try:
        record = json.loads(store.get(f"{prefix}manifest.json"))
    except (StoreError, ValueError):
        return None
    if record.get("binding") != dict(binding):
        return None
    outputs: dict[str, dict[str, Any]] = record.get("outputs", {})
    for key, out in outputs.items():
        if not key.startswith(prefix) or not store.exists(key) or store.sha256(key) != out.get("sha256"):
            return None
    return outputs


def prepare_partitions(store: ObjectStore, root: str, product: str, parts: Sequence[str],
                       binding: Mapping[str, Any], prepare: Callable[[str], Mapping[str, pd.DataFrame]],
                       after_part: Callable[[str], None] = lambda part: None) -> tuple[dict[str, dict[str, Any]], int]:
    """Prepare every partition not yet done, one at a time, and write its frames and part manifest (last).

    ``prepare(part)`` reads one partition's records and returns its prepared frames; they are written and
    dropped before the next partition is read, so peak memory is that of the largest partition. Returns the
    outputs of all partitions (each tagged with its ``part``) and how many partitions were computed now;
    ``after_part`` runs after each part manifest (crash points in tests)."""
    if len(set(parts)) != len(parts):
        raise InputError(f"{product}: duplicate partition ids")
    outputs: dict[str, dict[str, Any]] = {}
    computed = 0
    for part in parts:
        prefix = part_prefix(root, product, part)
        done = done_part(store, prefix, binding)
        if done is None:
            done = put_frames(store, prefix, prepare(part))
            record = {"product": product, "part": part, "binding": dict(binding), "outputs": done}
            store.put(f"{prefix}manifest.json", (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())
            computed += 1
            after_part(part)
        outputs.update({key: {**out, "part": part} for key, out in done.items()})
    return outputs, computed


class _Reads(Protocol):
    def get_parquet(self, key: str) -> pd.DataFrame: ...

    def reader(self, key: str) -> IO[bytes]: ...


class VerifiedReads:
    """Reads of prepared objects, each checked against the SHA-256 its preprocess manifest records the first time
    it is read here (``IntegrityError`` naming it otherwise): a reader that uses a few partitions verifies those,
    not every partition of the product."""

    def __init__(self, store: ObjectStore, expected: Mapping[str, str]) -> None:
        self._store = store
        self._expected = expected
        self._checked: set[str] = set()

    def _check(self, key: str) -> None:
        if key in self._checked:
            return
        try:
            ok = self._store.sha256(key) == self._expected.get(key)
        except StoreError:
            ok = False
        if not ok:
            raise IntegrityError(f"{self._store.uri}/{key}: missing, or does not match the SHA-256 its preprocess "
                                 "manifest records (tampered or corrupt); run preprocess again")
        self._checked.add(key)

    def get_parquet(self, key: str) -> pd.DataFrame:
        self._check(key)
        return self._store.get_parquet(key)

    def reader(self, key: str) -> IO[bytes]:
        self._check(key)
        return self._store.reader(key)


class PartitionedPrepared(Mapping[str, pd.DataFrame]):
    """The prepared frames of a partitioned preprocess, read by name: ``self[name]`` loads that name's frame of
    every partition (in partition order) and combines them; the last frame read is kept, and combined frames of
    at most ``SMALL_BYTES`` (public domains a measurement re-reads between its counts) stay cached."""

    #: combined frames up to this size (deep memory) stay cached, up to ``SMALL_BYTES`` in all
    SMALL_BYTES = 64 << 20

    def __init__(self, store: ObjectStore | _Reads, parts: Sequence[str], outputs: Mapping[str, Mapping[str, Any]],
                 combine: Combine) -> None:
        order = {p: i for i, p in enumerate(parts)}
        keys: dict[str, list[tuple[int, str]]] = {}
        for key, out in outputs.items():
            keys.setdefault(str(out["name"]), []).append((order[str(out["part"])], key))
        self._keys = {name: [k for _, k in sorted(found)] for name, found in sorted(keys.items())}
        self._by_part: dict[str, dict[str, str]] = {}
        for key, out in outputs.items():
            self._by_part.setdefault(str(out["part"]), {})[str(out["name"])] = key
        self._store = store
        self._combine = combine
        self._last: tuple[str, pd.DataFrame] | None = None
        self._small: dict[str, pd.DataFrame] = {}
        self._small_bytes = 0

    def __getitem__(self, name: str) -> pd.DataFrame:
        if self._last is not None and self._last[0] == name:
            return self._last[1]
        if name in self._small:
            return self._small[name]
        keys = self._keys[name]  # KeyError for a name no partition holds
        frame = self._combine(name, [self._store.get_parquet(k) for k in keys])
        self._last = (name, frame)
        size = int(frame.memory_usage(deep=True).sum())
        if self._small_bytes + size <= self.SMALL_BYTES:
            self._small[name] = frame
            self._small_bytes += size
        return frame

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def rows(self, name: str, column: str, low: int, high: int) -> pd.DataFrame:
        """The rows of ``name`` with ``low <= column < high`` (an integer column), combined over the partitions:
        each partition's Parquet row groups whose statistics miss the range are not read, so a segment of
        regions reads only the partitions (states) holding it, one row group at a time."""
        found = []
        empty: pd.DataFrame | None = None
        for key in self._keys[name]:  # KeyError for a name no partition holds
            with self._store.reader(key) as fh:
                pf = pq.ParquetFile(fh)
                if empty is None:
                    empty = pf.schema_arrow.empty_table().to_pandas()
                index = pf.schema_arrow.get_field_index(column)
                for i in range(pf.metadata.num_row_groups):
                    stats = pf.metadata.row_group(i).column(index).statistics
                    if stats is not None and stats.has_min_max and (stats.max < low or stats.min >= high):
                        continue
                    frame = pf.read_row_group(i).to_pandas()
                    values = frame[column].to_numpy()
                    found.append(frame[(values >= low) & (values < high)].reset_index(drop=True))
        if found:
            return self._combine(name, found)
        assert empty is not None  # a name has at least one partition's frame
        return empty

    def partitions(self, parts: Sequence[str]) -> Mapping[str, pd.DataFrame]:
        """The frames of some partitions, each name combined over them when read (partition ids the preprocess
        did not have hold nothing): a segmented measurement reads only its segment's partitions' counts."""
        if set(self._by_part) <= set(parts):
            return self  # every partition: the combined frames, with their cache
        keys: dict[str, list[str]] = {}
        for part in parts:
            for name, key in self._by_part.get(part, {}).items():
                keys.setdefault(name, []).append(key)
        return _PartFrames(self._store, keys, self._combine)

    def __len__(self) -> int:
        return len(self._keys)


class _PartFrames(Mapping[str, pd.DataFrame]):
    """Some partitions' prepared frames by name, each read from the store and combined when used (the last one
    kept)."""

    def __init__(self, store: ObjectStore | _Reads, keys: Mapping[str, Sequence[str]], combine: Combine) -> None:
        self._store = store
        self._keys = dict(sorted(keys.items()))
        self._combine = combine
        self._last: tuple[str, pd.DataFrame] | None = None

    def __getitem__(self, name: str) -> pd.DataFrame:
        if self._last is None or self._last[0] != name:
            keys = self._keys[name]
            frames = [self._store.get_parquet(k) for k in keys]
            self._last = (name, frames[0] if len(frames) == 1 else self._combine(name, frames))
        return self._last[1]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)
