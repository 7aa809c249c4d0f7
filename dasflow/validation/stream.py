"""Streamed input validation: a confidential input is read one chunk at a time (a partition file, or a fixed
number of rows of a file), every per-row and per-column check runs on the chunk, and only what cross-row and
cross-file rules need is kept between chunks, so peak memory follows the largest chunk, not the nation.

What is kept, per input:

* the *domain parts* of each column (distinct values in order of first appearance, or min/max/null;
  :mod:`dasflow.validation.domain`), folded chunk by chunk: the fold of consecutive chunks equals the parts of
  the whole column, so GX validates exactly the frame it validated on the whole input (same verdict, same
  report);
* per rule, a violation count and the first offending (file, row) (:class:`RowFact`): rows are global in their
  file (the chunk's ``offset`` plus its own row), never chunk-relative;
* key sets for uniqueness and foreign-key rules as sorted int64 runs (:class:`KeySet`, a log-structured merge:
  8 bytes per key, membership by binary search).

A domain failure is located by reading the failing file again up to the first occurrence of the failing value
(:func:`locate`): the second read happens only for data that failed. Fail closed as before: every check draws
no noise, and the validate stage raises the first failure before anything downstream runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.files import local_file
from dasflow.io.store import ObjectStore
from dasflow.validation import gx
from dasflow.validation.domain import Column, domain_parts, merge_parts, pad_parts
from dasflow.validation.lookup import geoid_keys

#: rows per chunk of a single large input file, when the release config does not set
#: ``validation_chunk_rows`` (≈ 100–200 MB of parsed text columns for the widest input, SafeTab-P's persons)
DEFAULT_CHUNK_ROWS = 1_000_000


@dataclass(frozen=True)
class Chunk:
    """Consecutive rows of one input file: ``file`` as errors name it, ``offset`` = data rows of that file before
    this chunk (row ``i`` of the chunk is file row ``offset + i + 2``, the header being row 1)."""

    file: str
    offset: int
    columns: Mapping[str, Column]

    @property
    def rows(self) -> int:
        return len(next(iter(self.columns.values()))) if self.columns else 0


#: a re-readable chunk stream (called again only to locate a failed value)
ChunkSource = Callable[[], Iterable[Chunk]]


def row_chunks(file: str, columns: Mapping[str, Column], chunk_rows: int, offset: int = 0) -> Iterator[Chunk]:
    """Chunks of at most ``chunk_rows`` rows over columns already in memory (slices, no copies); at least one
    chunk, so an empty file still shows its columns."""
    n = len(next(iter(columns.values()))) if columns else 0
    for start in range(0, max(n, 1), chunk_rows):  # over chunks, not records
        yield Chunk(file, offset + start, {c: v[start:start + chunk_rows] for c, v in columns.items()})


def table_chunks(file: str, batches: Iterable[pa.Table | pa.RecordBatch], chunk_rows: int) -> Iterator[Chunk]:
    """Chunks of at most ``chunk_rows`` rows from a stream of Arrow batches of one file (global offsets)."""
    offset = 0
    pending: list[pa.Table] = []
    held = 0
    seen = False
    for batch in batches:
        table = batch if isinstance(batch, pa.Table) else pa.Table.from_batches([batch])
        pending.append(table)
        held += table.num_rows
        while held >= chunk_rows:
            whole = pa.concat_tables(pending)
            head, rest = whole.slice(0, chunk_rows), whole.slice(chunk_rows)
            yield Chunk(file, offset, {c: head.column(c) for c in head.column_names})
            seen = True
            offset += chunk_rows
            pending, held = [rest], rest.num_rows
    if held or not seen:
        whole = pa.concat_tables(pending) if pending else None
        if whole is not None:
            yield Chunk(file, offset, {c: whole.column(c) for c in whole.column_names})


def _data_lines(data: bytes) -> int:
    """Non-empty lines in ``data`` (a line is counted without its newline; a line of only ``\\r`` is empty, as
    the CSV readers skip it)."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.size == 0:
        return 0
    ends = np.flatnonzero(arr == 10)
    if ends.size == 0 or ends[-1] != arr.size - 1:
        ends = np.append(ends, arr.size)  # a last line without a newline
    starts = np.concatenate([[0], ends[:-1] + 1])
    length = ends - starts
    cr_only = (length == 1) & (arr[np.minimum(starts, arr.size - 1)] == 13)
    return int(np.count_nonzero((length > 0) & ~cr_only))


def line_chunks(path: Path, chunk_rows: int, block_bytes: int = 1 << 23) -> Iterator[tuple[int, bytes, bytes]]:
    """A delimited text file as ``(offset, header, lines)``: its header line and consecutive runs of at most
    ``chunk_rows`` lines (cut at newlines, read in ``block_bytes`` blocks; newlines counted with numpy), with
    ``offset`` the non-empty data lines before the run (the file's own row numbers: row = offset + chunk row).
    At least one run, possibly empty. Memory: one run and one block."""
    with path.open("rb") as fh:
        header = fh.readline()
        offset = 0
        pending: list[bytes] = []
        held = 0
        emitted = False
        while True:
            block = fh.read(block_bytes)
            if not block:
                break
            while block:
                nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                if held + nl.size < chunk_rows:
                    pending.append(block)
                    held += int(nl.size)
                    break
                cut = int(nl[chunk_rows - held - 1]) + 1
                data = b"".join([*pending, block[:cut]])
                yield offset, header, data
                emitted = True
                offset += _data_lines(data)
                pending, held, block = [], 0, block[cut:]
        if pending or not emitted:
            yield offset, header, b"".join(pending)


def parquet_chunks(store: ObjectStore, prefix: str, columns: Sequence[str], chunk_rows: int, what: str
                   ) -> Iterator[Chunk]:
    """Every ``.parquet`` object under ``prefix`` (store order), reduced to ``columns``, in batches of at most
    ``chunk_rows`` rows, numbered as the rows of their concatenation (as ``io.files.read_parquet_records`` reads
    them whole) and labelled ``prefix``; ``InputError`` naming the prefix when there are none, or the file and
    its first missing column."""
    keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
    if not keys:
        raise InputError(f"no {what}", file=prefix)
    offset = 0
    empty: pa.Table | None = None
    for key in keys:
        f = pq.ParquetFile(local_file(store, key))
        missing = [c for c in columns if c not in f.schema_arrow.names]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}", file=key, column=missing[0])
        for chunk in table_chunks(prefix, f.iter_batches(batch_size=chunk_rows, columns=list(columns)), chunk_rows):
            yield Chunk(prefix, offset + chunk.offset, chunk.columns)
        offset += f.metadata.num_rows
        empty = f.schema_arrow.empty_table().select(list(columns))
    if offset == 0 and empty is not None:  # no rows at all: the (empty) columns, as a whole read gives them
        yield Chunk(prefix, 0, {c: empty.column(c) for c in empty.column_names})


def shifted(check: Callable[[], object], offset: int) -> None:
    """``check()``, its ``InputError`` moved to the input's own row (``offset`` rows before the chunk checked)."""
    try:
        check()
    except InputError as exc:
        if exc.row is None or exc.row <= 1 or offset == 0:
            raise
        text = str(exc)
        message = text.split(": ", 1)[1] if ": " in text else text
        raise InputError(message, file=exc.file, row=exc.row + offset, column=exc.column) from None


def first_index_of(col: Column, value: Any) -> int | None:
    """0-based index of the first occurrence of ``value`` in a column (vectorised), None if absent."""
    arr = col.to_numpy(zero_copy_only=False) if isinstance(col, pa.ChunkedArray | pa.Array) else np.asarray(col)
    try:
        hit = np.flatnonzero(pd.isna(arr) if value is None else arr == value)
    except (TypeError, ValueError):
        return None
    return int(hit[0]) if hit.size else None


def locate(source: ChunkSource, column: str, value: Any) -> tuple[str, int] | None:
    """The file and 1-based row (header = 1) of the first occurrence of ``value`` in ``column``, reading the
    chunks again only up to it."""
    for chunk in source():
        if column not in chunk.columns:
            return None
        i = first_index_of(chunk.columns[column], value)
        if i is not None:
            return chunk.file, chunk.offset + i + 2
    return None


class DistinctFold:
    """A column's distinct values over consecutive chunks, in order of first appearance — exactly what
    :func:`merge_parts` folds — at a cost per chunk that follows the chunk, not the values seen so far.

    ``merge_parts`` concatenates the distinct values seen so far with the chunk's and hashes them all again:
    with a column of national cardinality (TopDown's block GEOIDs: 8 M at 331 M persons, one chunk per million
    persons) that was ≈ 3 CPU-s per chunk late in the file, persons × blocks in all. Here a column whose chunks
    are all of one *keyed kind* — an integer dtype (each value its own int64 key), or text (strings and nulls:
    a string of exactly 15 ASCII digits keyed by its integer, ``geoid_keys``) — looks its keyed values up by
    binary search in a :class:`KeySet` (8 bytes per value), and folds the rest (other text, nulls) as before
    against the unkeyed values seen, usually few. Within one kind a keyed value equals only the values of the
    same key, so a chunk adds the same values, in the same order, as before. A chunk of another kind (mixed
    objects, another dtype) turns the column back to the plain fold of everything seen, which is exact too."""

    def __init__(self) -> None:
        self._pieces: list[pd.Series] = []
        self._mode: str | None = ""  # "": no chunk yet; "int" / "digits": keyed; None: plain fold
        self._keys = KeySet()
        self._other: pd.Series | None = None
        self._empty: pd.Series | None = None
        self._cached: pd.Series | None = None

    def add(self, values: Column) -> None:
        distinct = domain_parts({"v": values})["v"]
        if len(distinct) == 0:
            if self._empty is None:
                self._empty = distinct  # an empty column keeps its first chunk's dtype, as merge_parts does
            return
        kind, keys = _value_keys(distinct)
        if self._mode == "":
            self._mode = kind
        elif self._mode is not None and kind != self._mode:  # another kind of chunk: the plain fold from here
            self._other, self._mode, self._keys = self.series(), None, KeySet()
        keyed = keys >= 0 if self._mode == "digits" else np.full(len(distinct), self._mode == "int")
        new = np.ones(len(distinct), dtype=bool)
        if keyed.any():
            new[keyed] = ~self._keys.contains(keys[keyed])
            self._keys.add(keys[keyed & new])
        if not keyed.all():  # the unkeyed values against those seen, as merge_parts folds them
            rest = distinct[~keyed]
            before = 0 if self._other is None else len(self._other)
            both = rest.reset_index(drop=True) if self._other is None else pd.concat([self._other, rest],
                                                                                       ignore_index=True)
            dup = both.duplicated(keep="first").to_numpy()
            new[~keyed] = ~dup[before:]
            self._other = both[~dup].reset_index(drop=True)
        if new.any():
            self._pieces.append(distinct[new])
            self._cached = None

    def series(self) -> pd.Series:
        """The distinct values so far, in order of first appearance."""
        if self._cached is None:
            if not self._pieces:
                return self._empty if self._empty is not None else pd.Series([], dtype=object)
            self._cached = (pd.concat(self._pieces, ignore_index=True) if len(self._pieces) > 1 else
                            self._pieces[0].reset_index(drop=True))
        return self._cached


def _value_keys(distinct: pd.Series) -> tuple[str | None, npt.NDArray[np.int64]]:
    """The keyed kind of a chunk's distinct values and their int64 keys: ``"int"`` (a numpy integer dtype within
    int64, every value its key), ``"digits"`` (object values that are all strings or nulls: 15 ASCII digits →
    their integer, anything else −1), or None (not keyed)."""
    if not isinstance(distinct.dtype, np.dtype):  # pandas extension types (nullable Int64, string): plain fold
        return None, np.zeros(0, dtype=np.int64)
    if distinct.dtype.kind == "i" or (distinct.dtype.kind == "u" and int(distinct.max()) <= np.iinfo(np.int64).max):
        return "int", distinct.to_numpy().astype(np.int64)
    if distinct.dtype == object and pd.api.types.infer_dtype(distinct, skipna=True) in ("string", "empty"):
        return "digits", geoid_keys(pa.array(distinct, type=pa.string(), from_pandas=True))
    return None, np.zeros(0, dtype=np.int64)  # other dtypes, or objects that are not all str (bytes, numbers)


@dataclass
class SuitePart:
    """One input file's share of a streamed suite (the report lists a suite's expectations once per part, as
    when each file was validated whole): its name, its re-readable chunks and its folded domain parts (the
    distinct values of a column through :class:`DistinctFold`, extremes through :func:`merge_parts`)."""

    file: str
    source: ChunkSource
    extremes_only: frozenset[str]
    _extremes: dict[str, pd.Series] = field(default_factory=dict)
    _distinct: dict[str, DistinctFold] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)

    def add(self, chunk: Chunk) -> None:
        for name, values in chunk.columns.items():
            if name not in self._extremes and name not in self._distinct:
                self._order.append(name)
            if name in self.extremes_only:
                self._extremes = merge_parts(self._extremes, domain_parts({name: values}, self.extremes_only),
                                             self.extremes_only)
            else:
                self._distinct.setdefault(name, DistinctFold()).add(values)

    @property
    def parts(self) -> dict[str, pd.Series]:
        """Each column's folded domain part, columns in order of first appearance."""
        return {n: self._extremes[n] if n in self._extremes else self._distinct[n].series() for n in self._order}

    def frame(self) -> pd.DataFrame:
        return pad_parts(self.parts)


@dataclass
class StreamedSuite:
    """A GX suite over one or more input files read in chunks (``parts``; e.g. one per state file).

    Validated once on the union of the parts' domains: every expectation here is a property of the column set
    and of each value alone (:mod:`dasflow.validation.domain`), so it holds on every part iff it holds on the
    union, and the per-part outcomes of a passing union are the union's. Only when the union fails is each
    part validated on its own, in order, which gives exactly the rows and the first error of validating each
    file whole."""

    suite: str
    checks: Sequence[gx.Check]
    parts: list[SuitePart] = field(default_factory=list)

    def part(self, file: str, source: ChunkSource) -> SuitePart:
        """A new part (a file) of this suite."""
        p = SuitePart(file, source, frozenset(range_only(self.checks)))
        self.parts.append(p)
        return p

    def union(self) -> pd.DataFrame:
        merged: dict[str, pd.Series] = {}
        for p in self.parts:
            merged = merge_parts(merged, p.parts, p.extremes_only)
        return pad_parts(merged)


_RANGE_CHECKS = frozenset({"ExpectColumnValuesToBeBetween", "ExpectColumnValuesToNotBeNull",
                           "ExpectColumnValuesToBeOfType"})


def range_only(checks: Sequence[gx.Check]) -> set[str]:
    """Columns whose every expectation depends only on dtype, nulls and the min/max (e.g. MAFID: millions of
    distinct values, checked by ``ToBeBetween``)."""
    by_col: dict[str, set[str]] = {}
    for c in checks:
        if c.column is not None:
            by_col.setdefault(c.column, set()).add(c.expectation)
    return {col for col, kinds in by_col.items() if kinds <= _RANGE_CHECKS}


class RowFact:
    """One row-level or cross-file rule over a chunked input: its violation count and first offending row.

    ``add`` takes a chunk's violation mask; the first violation is the one of the earliest chunk, so with chunks
    in file order it is the file's first offending row (global). Recorded as :func:`products.fact` records them
    (``file`` is the file of the first violation, or the rule's own label when there is none)."""

    def __init__(self, rule: str, file: str, column: str) -> None:
        self.rule, self.file, self.column = rule, file, column
        self.violations = 0
        self.first: tuple[str, int] | None = None

    def add(self, bad: npt.ArrayLike, chunk: Chunk) -> None:
        idx = np.flatnonzero(np.asarray(bad, dtype=bool))
        self.violations += int(idx.size)
        if idx.size and self.first is None:
            self.first = (chunk.file, chunk.offset + int(idx[0]) + 2)

    def add_count(self, violations: int, first_row: int, file: str) -> None:
        """A violation count and first row already computed for one file (e.g. a whole-file rule)."""
        self.violations += violations
        if violations and self.first is None:
            self.first = (file, first_row)

    def record(self) -> dict[str, object]:
        file, row = self.first if self.first is not None else (self.file, 0)
        return {"rule": self.rule, "file": file, "column": self.column, "violations": self.violations,
                "first_row": row}


class KeySet:
    """A growing set of int64 keys held as sorted runs whose sizes at least double from the newest to the oldest
    (a log-structured merge): adding n keys costs O(n log n) in all, a membership query one binary search per
    run (O(log² n)), and memory is 8 bytes per key added (no Python objects)."""

    def __init__(self) -> None:
        self._runs: list[npt.NDArray[np.int64]] = []

    def __len__(self) -> int:
        return sum(r.size for r in self._runs)

    def add(self, keys: npt.ArrayLike) -> None:
        run = np.sort(np.asarray(keys, dtype=np.int64), kind="stable")
        while self._runs and self._runs[-1].size <= run.size:  # merge equal-or-smaller runs (sorted runs:
            run = np.sort(np.concatenate([self._runs.pop(), run]), kind="stable")  # timsort merges them in O(n))
        self._runs.append(run)

    def contains(self, keys: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        k = np.asarray(keys, dtype=np.int64)
        found = np.zeros(k.size, dtype=bool)
        for run in self._runs:
            if run.size == 0:
                continue
            pos = np.minimum(np.searchsorted(run, k), run.size - 1)
            found |= run[pos] == k
        return found

    def first_seen(self, keys: npt.ArrayLike) -> npt.NDArray[np.bool_]:
        """True on every key that occurred before (earlier in ``keys`` or in an earlier call); then adds them:
        with chunks in file order, the rows a whole-file ``duplicated(keep="first")`` marks."""
        k = np.asarray(keys, dtype=np.int64)
        dup = np.asarray(pd.Series(k).duplicated(keep="first").to_numpy(), dtype=bool) | self.contains(k)
        self.add(k)
        return dup


def suite_rows(out: gx.SuiteOutcome, copies: int) -> list[Any]:
    """The expectation rows of a passing union, once per part (see :class:`StreamedSuite`)."""
    return [r for _ in range(copies) for r in out.rows]
