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
import re
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore, StoreError
from dasflow.privacy.measurement import NoisyMeasurement
from dasflow.products.partition import RowRange, Tables

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


def table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    pq.write_table(table, buf, compression="lz4", row_group_size=max(16, min(1 << 16, ROW_GROUP_BYTES // per_row)))
    return buf.getvalue()


def table_from_bytes(data: bytes, rows: RowRange | None = None) -> pa.Table:
    """A Parquet table; with ``rows`` only the row groups whose statistics overlap the range, then exactly
    the rows in it."""
    pf = pq.ParquetFile(io.BytesIO(data))
    if rows is None:
        return pf.read()
    column, lo, hi = rows
    index = pf.schema_arrow.get_field_index(column)
    groups = []
    for i in range(pf.metadata.num_row_groups):
        stats = pf.metadata.row_group(i).column(index).statistics
        if stats is None or not stats.has_min_max or (stats.min <= hi and stats.max >= lo):
            groups.append(i)
    table = pf.read_row_groups(groups) if groups else pf.schema_arrow.empty_table()
    values = table.column(column)
    return table.filter(pc.and_(pc.greater_equal(values, lo), pc.less_equal(values, hi)))


class StoredParts:
    """Part outputs of one product under ``{root}/postprocessed/{product}/parts/{digest}/``.

    ``loader(keys)`` returns committed measurements by the product's keys (all when ``keys`` is None).
    """

    def __init__(self, store: ObjectStore, root: str, product: str, digest: str,
                 loader: Any) -> None:
        self.store = store
        self.product = product
        self.prefix = f"{root}/postprocessed/{product}/parts/{digest}"
        self._loader = loader
        self._cache: dict[str, NoisyMeasurement] = {}
        self._verified: dict[tuple[str, str], dict[str, Any]] = {}

    def _base(self, step: str, part: str) -> str:
        return f"{self.prefix}/{_safe(step)}/{_safe(part)}"

    def manifest_key(self, step: str, part: str) -> str:
        return self._base(step, part) + ".json"

    def done(self, step: str, part: str) -> dict[str, Any] | None:
        """The part's manifest if the part is complete and its files intact (checked once per instance)."""
        if (step, part) in self._verified:
            return self._verified[(step, part)]
        try:
            record: dict[str, Any] = json.loads(self.store.get(self.manifest_key(step, part)))
        except StoreError:
            return None
        for key, sha in record["outputs"].items():
            if not self.store.exists(key) or self.store.sha256(key) != sha:
                return None
        self._verified[(step, part)] = record
        return record

    def write(self, step: str, part: str, tables: Tables) -> dict[str, Any]:
        """Write the part's tables, then its manifest (last: a part without a manifest is not done)."""
        outputs: dict[str, str] = {}
        for name, table in sorted(tables.items()):
            key = f"{self._base(step, part)}/{_safe(name)}.parquet"
            outputs[key] = self.store.put(key, table_bytes(table))
        record = {"step": step, "part": part, "outputs": outputs,
                  "names": {f"{self._base(step, part)}/{_safe(n)}.parquet": n for n in tables}}
        self.store.put(self.manifest_key(step, part), (json.dumps(record, sort_keys=True, indent=1) + "\n").encode())
        self._verified[(step, part)] = record
        return record

    # PartSource
    def measurements(self, keys: Sequence[str] | None = None) -> Mapping[str, NoisyMeasurement]:
        wanted = None if keys is None else [k for k in keys if k not in self._cache]
        if wanted is None or wanted:
            self._cache.update(self._loader(wanted))
        if keys is None:
            return dict(self._cache)
        return {k: self._cache[k] for k in keys}

    def part(self, step: str, part: str, names: Sequence[str] | None = None,
             rows: RowRange | None = None) -> Tables:
        record = self.done(step, part)
        if record is None:
            raise InputError(f"post-processing part {step}/{part} has not been computed",
                             file=self.manifest_key(step, part))
        wanted = None if names is None else set(names)
        return {name: table_from_bytes(self.store.get(key), rows) for key, name in record["names"].items()
                if wanted is None or name in wanted}


def parts_digest(measurement_hashes: Mapping[str, str], code_version: str) -> str:
    """Directory key of a product's parts: the committed measurements and the code that post-processes them."""
    text = json.dumps({"measurements": dict(sorted(measurement_hashes.items())), "code": code_version},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
