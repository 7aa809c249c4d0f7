"""Reading and validating the private person records and the public GRF-C, then encoding them to integer
arrays.

Everything is vectorised (pyarrow/numpy); the first offending row of each check is reported with file, row
(1-based, header = row 1) and column. Validation completes before any noise can be drawn: :func:`encode_persons`
is called by ``prepare`` and raises :class:`~dasflow.errors.InputError` on the first violation.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dasflow.errors import InputError, IntegrityError
from dasflow.io.arrays import unique
from dasflow.io.files import arrow_reason
from dasflow.products.safetab_p.iterations import IterationIndex
from dasflow.products.safetab_p.regions import PR_STATE_FIPS, Universe, base_type, region_types
from dasflow.validation.stream import Chunk, table_chunks

PERSON_FILE = "person-records.txt"
GRFC_FILE = "GRF-C.txt"
RACE_COLUMNS = tuple(f"QRACE{i}" for i in range(1, 9))
PERSON_COLUMNS = ("QAGE", "QSEX", "HOUSEHOLDER", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "CENRACE",
                  *RACE_COLUMNS, "QSPAN")
GRFC_COLUMNS = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "PLACEFP", "AIANNHCE")
MAX_AGE = 115
NULL = "Null"

IntArray = npt.NDArray[np.int64]


def _arrow_row(exc: BaseException) -> int | None:
    """The 1-based file row (header = row 1) a pyarrow CSV error names, when it names one."""
    match = re.search(r"[Rr]ow #?(\d+)", str(exc))
    return int(match.group(1)) if match else None


def read_pipe_file(path: str | Path, columns: Sequence[str], *, extra_columns: bool = False) -> pa.Table:
    """Read a pipe-delimited file with a header, every column as a string.

    The header is checked exactly, or with ``extra_columns`` (GRF-C: the production file carries many more
    geography columns than SafeTab-P uses) every required column must be present and only those are kept."""
    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", file=str(p))
    try:
        table = pacsv.read_csv(
            p, parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in columns},
                                                 strings_can_be_null=False))
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise InputError(f"malformed pipe-delimited file: {arrow_reason(exc)}", file=str(p),
                         row=_arrow_row(exc)) from None
    got = tuple(table.column_names)
    if extra_columns:
        missing = [c for c in columns if c not in got]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)} (header: {'|'.join(got)})", file=str(p),
                             row=1, column=missing[0])
        return table.select(list(columns))
    if got != tuple(columns):
        raise InputError(f"header must be {'|'.join(columns)}, got {'|'.join(got)}", file=str(p), row=1)
    return table


def pipe_chunks(path: str | Path, name: str, chunk_rows: int) -> Iterator[Chunk]:
    """One person-records file parsed incrementally (pyarrow's streaming CSV reader, 4 MB blocks, options as
    ``read_pipe_file``: pipe, no quoting, every column text) in chunks of at most ``chunk_rows`` rows, numbered as
    the whole-file reader numbers them; a malformed file is handed to ``read_pipe_file``, whose error (file, row,
    reason) is the authoritative one. The validate stage reads person-records files through it, and so does
    preprocessing (a large state's file is then held one chunk at a time, not whole)."""
    try:
        reader = pacsv.open_csv(
            path, read_options=pacsv.ReadOptions(block_size=1 << 22),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in PERSON_COLUMNS},
                                                 strings_can_be_null=False))
        bad_header = tuple(reader.schema.names) != PERSON_COLUMNS
        chunks = None if bad_header else table_chunks(name, reader, chunk_rows)
        seen = False
        while chunks is not None:
            chunk = next(chunks, None)
            if chunk is None:
                if not seen:  # a header-only file: its (empty) columns
                    yield Chunk(name, 0, {c: pa.chunked_array([], pa.string()) for c in PERSON_COLUMNS})
                return
            seen = True
            yield chunk
    except (pa.ArrowInvalid, UnicodeDecodeError):
        pass
    read_pipe_file(path, PERSON_COLUMNS)  # raises the whole-file reader's error
    raise InputError("malformed pipe-delimited file", file=str(path))


def slice_states(column: pa.ChunkedArray | pa.Array) -> tuple[int, ...]:
    """The distinct 2-digit TABBLKST codes of a slice's (text) column, ascending; a value of another form is
    left to :func:`encode_persons`, which refuses it."""
    codes = pc.unique(column).to_pylist()
    return tuple(sorted(int(c) for c in codes if isinstance(c, str) and re.fullmatch(r"[0-9]{2}", c)))


def _first_bad(mask: pa.ChunkedArray | pa.Array | npt.NDArray[np.bool_], col: pa.ChunkedArray, what: str,
               source: str, column: str, offset: int = 0) -> None:
    """InputError at the first True of ``mask``: file row = offset + index + 2 (header = row 1; ``offset`` =
    rows of the file before this slice)."""
    arr = mask if isinstance(mask, np.ndarray) else mask.to_numpy(zero_copy_only=False)
    m = np.asarray(arr, dtype=bool)
    if m.any():
        i = int(np.flatnonzero(m)[0])
        raise InputError(what, file=source, row=offset + i + 2, column=column)  # the value is confidential


def _digits(table: pa.Table, column: str, width: int, source: str) -> None:
    col = table.column(column)
    _first_bad(pc.invert(pc.match_substring_regex(col, rf"^\d{{{width}}}$")), col,
               f"must be {width} digits", source, column)


@dataclass(frozen=True)
class Geography:
    """The public GRF-C of one run: per block its region index for each region type, and each region type's
    IDs.

    ``block_keys`` are the numeric 15-digit block IDs (state+county+tract+block); ``region_of[rt][b]`` is the index of
    block b's region of type rt in ``region_ids[rt]`` (−1: the block is in no region of that type, e.g. PLACEFP
    99999 or AIANNHCE 9999).
    """

    universe: Universe
    block_keys: IntArray
    region_ids: dict[str, npt.NDArray[np.object_]]
    region_of: dict[str, IntArray]
    source: str

    @cached_property
    def _sorted_blocks(self) -> tuple[IntArray, IntArray]:
        order = np.argsort(self.block_keys, kind="stable").astype(np.int64)
        return order, self.block_keys[order]

    def block_index(self, keys: IntArray) -> IntArray:
        """Row of each block key in this geography (−1 where the block is not in it); vectorised (the sort of
        the block keys is computed once per geography, not once per call: partitions reuse it)."""
        order, sorted_keys = self._sorted_blocks
        if len(sorted_keys) == 0:
            return np.full(len(keys), -1, dtype=np.int64)
        codes, uniq = pd.factorize(keys, sort=False)  # persons share blocks: search each distinct block once
        uniq = np.asarray(uniq, dtype=np.int64)
        at = np.minimum(np.searchsorted(sorted_keys, uniq), len(sorted_keys) - 1)
        found = np.where(sorted_keys[at] == uniq, order[at], -1).astype(np.int64)
        return found[codes]


def block_key(table: pa.Table) -> IntArray:
    """state(2)+county(3)+tract(6)+block(4) digits as one int64 (columns already validated as digits)."""
    key = np.zeros(table.num_rows, dtype=np.int64)
    for col, scale in (("TABBLKST", 1), ("TABBLKCOU", 1000), ("TABTRACTCE", 1_000_000), ("TABBLK", 10_000)):
        key = key * scale + pc.cast(table.column(col), pa.int64()).to_numpy()
    return key


def _run_states(st: IntArray, universe: Universe, state_filter: Sequence[str]) -> npt.NDArray[np.bool_]:
    if universe == "PR":
        return np.asarray(st == int(PR_STATE_FIPS))
    if state_filter:
        return np.isin(st, [int(s) for s in state_filter])
    return np.asarray(st != int(PR_STATE_FIPS))


#: digits of a region ID per base region type (every ID of a type has this width, so its order as text is its
#: order as an integer)
_ID_WIDTH = {"USA": 1, "STATE": 2, "COUNTY": 5, "TRACT": 11, "PLACE": 7, "AIANNH": 4}


def _digit_columns(table: pa.Table) -> dict[str, IntArray]:
    """The GRF-C's geography columns (already checked as digits) as int64."""
    return {c: pc.cast(table.column(c), pa.int64()).to_numpy() for c in GRFC_COLUMNS}


def _region_codes(cols: dict[str, IntArray], rt: str) -> tuple[IntArray, npt.NDArray[np.bool_]]:
    """Each GRF-C row's region ID of type ``rt`` as an integer (its digits: state+county for a county, …) and
    whether the block is in a region of that type (PLACEFP 99999 and AIANNHCE 9999 are none)."""
    bt = base_type(rt)
    st = cols["TABBLKST"]
    if bt == "USA":
        return np.ones(st.size, dtype=np.int64), np.ones(st.size, dtype=bool)
    if bt == "STATE":
        return st, np.ones(st.size, dtype=bool)
    county = st * 1000 + cols["TABBLKCOU"]
    if bt == "COUNTY":
        return county, np.ones(st.size, dtype=bool)
    if bt == "TRACT":
        return county * 1_000_000 + cols["TABTRACTCE"], np.ones(st.size, dtype=bool)
    if bt == "PLACE":
        return st * 100_000 + cols["PLACEFP"], cols["PLACEFP"] != 99999
    return cols["AIANNHCE"], cols["AIANNHCE"] != 9999  # AIANNH


def _region_text(codes: IntArray, rt: str) -> npt.NDArray[np.object_]:
    """Integer region IDs of type ``rt`` as their text (zero-padded to the type's width), as Python strings."""
    width = _ID_WIDTH[base_type(rt)]
    text = np.asarray(codes, dtype=np.int64).astype(f"U{width}")
    return (np.char.zfill(text, width) if text.size else text).astype(object)


def _check_digits(table: pa.Table, source: str, offset: int = 0) -> None:
    """Every geography column of a GRF-C table (or of rows ``offset``.. of it) is digits of its width."""
    for col, width in (("TABBLKST", 2), ("TABBLKCOU", 3), ("TABTRACTCE", 6), ("TABBLK", 4), ("PLACEFP", 5),
                       ("AIANNHCE", 4)):
        column = table.column(col)
        _first_bad(pc.invert(pc.match_substring_regex(column, rf"^\d{{{width}}}$")), column,
                   f"must be {width} digits", source, col, offset)


def load_geography(table: pa.Table, universe: Universe, state_filter: Sequence[str],
                   source: str) -> Geography:
    """Validate the GRF-C and build the region domains of one run (from public geography only)."""
    _check_digits(table, source)
    cols = _digit_columns(table)
    key = block_key(table)
    _first_bad(pd.Series(key).duplicated().to_numpy(), table.column("TABBLK"), "duplicate block", source,
               "TABBLK")
    keep = _run_states(cols["TABBLKST"], universe, state_filter)
    cols = {c: v[keep] for c, v in cols.items()}
    key = key[keep]
    region_ids: dict[str, npt.NDArray[np.object_]] = {}
    region_of: dict[str, IntArray] = {}
    for rt in region_types(universe):
        code, inside = _region_codes(cols, rt)
        ids = unique(code[inside])
        idx = np.full(key.size, -1, dtype=np.int64)
        idx[inside] = np.searchsorted(ids, code[inside])
        region_ids[rt] = _region_text(ids, rt)
        region_of[rt] = idx
    return Geography(universe, key, region_ids, region_of, source)


#: GRF-C rows per streamed batch (the bytes pyarrow parses at a time are set by ``GRFC_BLOCK_BYTES``)
GRFC_BLOCK_BYTES = 8 << 20


def stream_grfc(path: str | Path) -> Iterator[tuple[int, pa.Table]]:
    """The GRF-C's required columns (strings) in batches, each with the file rows before it: the header is
    checked as :func:`read_pipe_file` checks it (``extra_columns``), one batch is held at a time."""
    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", file=str(p))
    with p.open("rb") as fh:
        header = fh.readline().decode("utf-8", errors="replace").rstrip("\r\n").split("|")
    missing = [c for c in GRFC_COLUMNS if c not in header]
    if missing:
        raise InputError(f"missing column(s) {', '.join(missing)} (header: {'|'.join(header)})", file=str(p),
                         row=1, column=missing[0])
    offset = 0
    try:
        reader = pacsv.open_csv(
            p, read_options=pacsv.ReadOptions(block_size=GRFC_BLOCK_BYTES),
            parse_options=pacsv.ParseOptions(delimiter="|", quote_char=False),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in header},
                                                 include_columns=list(GRFC_COLUMNS), strings_can_be_null=False))
        for batch in reader:  # over batches of ~8 MB, not records
            table = pa.Table.from_batches([batch])
            yield offset, table
            offset += table.num_rows
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise InputError(f"malformed pipe-delimited file: {arrow_reason(exc)}", file=str(p),
                         row=_arrow_row(exc)) from None


def grfc_region_ids(path: str | Path, universe: Universe,
                    state_filter: Sequence[str]) -> dict[str, npt.NDArray[np.object_]]:
    """The region IDs of every region type of one run (those :func:`load_geography` gives), from one streamed
    pass over the GRF-C: the national domain, without holding a row per block."""
    found: dict[str, list[IntArray]] = {rt: [] for rt in region_types(universe)}
    for offset, table in stream_grfc(path):
        _check_digits(table, str(path), offset)
        cols = _digit_columns(table)
        keep = _run_states(cols["TABBLKST"], universe, state_filter)
        cols = {c: v[keep] for c, v in cols.items()}
        for rt, ids in found.items():
            code, inside = _region_codes(cols, rt)
            ids.append(unique(code[inside]))
    return {rt: _region_text(unique(np.concatenate(ids)) if ids else np.zeros(0, dtype=np.int64), rt)
            for rt, ids in found.items()}


#: a block's region index in :class:`_BlockIndex` when its region is not in the run's domain
_NOT_IN_DOMAIN = -2


@dataclass(frozen=True)
class _BlockIndex:
    """:attr:`LazyGeography._blocks`: one entry per GRF-C row, in file order."""

    key: IntArray
    state: npt.NDArray[np.int8]
    kept: npt.NDArray[np.bool_]
    region_of: dict[str, npt.NDArray[np.int32]]


class LazyGeography(Geography):
    """A run's geography whose region IDs (the national domain the plan needs) come from one streamed pass and
    whose block rows are read only when first used (validation, an unpartitioned prepare); a partition reads
    its own states' blocks instead (:meth:`part`)."""

    def __init__(self, path: str | Path, universe: Universe, state_filter: Sequence[str]) -> None:
        for name, value in (("universe", universe), ("source", str(path)), ("_state_filter", tuple(state_filter)),
                            ("region_ids", grfc_region_ids(path, universe, state_filter))):
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name not in ("block_keys", "region_of"):
            raise AttributeError(name)
        whole = load_geography(read_pipe_file(self.source, GRFC_COLUMNS, extra_columns=True), self.universe,
                               self._state_filter, self.source)
        object.__setattr__(self, "block_keys", whole.block_keys)
        object.__setattr__(self, "region_of", whole.region_of)
        return getattr(whole, name)

    @cached_property
    def _blocks(self) -> _BlockIndex:
        """Every GRF-C row's block key and state, whether the run keeps it, and its region index per region type
        (int32: −1 outside any region of the type or not kept, ``_NOT_IN_DOMAIN`` where its region is missing
        from :attr:`region_ids`), in file order, from one streamed pass (digits checked again, naming the file's
        row). Public geography only, ≈ 34 bytes a block (≈ 270 MB for the nation's 8.1 M blocks): the partitions
        of one preprocess select their states' rows from it instead of each re-reading the national GRF-C."""
        keys: list[IntArray] = []
        kept: list[npt.NDArray[np.bool_]] = []
        region_of: dict[str, list[npt.NDArray[np.int32]]] = {rt: [] for rt in self.region_ids}
        ids = {rt: v.astype(np.int64) for rt, v in self.region_ids.items()}  # digit strings of one width each
        for offset, table in stream_grfc(self.source):  # over batches of ~8 MB, not records
            _check_digits(table, self.source, offset)
            cols = _digit_columns(table)
            keep = _run_states(cols["TABBLKST"], self.universe, self._state_filter)
            keys.append(block_key(table))
            kept.append(keep)
            for rt, known_ids in ids.items():
                code, inside = _region_codes(cols, rt)
                inside = inside & keep
                idx = np.full(keep.size, -1, dtype=np.int32)
                at = np.searchsorted(known_ids, code[inside])
                found = at < known_ids.size
                found[found] = known_ids[at[found]] == code[inside][found]
                idx[inside] = np.where(found, at, _NOT_IN_DOMAIN)
                region_of[rt].append(idx)
        key = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        return _BlockIndex(key, (key // 10 ** 13).astype(np.int8),
                           np.concatenate(kept) if kept else np.zeros(0, dtype=bool),
                           {rt: np.concatenate(v) if v else np.zeros(0, dtype=np.int32) for rt, v in region_of.items()})

    def part(self, states: Sequence[int]) -> Geography:
        """The blocks of ``states`` only (those the run keeps), region indices into the national region IDs:
        for every block of these states, the same row contents :func:`load_geography` gives (a block's key
        holds its state, so a person of these states finds its block here iff in the whole GRF-C). Selected
        from the compact block index (:attr:`_blocks`, read once per process), in file order. ``InputError``
        for a duplicate block among them, naming its GRF-C row (another state's partition does not hold it)."""
        blocks = self._blocks
        rows = np.flatnonzero(np.isin(blocks.state, np.array(sorted({int(s) for s in states}), dtype=np.int8)))
        key = blocks.key[rows]
        dup = np.flatnonzero(pd.Series(key).duplicated().to_numpy())
        if dup.size:
            raise InputError("duplicate block", file=self.source, row=int(rows[dup[0]]) + 2, column="TABBLK")
        rows = rows[blocks.kept[rows]]
        region_of: dict[str, IntArray] = {}
        for rt, idx in blocks.region_of.items():
            at = idx[rows]
            if (at == _NOT_IN_DOMAIN).any():
                raise IntegrityError(f"{self.source}: a region of type {rt} is not in the run's domain")
            region_of[rt] = at.astype(np.int64)
        return Geography(self.universe, blocks.key[rows], self.region_ids, region_of, self.source)


@dataclass(frozen=True)
class PersonArrays:
    """Encoded persons of one run (after the public state filter).

    ``combo_codes`` (n_combos × 8) holds each distinct race-code set (sorted code indices, −1 padding);
    ``combo`` maps each person to its row. ``region[rt]`` is the person's region index (−1 = none).
    ``sex`` is 0 (male) / 1 (female); ``age`` 0..115; ``eth`` the QSPAN code index.
    """

    region: dict[str, npt.NDArray[np.int32]]
    combo: IntArray
    combo_codes: IntArray
    eth: IntArray
    sex: npt.NDArray[np.int8]
    age: npt.NDArray[np.int16]

    @property
    def n(self) -> int:
        return len(self.combo)


def fixed_width_bytes(col: pa.ChunkedArray | pa.Array) -> npt.NDArray[np.uint8] | None:
    """(n, w) uint8 view of a string column whose values all have the same byte length w, else None.

    Fixed-width text columns (every production code column, ages, geography) are then checked and converted
    with a few numpy passes over the bytes instead of per-row regular expressions."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if arr.type not in (pa.string(), pa.large_string()) or arr.null_count:
        return None
    n = len(arr)
    if n == 0:
        return None
    off_type = np.int32 if arr.type == pa.string() else np.int64
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_type)[arr.offset:arr.offset + n + 1]
    width = int(offsets[1] - offsets[0])
    if width == 0 or int(offsets[-1] - offsets[0]) != n * width or not (np.diff(offsets) == width).all():
        return None
    data = np.frombuffer(bufs[2], dtype=np.uint8)[int(offsets[0]):int(offsets[-1])]
    return data.reshape(n, width)


def parse_digits(col: pa.ChunkedArray, min_width: int, max_width: int) -> tuple[npt.NDArray[np.bool_], IntArray]:
    """(ok, value) per row: ok iff the value is ``min_width``..``max_width`` ASCII digits (``^\\d{a,b}$``).

    Fast path for fixed-width columns (numpy over the bytes); otherwise a regular expression and a cast of the
    matching rows. ``value`` is 0 where not ok."""
    b = fixed_width_bytes(col)
    if b is not None and min_width <= b.shape[1] <= max_width:
        ok = np.ones(len(b), dtype=bool)
        acc: npt.NDArray[np.signedinteger[Any]] = np.zeros(len(b), dtype=np.int32 if b.shape[1] <= 9 else np.int64)
        for j in range(b.shape[1]):  # over the column's width (≤ 6 bytes), not over records
            d = b[:, j] - np.uint8(48)  # wraps below '0'
            ok &= d <= 9
            acc *= 10
            acc += d
        val = acc.astype(np.int64)
        val[~ok] = 0
        return ok, val
    ok = np.asarray(pc.match_substring_regex(col, rf"^\d{{{min_width},{max_width}}}$")
                    .to_numpy(zero_copy_only=False), dtype=bool)
    val = np.zeros(len(col), dtype=np.int64)
    if ok.any():
        val[ok] = pc.cast(pc.filter(col, pa.array(ok)), pa.int64()).to_numpy()
    return ok, val


_NULL_WORD = np.frombuffer(NULL.encode(), dtype=np.uint32)[0]  # "Null" as one 4-byte word


def _code_column(col: pa.ChunkedArray, index: IterationIndex, source: str, column: str,
                 offset: int = 0) -> IntArray:
    """A code column → code indices (−1 for Null); anything else not in the code list is rejected."""
    b = fixed_width_bytes(col)
    if b is not None and b.shape[1] == len(NULL):
        is_null = b.view(np.uint32)[:, 0] == _NULL_WORD
    else:
        is_null = np.asarray(pc.equal(col, NULL).to_numpy(zero_copy_only=False), dtype=bool)
    if is_null.all():  # e.g. QRACE3..8 of most files: nothing to check or look up
        return np.full(len(col), -1, dtype=np.int64)
    ok_fmt, vals = parse_digits(col, 4, 4)
    _first_bad(~is_null & ~ok_fmt, col, "not a race/ethnicity code", source, column, offset)
    idx = np.where(is_null, -1, index.encode(vals))
    _first_bad(~is_null & (idx < 0), col, "code not in race-and-ethnicity-codes.txt", source, column, offset)
    return idx.astype(np.int64)


def encode_combos(race: npt.NDArray[np.integer[Any]]) -> tuple[IntArray, IntArray]:
    """(n, k) code indices with −1 padding → (per-person combination id, distinct sorted combinations).

    Duplicated codes within a person collapse (set semantics). Vectorised: rows are sorted, duplicates masked,
    then the rows are packed into integers and factorised.
    """
    n, k = race.shape
    big = np.int64(1 << 11)
    s = np.sort(np.where(race < 0, np.int16(big - 1), race).astype(np.int16), axis=1)  # codes < 2047
    dup = np.zeros_like(s, dtype=bool)
    dup[:, 1:] = s[:, 1:] == s[:, :-1]
    s[dup] = np.int16(big - 1)
    s = np.sort(s, axis=1)
    key = np.zeros(n, dtype=np.int64)
    for j in range(min(k, 5)):
        key = key * big + s[:, j].astype(np.int64)
    if k > 5:
        first, _ = pd.factorize(key, sort=False)
        key2 = np.zeros(n, dtype=np.int64)
        for j in range(5, k):
            key2 = key2 * big + s[:, j].astype(np.int64)
        key = first.astype(np.int64) * (big ** (k - 5)) + key2
    combo, uniq_pos = _factorize_first(key)
    rows = s[uniq_pos].astype(np.int64)
    return combo, np.where(rows == big - 1, -1, rows)


def _factorize_first(key: IntArray) -> tuple[IntArray, IntArray]:
    codes, uniques = pd.factorize(key, sort=False)
    first = np.full(len(uniques), -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)
    return codes.astype(np.int64), first


def encode_race(race: npt.NDArray[np.int16], n_codes: int) -> tuple[IntArray, IntArray]:
    """(n, 8) validated code indices (−1 after the last) → (per-person combination id, combination table).

    Rows 0..n_codes−1 of the table are the single-code combinations (row c = code c), so the ~90 % of persons
    with one race code need no sort; only multi-code persons go through :func:`encode_combos`, and a
    multi-code row whose codes collapse to one code (a repeated code) gets that code's single-code id.
    """
    k = race.shape[1]
    single = race[:, 1] < 0 if k > 1 else np.ones(len(race), bool)
    combo = race[:, 0].astype(np.int64)
    table = np.full((n_codes, k), -1, dtype=np.int64)
    table[:, 0] = np.arange(n_codes)
    multi = np.flatnonzero(~single)
    if len(multi):
        m_combo, m_rows = encode_combos(race[multi])
        collapsed = m_rows[:, 1] < 0
        m_id = np.where(collapsed, m_rows[:, 0], n_codes + np.cumsum(~collapsed) - 1)
        combo[multi] = m_id[m_combo]
        table = np.concatenate([table, m_rows[~collapsed]])
    return combo, table


def encode_persons(table: pa.Table, geo: Geography, index: IterationIndex, max_race_codes: int,
                   state_filter: Sequence[str], source: str, row_offset: int = 0) -> PersonArrays:
    """Validate every person row (whole file, before filtering), then encode the run's persons.

    Checks run in a fixed order, each reporting its first offending row (file row, header = 1): QAGE, QSEX,
    geography digits, CENRACE, the race codes (per column, then Null order and count), QSPAN, the block.
    ``row_offset``: rows of the file before ``table`` (a slice), so that errors name the file's own row.
    """

    def bad(mask: npt.NDArray[np.bool_], col: pa.ChunkedArray, what: str, src: str, column: str) -> None:
        _first_bad(mask, col, what, src, column, row_offset)

    age_col = table.column("QAGE")
    ok, age = parse_digits(age_col, 1, 3)
    bad(~ok, age_col, "QAGE must be an integer", source, "QAGE")
    bad(age > MAX_AGE, age_col, f"QAGE outside 0..{MAX_AGE}", source, "QAGE")
    sex_col = table.column("QSEX")
    ok, sex = parse_digits(sex_col, 1, 1)
    bad(~ok | (sex < 1) | (sex > 2), sex_col, "QSEX must be 1 or 2", source, "QSEX")
    key = np.zeros(table.num_rows, dtype=np.int64)
    st_np = key
    for col, width, scale in (("TABBLKST", 2, 1), ("TABBLKCOU", 3, 1000), ("TABTRACTCE", 6, 1_000_000),
                              ("TABBLK", 4, 10_000)):
        ok, val = parse_digits(table.column(col), width, width)
        bad(~ok, table.column(col), f"must be {width} digits", source, col)
        if col == "TABBLKST":
            st_np = val
        key = key * scale + val
    cr = table.column("CENRACE")
    ok, cr_val = parse_digits(cr, 2, 2)
    bad(~ok | (cr_val < 1) | (cr_val > 63), cr, "CENRACE must be 01..63", source, "CENRACE")
    race = np.stack([_code_column(table.column(c), index, source, c, row_offset).astype(np.int16)
                     for c in RACE_COLUMNS], axis=1)
    null = race < 0
    bad(null[:, 0], table.column("QRACE1"), "a person needs at least one race code", source, "QRACE1")
    after_null = null[:, :-1] & ~null[:, 1:]
    if after_null.any():
        rows = np.flatnonzero(after_null.any(axis=1))
        j = int(np.flatnonzero(after_null[rows[0]])[0]) + 1
        col = table.column(RACE_COLUMNS[j])
        raise InputError("race code after a Null", file=source,
                         row=row_offset + int(rows[0]) + 2, column=RACE_COLUMNS[j])
    if max_race_codes < len(RACE_COLUMNS):
        too_many = ~null[:, max_race_codes]  # Nulls only trail, so a code in column max+1 means too many
        if too_many.any():
            i = int(np.flatnonzero(too_many)[0])
            c = RACE_COLUMNS[max_race_codes]
            raise InputError(f"more than max_race_codes={max_race_codes} race codes", file=source,
                             row=row_offset + i + 2, column=c)
    del null, after_null
    eth = _code_column(table.column("QSPAN"), index, source, "QSPAN", row_offset)
    bad(eth < 0, table.column("QSPAN"), "QSPAN must be a code, not Null", source, "QSPAN")

    # blocks of the run's geography (numeric 15-digit keys); a person whose block is missing is rejected
    keep = _run_states(st_np, geo.universe, state_filter)
    pos = geo.block_index(key)
    bad(keep & (pos < 0), table.column("TABBLK"), f"block not in {Path(geo.source).name} (for this run)",
               source, "TABBLK")
    sel = np.flatnonzero(keep) if not keep.all() else None
    if sel is not None:
        race, pos, eth, sex, age = race[sel], pos[sel], eth[sel], sex[sel], age[sel]
    combo, combos = encode_race(race, len(index.codes))
    region = {rt: geo.region_of[rt][pos].astype(np.int32) for rt in geo.region_ids}
    return PersonArrays(region, combo, combos, eth, (sex - 1).astype(np.int8), age.astype(np.int16))
