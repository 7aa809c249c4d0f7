"""Post-processing in independent parts: the unit of scale-out.

A product whose post-processing decomposes (TopDown: level by level, the families of each state independently)
exposes it as *steps* of *parts*. Every part of a step depends only on the committed noisy measurements, the
public inputs and parts of earlier steps, so the parts of one step can run anywhere at once — threads in one
process, or tasks on a Dask cluster (``flows/release.py``). Each part writes its tables to the store itself and a
small part manifest last; a part whose manifest exists is never recomputed, so a resumed or re-mapped run picks up
where it stopped. Parts live under a directory keyed by the digest of the measurements' ledger hashes and the code
version: a part computed from other measurements or other code is never reused.

Privacy: parts are post-processing. They read the store through the view that cannot resolve confidential keys,
and only committed measurements (never drawn here), so scale-out changes where arithmetic runs, not what is spent.
Determinism: a part is a pure function of its inputs and the combine reads parts in plan order, so the release
files are byte-identical whichever runner executed the parts.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dasflow.errors import InputError, IntegrityError
from dasflow.io.store import ObjectStore, StoreError, sha256_bytes
from dasflow.privacy.measurement import NoisyMeasurement
from dasflow.products.partition import PostStep, RowRange, Tables

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _safe(name: str) -> str:
    out = _SAFE.sub("-", name).strip("-")
    if not out:
        raise InputError(f"post-processing part name {name!r} has no usable characters")
    return out


#: Target bytes per Parquet row group of a part's tables: small enough that a reader asking for a range of a
#: sorted key column (TopDown: one state's units) decodes little more than its rows, also for wide rows (a
#: detailed query group's 2,016 answers per unit).
ROW_GROUP_BYTES = 1 << 20


#: Part files up to this size are decoded on the calling thread: for the many small tables of small states
#: Arrow's thread pool costs more than the decode (≈ 0.48 → 0.34 ms CPU per read of a 6 KB table).
SMALL_PART_BYTES = 1 << 20


def table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    pq.write_table(table, buf, compression="lz4", row_group_size=max(16, min(1 << 16, ROW_GROUP_BYTES // per_row)))
    return buf.getvalue()


def table_from_bytes(data: bytes, rows: RowRange | None = None) -> pa.Table:
    """A Parquet table; with ``rows`` only the row groups whose statistics overlap the range, then exactly
    the rows in it."""
    pf = pq.ParquetFile(io.BytesIO(data))
    threads = len(data) > SMALL_PART_BYTES
    if rows is None:
        return pf.read(use_threads=threads)
    column, lo, hi = rows
    index = pf.schema_arrow.get_field_index(column)
    groups = []
    for i in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(i).column(index).statistics
        if stats is None or not stats.has_min_max or (stats.min <= hi and stats.max >= lo):
            groups.append(i)
    table = pf.read_row_groups(groups, use_threads=threads) if groups else pf.schema_arrow.empty_table()
    values = table.column(column)
    return table.filter(pc.and_(pc.greater_equal(values, lo), pc.less_equal(values, hi)))


class StoredParts:
    """Part outputs of one product under ``{root}/postprocessed/{product}/parts/{digest}/``.

    ``loader(keys)`` returns committed measurements by the product's keys (all when ``keys`` is None);
    ``segments(key)`` the segment ids of a segmented key (None: not segmented) and ``segment(key, id)`` one
    segment's measurement, read and verified when asked for and not kept.
    """

    def __init__(self, store: ObjectStore, root: str, product: str, digest: str,
                 loader: Any, segments: Callable[[str], Sequence[str] | None] | None = None,
                 segment: Callable[[str, str], NoisyMeasurement] | None = None) -> None:
        self.store = store
        self.product = product
        self.prefix = f"{root}/postprocessed/{product}/parts/{digest}"
        self._loader = loader
        self._segments = segments
        self._segment = segment
        self._cache: dict[str, NoisyMeasurement] = {}
        self._verified: dict[tuple[str, str], dict[str, Any]] = {}
        self._checked: set[str] = set()  # part files whose bytes matched their manifest's SHA-256

    def _base(self, step: str, part: str) -> str:
        return f"{self.prefix}/{_safe(step)}/{_safe(part)}"

    def manifest_key(self, step: str, part: str) -> str:
        return self._base(step, part) + ".json"

    def done(self, step: str, part: str) -> dict[str, Any] | None:
        """The part's manifest if the part is complete: the manifest (written last) and every file it lists
        exist (looked up once per instance). The files' content is checked against the manifest's SHA-256 when
        a reader reads them (:meth:`part`), so a task verifies the bytes it uses — its own subtree's tables of a
        national step — rather than hashing every file of every input part first."""
        if (step, part) in self._verified:
            return self._verified[(step, part)]
        try:
            record: dict[str, Any] = json.loads(self.store.get(self.manifest_key(step, part)))
        except StoreError:
            return None
        if not all(self.store.exists(key) for key in record["outputs"]):
            return None
        self._verified[(step, part)] = record
        return record

    def _read(self, key: str, sha256: str) -> bytes:
        """A part file's bytes, checked against the SHA-256 its part manifest records (once per instance): a
        changed file fails loudly; it is never silently used, nor recomputed over."""
        data = self.store.get(key)
        if key not in self._checked:
            if sha256_bytes(data) != sha256:
                raise IntegrityError(f"{self.store.uri}/{key}: does not match the SHA-256 its part manifest "
                                     "records (changed after it was written); delete the part's manifest to "
                                     "recompute it")
            self._checked.add(key)
        return data

    def write(self, step: str, part: str, tables: Tables) -> dict[str, Any]:
        """Write the part's tables, then its manifest (last: a part without a manifest is not done)."""
        # the tables at once (a local store overlaps their fsyncs), all written before the manifest
        outputs = self.store.put_many({f"{self._base(step, part)}/{_safe(name)}.parquet": table_bytes(table)
                                       for name, table in sorted(tables.items())})
        record = {"step": step, "part": part, "outputs": outputs,
                  "names": {f"{self._base(step, part)}/{_safe(n)}.parquet": n for n in tables}}
        self.store.put(self.manifest_key(step, part), (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())
        self._verified[(step, part)] = record
        self._checked.update(outputs)
        return record

    def drop_measurements(self) -> None:
        """Forget the measurements loaded so far (a worker keeps no NMFs between tasks)."""
        self._cache.clear()

    # PartSource
    def measurements(self, keys: Sequence[str] | None = None) -> Mapping[str, NoisyMeasurement]:
        wanted = None if keys is None else [k for k in keys if k not in self._cache]
        if wanted is None or wanted:
            self._cache.update(self._loader(wanted))
        if keys is None:
            return dict(self._cache)
        return {k: self._cache[k] for k in keys}

    def measurement_segments(self, key: str) -> Sequence[str] | None:
        return None if self._segments is None else self._segments(key)

    def measurement_segment(self, key: str, segment: str) -> NoisyMeasurement:
        if self._segment is None:
            raise InputError(f"{self.product}: measurement {key} is not segmented")
        return self._segment(key, segment)

    def part(self, step: str, part: str, names: Sequence[str] | None = None,
             rows: RowRange | None = None) -> Tables:
        record = self.done(step, part)
        if record is None:
            raise InputError(f"post-processing part {step}/{part} has not been computed",
                             file=self.manifest_key(step, part))
        wanted = None if names is None else set(names)
        return {name: table_from_bytes(self._read(key, record["outputs"][key]), rows)
                for key, name in record["names"].items() if wanted is None or name in wanted}


def parts_digest(measurement_hashes: Mapping[str, str], code_version: str) -> str:
    """Directory key of a product's parts: the committed measurements and the code that post-processes them."""
    text = json.dumps({"measurements": dict(sorted(measurement_hashes.items())), "code": code_version},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


#: One task's work: (step, part) pairs run in this order in one process.
Batch = list[tuple[str, str]]


def task_waves(steps: Sequence[PostStep], slots: int) -> list[list[Batch]]:
    """Group a product's parts into tasks: waves run one after another, the batches of a wave at once.

    * Consecutive single-part steps form one wave of one batch (each reads everything before it anyway).
    * A multi-part step and the ``chained`` steps after it form one wave of *chains*: part p's parts of those
      steps in step order (part p of a chained step reads, of the previous step, only part p).
    * The chains of a wave are packed into ``max(slots, ⌈work / batch_weight⌉)`` batches (never more than the
      chains; one chain per batch when the steps give no ``batch_weight``), heaviest chain first onto the
      lightest batch (LPT), so each worker slot has work and each task's compute outweighs its fixed cost.
      Work is the steps' public ``weights`` (1 per part if absent). Chains of one of the steps' ``groups`` (a
      chain's group: its part's first one given) are packed together, as one unit of their summed work, so a
      task reads the input they share once.

    Grouping changes where and in which order parts run, never what a part computes (a part is a pure
    function of its inputs), so the release bytes do not depend on it.
    """
    waves: list[list[Batch]] = []
    i = 0
    while i < len(steps):
        step = steps[i]
        if len(step.parts) == 1 and not step.chained:
            seq: Batch = []
            while i < len(steps) and len(steps[i].parts) == 1 and not steps[i].chained:
                seq.append((steps[i].name, steps[i].parts[0]))
                i += 1
            waves.append([seq])
            continue
        chains: dict[str, Batch] = {}
        work: dict[str, float] = {}
        group: dict[str, str] = {}
        target = step.batch_weight
        while True:
            weights = steps[i].weights or (1.0,) * len(steps[i].parts)
            groups = steps[i].groups or (None,) * len(steps[i].parts)
            for part, w, g in zip(steps[i].parts, weights, groups, strict=True):
                chains.setdefault(part, []).append((steps[i].name, part))
                work[part] = max(work.get(part, 0.0), w)
                if g is not None:
                    group.setdefault(part, g)
            i += 1
            if i >= len(steps) or not steps[i].chained:
                break
        waves.append(_pack(list(chains.values()), [work[p] for p in chains], slots, target,
                           [group.get(p, f"part:{p}") for p in chains]))
    return waves


def _pack(chains: list[Batch], work: list[float], slots: int, target: float | None,
          groups: Sequence[str] | None = None) -> list[Batch]:
    """LPT packing of chains, a group's chains as one unit (plan order kept inside a batch; batches heaviest
    first)."""
    if target is None or target <= 0:
        return chains
    names = list(range(len(chains))) if groups is None else groups
    units: dict[object, list[int]] = {}
    for c, g in enumerate(names):
        units.setdefault(g, []).append(c)
    members_of = list(units.values())
    unit_work = [sum(work[c] for c in m) for m in members_of]
    n = min(len(members_of), max(1, slots, math.ceil(sum(work) / target)))
    loads = [0.0] * n
    members: list[list[int]] = [[] for _ in range(n)]
    for u in sorted(range(len(members_of)), key=lambda u: (-unit_work[u], members_of[u][0])):
        b = min(range(n), key=lambda b: (loads[b], b))
        loads[b] += unit_work[u]
        members[b].extend(members_of[u])
    order = sorted(range(n), key=lambda b: (-loads[b], b))
    return [[pair for c in sorted(members[b]) for pair in chains[c]] for b in order]
