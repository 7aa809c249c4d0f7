"""Writers for every product's input format. Each writer streams chunk by chunk into a staging directory.

* ``parquet``  : ``parquet/{persons,units,geo}/{SS}/part-NNNNN.parquet`` and
  ``parquet/grfc/{SS}/part-00000.parquet``
                 (canonical integer-coded schema of ``tables.py``; partitioned by state, one file per chunk).
* ``phsafe``   : ``phsafe/persons.csv``, ``units.csv``, ``geo.csv`` (pipe-delimited, header; columns and
  codes of
                 ``spec/phsafe.md`` §1.5, zero-padded string codes).
* ``phsafe_states``: the same files partitioned by state: ``phsafe_states/{SS}/persons.csv`` and
  ``phsafe_states/{SS}/units.csv`` (confidential), ``phsafe_states/geo.csv`` (public, every state) — the layout
  PHSafe's preprocessing streams one state at a time (households never span states).
* ``safetab_p``: ``safetab_p/person-records.txt`` and ``safetab_p/GRF-C.txt`` (layout of the SafeTab-P toy
  inputs;
                 GRF-C carries TABBLKGRPCE and COUSUBFP after the six standard columns).
* ``safetab_p_states``: the same records split by state: ``safetab_p_states/person-records/{SS}.txt``
  (confidential, each with the header) and ``safetab_p_states/GRF-C.txt`` (public, every state) — the split
  input SafeTab-P's preprocessing prepares one state at a time.
* ``topdown``  : ``topdown/persons/{SS}/part-NNNNN.parquet`` (block + PL 94-171 histogram attributes, 0-based:
                 HHGQ 0 household / 1-7 GQ major type, VOTINGAGE 0 under 18 / 1 18+, HISPANIC 0/1, CENRACE 0-62)
                 and ``topdown/units/{SS}/...`` (block, HHGQ, OCCUPIED); public: ``topdown/public/GRF-C.txt``,
                 ``block_facts.csv`` (GEOID|HU|GQ1..GQ7 per block) and ``invariants.json`` (total, state).
* ``groupsize``: ``groupsize/units/{SS}/part-NNNNN.parquet``: every unit (occupied, vacant = size 0, GQ)
  with its
                 block, HHGQ and SIZE (= FINAL_POP), the groups of ``spec/hierarchical-groupsize.md``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from dasflow.io.block_facts import fact_columns
from dasflow.synth import tables as tb
from dasflow.synth.geography import StateGeography
from dasflow.synth.population import Chunk
from dasflow.synth.reference import states

#: HHGQ codes of the TopDown block facts: 0 housing unit, 1-7 GQ major types
GQ_CODES = 8

#: snappy without dictionary encoding: the fastest writer setting measured (about 12 bytes/person for persons)
PARQUET_COMPRESSION = "snappy"


@dataclass
class FileRecord:
    """One written file: path relative to the dataset root, rows, bytes and SHA-256 (filled at close)."""

    path: str
    rows: int
    bytes: int = 0
    sha256: str = ""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


class Writer(Protocol):
    name: str

    def begin_state(self, geo: StateGeography) -> None: ...

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None: ...

    def close(self) -> list[FileRecord]: ...


class _Base:
    name = ""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, FileRecord] = {}

    def _record(self, rel: str, rows: int) -> None:
        rec = self.records.setdefault(rel, FileRecord(rel, 0))
        rec.rows += rows

    def _parquet(self, rel: str, table: pa.Table) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression=PARQUET_COMPRESSION, use_dictionary=False)
        self._record(rel, table.num_rows)

    def begin_state(self, geo: StateGeography) -> None:
        return None

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        raise NotImplementedError

    def close(self) -> list[FileRecord]:
        out = []
        for rec in self.records.values():
            p = self.root / rec.path
            rec.bytes = p.stat().st_size
            rec.sha256 = sha256_file(p)
            out.append(rec)
        return sorted(out, key=lambda r: r.path)


class ParquetWriter(_Base):
    name = "parquet"

    def begin_state(self, geo: StateGeography) -> None:
        self._parquet(f"parquet/grfc/{geo.state}/part-00000.parquet", tb.grfc_table(geo))

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        st = geo.state
        persons = tb.persons_table(chunk)
        persons = persons.add_column(0, "TABBLKST", tb._const_str(st, persons.num_rows))
        self._parquet(f"parquet/persons/{st}/part-{index:05d}.parquet", persons)
        units = tb.units_table(chunk)
        units = units.add_column(2, "TABBLKST", tb._const_str(st, units.num_rows))
        self._parquet(f"parquet/units/{st}/part-{index:05d}.parquet", units)
        self._parquet(f"parquet/geo/{st}/part-{index:05d}.parquet", tb.geo_table(chunk, geo))


class _CsvStreams(_Base):
    """Pipe-delimited text files with a header, appended chunk by chunk."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._writers: dict[str, tuple[pacsv.CSVWriter, pa.Schema, object]] = {}

    def _append(self, rel: str, cols: dict[str, pa.Array]) -> None:
        table = pa.table(cols)
        if rel not in self._writers:
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            sink = path.open("wb")
            sink.write(("|".join(table.column_names) + "\n").encode())
            opts = pacsv.WriteOptions(include_header=False, delimiter="|", quoting_style="none")
            self._writers[rel] = (pacsv.CSVWriter(sink, table.schema, write_options=opts), table.schema, sink)
            self._record(rel, 0)
        w, schema, _ = self._writers[rel]
        w.write_table(table.cast(schema))
        self._record(rel, table.num_rows)

    def close(self) -> list[FileRecord]:
        for w, _, sink in self._writers.values():
            w.close()
            sink.close()  # type: ignore[attr-defined]
        self._writers.clear()
        return super().close()


class PHSafeWriter(_CsvStreams):
    name = "phsafe"
    #: one ``persons.csv`` / ``units.csv`` per state folder (``phsafe_states``) instead of one for the nation
    by_state = False

    def _person_file(self, name: str, state: str) -> str:
        return f"{self.name}/{state}/{name}.csv" if self.by_state else f"{self.name}/{name}.csv"

    def begin_state(self, geo: StateGeography) -> None:
        if self.by_state:  # the previous state's files are complete: close them (bounded open files)
            for rel in [r for r in self._writers if r.count("/") == 2]:
                w, _, sink = self._writers.pop(rel)
                w.close()
                sink.close()  # type: ignore[attr-defined]

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        st = states()[geo.state]
        mafid_p = chunk.unit_mafid[chunk.person_unit]
        self._append(
            self._person_file("persons", geo.state),
            {
                "RTYPE": tb.plain(chunk.rtype),
                "MAFID": tb.plain(mafid_p),
                "QAGE": tb.plain(chunk.qage),
                "CENHISP": tb.plain(chunk.cenhisp),
                "CENRACE": tb.zfill(chunk.cenrace, 2),
                "RELSHIP": tb.zfill(chunk.relship, 2),
            },
        )
        mafid = tb.plain(chunk.unit_mafid)
        rtype = tb.plain(chunk.unit_rtype)
        self._append(
            self._person_file("units", geo.state),
            {
                "RTYPE": rtype,
                "MAFID": mafid,
                "FINAL_POP": tb.plain(chunk.unit_final_pop),
                "NPF": tb.plain(chunk.unit_npf),
                "HHSPAN": tb.plain(chunk.unit_hhspan),
                "HHRACE": tb.zfill(chunk.unit_hhrace, 2),
                "TEN": tb.plain(chunk.unit_ten),
                "HHT": tb.plain(chunk.unit_hht),
                "HHT2": tb.zfill(chunk.unit_hht2, 2),
                "CPLT": tb.plain(chunk.unit_cplt),
            },
        )
        b = tb.block_columns(geo, chunk.unit_block)
        n = chunk.n_units
        self._append(
            f"{self.name}/geo.csv",
            {
                "RTYPE": rtype,
                "MAFID": mafid,
                "TABBLKST": tb._const_str(geo.state, n),
                "TABBLKCOU": tb.zfill(b["TABBLKCOU"], 3),
                "TABTRACTCE": tb.zfill(b["TABTRACTCE"], 6),
                "TABBLK": tb.zfill(b["TABBLK"], 4),
                "TABBLKGRPCE": tb.zfill(b["TABBLKGRPCE"], 1),
                "REGIONCE": tb._const_str(str(st.region), n),
                "DIVISIONCE": tb._const_str(str(st.division), n),
                "PLACEFP": tb.zfill(b["PLACEFP"], 5),
                "AIANNHCE": tb.zfill(b["AIANNHCE"], 4),
            },
        )


class PHSafeStatesWriter(PHSafeWriter):
    """PHSafe's files partitioned by state (``phsafe_states/{SS}/persons.csv``, ``units.csv``; one national
    public ``geo.csv``): the same records as ``phsafe``, one folder per state."""

    name = "phsafe_states"
    by_state = True


def grfc_columns(geo: StateGeography) -> dict[str, pa.Array]:
    """The GRF-C rows of a state's blocks: the six standard columns, then TABBLKGRPCE and COUSUBFP."""
    b = tb.block_columns(geo, np.arange(geo.n_blocks, dtype=np.int64))
    return {
        "TABBLKST": tb._const_str(geo.state, geo.n_blocks),
        "TABBLKCOU": tb.zfill(b["TABBLKCOU"], 3),
        "TABTRACTCE": tb.zfill(b["TABTRACTCE"], 6),
        "TABBLK": tb.zfill(b["TABBLK"], 4),
        "PLACEFP": tb.zfill(b["PLACEFP"], 5),
        "AIANNHCE": tb.zfill(b["AIANNHCE"], 4),
        "TABBLKGRPCE": tb.zfill(b["TABBLKGRPCE"], 1),
        "COUSUBFP": tb.zfill(b["COUSUBFP"], 5),
    }


class SafeTabPWriter(_CsvStreams):
    name = "safetab_p"
    #: one ``person-records/{SS}.txt`` per state (``safetab_p_states``) instead of one national file
    by_state = False

    def begin_state(self, geo: StateGeography) -> None:
        if self.by_state:  # the previous state's file is complete: close it (bounded open files)
            for rel in [r for r in self._writers if r.startswith(f"{self.name}/person-records/")]:
                w, _, sink = self._writers.pop(rel)
                w.close()
                sink.close()  # type: ignore[attr-defined]
        self._append(f"{self.name}/GRF-C.txt", grfc_columns(geo))

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        pb = chunk.unit_block[chunk.person_unit]
        b = tb.block_columns(geo, pb)
        n = chunk.n_persons
        cols: dict[str, pa.Array] = {
            "QAGE": tb.zfill(chunk.qage, 3),
            "QSEX": tb.plain(chunk.qsex),
            "HOUSEHOLDER": tb.bool_str(chunk.householder),
            "TABBLKST": tb._const_str(geo.state, n),
            "TABBLKCOU": tb.zfill(b["TABBLKCOU"], 3),
            "TABTRACTCE": tb.zfill(b["TABTRACTCE"], 6),
            "TABBLK": tb.zfill(b["TABBLK"], 4),
            "CENRACE": tb.zfill(chunk.cenrace, 2),
        }
        for j in range(8):
            cols[f"QRACE{j + 1}"] = tb.zfill(chunk.qrace[j], 4, null_label="Null")
        cols["QSPAN"] = tb.zfill(chunk.qspan, 4)
        rel = f"{self.name}/person-records/{geo.state}.txt" if self.by_state else f"{self.name}/person-records.txt"
        self._append(rel, cols)


class SafeTabPStatesWriter(SafeTabPWriter):
    """SafeTab-P's person records split by state (``safetab_p_states/person-records/{SS}.txt``; one national
    public ``GRF-C.txt``): the same records as ``safetab_p``, one file per state."""

    name = "safetab_p_states"
    by_state = True


class TopDownWriter(_CsvStreams):
    """Confidential persons and units, and the public inputs a TopDown release reads (``topdown/public/``):
    the block geography, the block facts (housing units and GQ facilities per major type per block, the
    structural zeros) and the invariants (total and state populations)."""

    name = "topdown"

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._state: StateGeography | None = None
        self._facts: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._persons: dict[str, int] = {}

    def _flush_state(self) -> None:
        geo = self._state
        if geo is None:
            return
        b = tb.block_columns(geo, np.arange(geo.n_blocks, dtype=np.int64))
        geoid = pc.binary_join_element_wise(tb._const_str(geo.state, geo.n_blocks), tb.zfill(b["TABBLKCOU"], 3),
                                            tb.zfill(b["TABTRACTCE"], 6), tb.zfill(b["TABBLK"], 4), "")
        counts = self._facts.reshape(geo.n_blocks, GQ_CODES)
        cols: dict[str, pa.Array] = {"GEOID": geoid}
        for k, name in enumerate(fact_columns(GQ_CODES)):
            cols[name] = pa.array(counts[:, k])
        self._append("topdown/public/block_facts.csv", cols)
        self._state = None

    def begin_state(self, geo: StateGeography) -> None:
        self._flush_state()
        self._append("topdown/public/GRF-C.txt", grfc_columns(geo))
        self._state = geo
        self._facts = np.zeros(geo.n_blocks * GQ_CODES, dtype=np.int64)
        self._persons[geo.state] = 0

    def close(self) -> list[FileRecord]:
        self._flush_state()
        rel = "topdown/public/invariants.json"
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"total": sum(self._persons.values()),
                                    "state": dict(sorted(self._persons.items()))}, indent=1) + "\n")
        self._record(rel, len(self._persons))
        return super().close()

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        st = geo.state
        self._facts += np.bincount(chunk.unit_block.astype(np.int64) * GQ_CODES + chunk.unit_hhgq,
                                   minlength=self._facts.size)
        self._persons[st] += int(chunk.n_persons)
        pb = chunk.unit_block[chunk.person_unit]
        b = tb.block_columns(geo, pb)
        n = chunk.n_persons
        persons = pa.table(
            {
                "TABBLKST": tb._const_str(st, n),
                "TABBLKCOU": b["TABBLKCOU"],
                "TABTRACTCE": b["TABTRACTCE"],
                "TABBLK": b["TABBLK"],
                "HHGQ": chunk.unit_hhgq[chunk.person_unit],
                "VOTINGAGE": (chunk.qage >= 18).astype(np.int8),
                "HISPANIC": (chunk.cenhisp - 1).astype(np.int8),
                "CENRACE": (chunk.cenrace - 1).astype(np.int8),
            }
        )
        self._parquet(f"topdown/persons/{st}/part-{index:05d}.parquet", persons)
        ub = tb.block_columns(geo, chunk.unit_block)
        units = pa.table(
            {
                "TABBLKST": tb._const_str(st, chunk.n_units),
                "TABBLKCOU": ub["TABBLKCOU"],
                "TABTRACTCE": ub["TABTRACTCE"],
                "TABBLK": ub["TABBLK"],
                "HHGQ": chunk.unit_hhgq,
                "OCCUPIED": chunk.unit_final_pop > 0,
            }
        )
        self._parquet(f"topdown/units/{st}/part-{index:05d}.parquet", units)


class GroupSizeWriter(_Base):
    name = "groupsize"

    def write_chunk(self, chunk: Chunk, geo: StateGeography, index: int) -> None:
        st = geo.state
        ub = tb.block_columns(geo, chunk.unit_block)
        units = pa.table(
            {
                "MAFID": chunk.unit_mafid,
                "TABBLKST": tb._const_str(st, chunk.n_units),
                "TABBLKCOU": ub["TABBLKCOU"],
                "TABTRACTCE": ub["TABTRACTCE"],
                "TABBLK": ub["TABBLK"],
                "HHGQ": chunk.unit_hhgq,
                "SIZE": chunk.unit_final_pop,
            }
        )
        self._parquet(f"groupsize/units/{st}/part-{index:05d}.parquet", units)


WRITERS: dict[str, type[_Base]] = {
    "parquet": ParquetWriter,
    "phsafe": PHSafeWriter,
    "phsafe_states": PHSafeStatesWriter,
    "safetab_p": SafeTabPWriter,
    "safetab_p_states": SafeTabPStatesWriter,
    "topdown": TopDownWriter,
    "groupsize": GroupSizeWriter,
}

#: top-level entries each format creates in the dataset directory
FORMAT_ROOTS: dict[str, str] = {
    "parquet": "parquet",
    "phsafe": "phsafe",
    "phsafe_states": "phsafe_states",
    "safetab_p": "safetab_p",
    "safetab_p_states": "safetab_p_states",
    "topdown": "topdown",
    "groupsize": "groupsize",
}


def make_writers(root: Path, formats: tuple[str, ...]) -> list[_Base]:
    os.makedirs(root, exist_ok=True)
    return [WRITERS[f](root) for f in formats]
