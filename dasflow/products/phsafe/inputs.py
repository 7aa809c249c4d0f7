"""Reading and validating the PHSafe input files (``persons.csv``, ``units.csv``, ``geo.csv``; phsafe.md
§1.5, §3).

Files have a header row and are comma- or pipe-delimited (detected from the header). Every value is checked
against the production schema's regular expression for its column; the first failing row is reported as
``InputError(file=, row=, column=)`` with ``row`` 1-based and the header as row 1. Three readers are tried
in turn (:func:`read_table`): a byte-matrix view for files whose columns are all fixed-width, a typed pyarrow
parse validated digit by digit / on dictionaries, and the exact text + regex reader; the first two accept
exactly the files the exact reader accepts, with the same integers, and hand every other file to it (so every
error message is the exact reader's).

* Phase 1 — schema: the exact column names in the exact order.
* Phase 2 — domains and formats of every value (this is also what makes the integer conversion safe, so it
  always runs before anything is tabulated).
* Phase 3 — cross-file checks (:func:`check_cross_file`): unique MAFIDs in units and geo, every person MAFID
  in units, geo MAFIDs == unit MAFIDs, every TABBLKST in ``state_filter``, and occupied housing units carry a
  householder race/ethnicity and a tenure. Run by ``validate`` mode and ``--validate``; without it, records
  outside ``state_filter`` and orphans are dropped by the joins, as the reference does.
"""

from __future__ import annotations

import functools
import mmap
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dasflow.errors import InputError
from dasflow.io.arrays import unique
from dasflow.io.files import arrow_reason

#: column -> anchored regular expression of its valid text values (phsafe.md §1.5).
_REL = "2[0-9]|3[0-8]"
SCHEMAS: dict[str, dict[str, str]] = {
    "persons": {
        "RTYPE": "[35]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "QAGE": "[0-9]|[1-9][0-9]|10[0-9]|11[0-5]",
        "CENHISP": "[12]",
        "CENRACE": "0[1-9]|[1-5][0-9]|6[0-3]",
        "RELSHIP": _REL,
    },
    "units": {
        "RTYPE": "[24]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "FINAL_POP": "[0-9]{1,5}",
        "NPF": "0|[2-9]|[1-8][0-9]|9[0-7]",
        "HHSPAN": "[012]",
        "HHRACE": "0[0-9]|[1-5][0-9]|6[0-3]",
        "TEN": "[0-4]",
        "HHT": "[0-7]",
        "HHT2": "0[0-9]|1[0-2]",
        "CPLT": "[0-5]",
    },
    "geo": {
        "RTYPE": "[2345]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "TABBLKST": "[0-9]{2}",
        "TABBLKCOU": "[0-9]{3}",
        "TABTRACTCE": "[0-9]{6}",
        "TABBLK": "[0-9]{4}",
        "TABBLKGRPCE": "[0-9]",
        "REGIONCE": "[0-9]",
        "DIVISIONCE": "[0-9]",
        "PLACEFP": "[0-9]{5}",
        "AIANNHCE": "[0-9]{4}",
    },
}
#: Columns converted to integers after validation (the others stay text or are not needed).
INT_COLUMNS: dict[str, tuple[str, ...]] = {
    "persons": ("RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"),
    "units": ("RTYPE", "MAFID", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT", "FINAL_POP"),
    "geo": ("RTYPE", "MAFID", "TABBLKST"),
}


def _int_dtype(column: str) -> type[np.integer]:
    """MAFID needs 64 bits, FINAL_POP (≤ 99999, the non-private PH8_num weight) 32, every code fits 16."""
    return np.int64 if column == "MAFID" else np.int32 if column == "FINAL_POP" else np.int16


@dataclass(frozen=True)
class Inputs:
    """Validated inputs as integer numpy columns (one dict per file)."""

    persons: Mapping[str, np.ndarray]
    units: Mapping[str, np.ndarray]
    geo: Mapping[str, np.ndarray]
    files: Mapping[str, str]


def _delimiter(path: Path) -> str:
    with path.open("rb") as fh:  # bytes: a bad UTF-8 byte further on is reported by the readers, not here
        header = fh.readline()
    if b"|" in header:
        return "|"
    return ","


#: Fixed text width of each column whose values all have one width (every other column is variable-width).
WIDTHS: dict[str, dict[str, int]] = {
    "persons": {"RTYPE": 1, "MAFID": 9, "CENHISP": 1, "CENRACE": 2, "RELSHIP": 2},
    "units": {"RTYPE": 1, "MAFID": 9, "HHSPAN": 1, "HHRACE": 2, "TEN": 1, "HHT": 1, "HHT2": 2, "CPLT": 1},
    "geo": {"RTYPE": 1, "MAFID": 9, "TABBLKST": 2, "TABBLKCOU": 3, "TABTRACTCE": 6, "TABBLK": 4,
            "TABBLKGRPCE": 1, "REGIONCE": 1, "DIVISIONCE": 1, "PLACEFP": 5, "AIANNHCE": 4},
}
#: Patterns of width > 4 as closed value ranges: the regex matches a w-digit string iff its value is in range.
_WIDE_RANGES: dict[str, tuple[int, int]] = {
    "[1-8][0-9]{8}|900000000": (100_000_000, 900_000_000),
    "[0-9]{5}": (0, 99_999),
    "[0-9]{6}": (0, 999_999),
}
_LUTS: dict[tuple[str, int], np.ndarray] = {}
_BYTE_LUTS: dict[tuple[str, int], np.ndarray] = {}


def allowed_values(pattern: str, width: int) -> np.ndarray:
    """Boolean table over 0..10**width-1: value v is allowed iff ``pattern`` fully matches v zero-padded to
    ``width`` digits (enumerated with ``re``, so it is the regex itself; widths ≤ 4 only)."""
    key = (pattern, width)
    if key not in _LUTS:
        rx = re.compile(f"(?:{pattern})")
        _LUTS[key] = np.array([rx.fullmatch(f"{v:0{width}d}") is not None for v in range(10 ** width)])
    return _LUTS[key]


def byte_table(pattern: str, width: int) -> np.ndarray:
    """For width 1 or 2: int16 table indexed by the raw bytes (b0 for width 1, b0·256 + b1 for width 2)
    giving the value of an allowed digit string and -1 for every other byte string."""
    key = (pattern, width)
    if key not in _BYTE_LUTS:
        lut = np.full(256 ** width, -1, dtype=np.int16)
        ok = allowed_values(pattern, width)
        for v in np.flatnonzero(ok).tolist():
            text = f"{v:0{width}d}".encode()
            lut[text[0] if width == 1 else text[0] * 256 + text[1]] = v
        _BYTE_LUTS[key] = lut
    return _BYTE_LUTS[key]


def decode_digits(raw: np.ndarray, pattern: str, out: np.ndarray | None = None) -> np.ndarray | None:
    """Values of the fixed-width text values in ``raw`` (an (n, width) uint8 view, one value per row), or
    None if any value is outside ``pattern``'s language.

    Exactly the regex's language: each pattern is made of digit classes only, so a value must be ASCII
    digits; widths 1–2 go through a table over the raw bytes, widths 3–4 through the enumerated allowed
    values, wider ones through a value range (:data:`_WIDE_RANGES`). int16 for widths ≤ 4, else int64
    (written into ``out`` when given).
    """
    n, width = raw.shape
    if out is None:
        if n <= _BLOCK:
            return _decode_block(raw, pattern)
        out = np.empty(n, dtype=np.int16 if width <= 4 else np.int64)
    for r0 in range(0, n, _BLOCK):  # row blocks stay in cache across the per-digit passes
        value = _decode_block(raw[r0:r0 + _BLOCK], pattern)
        if value is None:
            return None
        out[r0:r0 + _BLOCK] = value
    return out


_BLOCK = 1 << 16


def _decode_block(raw: np.ndarray, pattern: str) -> np.ndarray | None:
    n, width = raw.shape
    if n == 0:
        return np.zeros(0, dtype=np.int16 if width <= 4 else np.int64)
    if width <= 2:
        code = raw[:, 0] if width == 1 else raw[:, 0].astype(np.int32) * 256 + raw[:, 1]
        value = byte_table(pattern, width)[code]
        return None if int(value.min()) < 0 else value
    if width > 4 and pattern not in _WIDE_RANGES:
        return None
    digits = raw - np.uint8(48)  # bytes below '0' wrap around to > 9
    if int(digits.max()) > 9:
        return None
    value = digits[:, 0].astype(np.int32)
    for j in range(1, min(width, 5)):
        np.multiply(value, 10, out=value)
        np.add(value, digits[:, j], out=value)
    if width <= 4:
        return value.astype(np.int16) if bool(allowed_values(pattern, width)[value].all()) else None
    low = np.zeros(n, dtype=np.int32)  # the digits after the 5th, kept in 32-bit arithmetic
    for j in range(5, width):
        np.multiply(low, 10, out=low)
        np.add(low, digits[:, j], out=low)
    wide = value.astype(np.int64) * 10 ** (width - 5) + low
    lo, hi = _WIDE_RANGES[pattern]
    return wide if lo <= int(wide.min()) and int(wide.max()) <= hi else None


def _decode_fixed(arr: pa.ChunkedArray, width: int, pattern: str) -> np.ndarray | None:
    """:func:`decode_digits` over the chunks of a fixed_size_binary(width) column (None on a null)."""
    out = np.empty(len(arr), dtype=np.int16 if width <= 4 else np.int64)
    at = 0
    for chunk in arr.chunks:
        n = len(chunk)
        if chunk.null_count:
            return None
        if n == 0:
            continue
        flat = np.frombuffer(chunk.buffers()[1], dtype=np.uint8)[chunk.offset * width:(chunk.offset + n) * width]
        if decode_digits(flat.reshape(n, width), pattern, out[at:at + n]) is None:
            return None
        at += n
    return out


def _decode_dictionary(arr: pa.ChunkedArray, pattern: str, values: bool,
                       dtype: type[np.integer] = np.int16) -> np.ndarray | None:
    """Validate a dictionary-encoded text column on each chunk's (small) dictionary only; its values as
    ``dtype`` when ``values`` (else an empty array), None if a value is null or outside ``pattern``'s
    language."""
    parts = []
    for chunk in arr.chunks:
        if chunk.null_count:
            return None
        ok = pc.fill_null(pc.match_substring_regex(chunk.dictionary, f"^(?:{pattern})$"), False)
        if not pc.all(ok, min_count=0).as_py():
            return None
        if values:
            lut = pc.cast(chunk.dictionary, pa.int64()).to_numpy(zero_copy_only=False).astype(dtype)
            parts.append(lut[chunk.indices.to_numpy(zero_copy_only=False)])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)


def _read_fixed_lines(path: Path, name: str, delim: str) -> dict[str, np.ndarray] | None:
    """Phase 2 for a file whose columns all have fixed widths and whose every line has exactly that layout:
    the bytes are viewed as an (n, line length) matrix with no CSV parsing at all. None when the file is
    not exactly ``header\n`` + lines of digits at the column positions, ``delim`` between them and ``\n``
    at the end (then the parsing paths take over); such a file parses to the same values under any CSV
    reader (no quotes, no carriage returns, no blank lines are possible in it). :func:`read_rows_of` reads
    some rows of such a file (:func:`_read_fixed_selected`).
    """
    schema, widths = SCHEMAS[name], WIDTHS[name]
    layout = _fixed_layout(path, name, delim)  # header and size checked
    if layout is None:
        return None
    line, seps, expected, cols = layout
    header_size = len(delim.join(schema)) + 1
    buf = np.memmap(path, dtype=np.uint8, mode="r")  # read-only view of the page cache, no copy
    if buf.size != path.stat().st_size:
        return None
    mat = buf[header_size:].reshape(-1, line)
    n = mat.shape[0]
    out = {c: np.empty(n, dtype=_int_dtype(c)) for c in INT_COLUMNS[name]}
    released = 0
    for r0 in range(0, n, _BLOCK):  # all columns of one row block while it is in cache
        block = mat[r0:r0 + _BLOCK]
        if not bool((block[:, seps] == expected).all()):
            return None
        for col, start in cols:
            value = _decode_block(block[:, start:start + widths[col]], schema[col])
            if value is None:
                return None
            if col in out:
                out[col][r0:r0 + _BLOCK] = value
        released = _release_pages(buf, released, header_size + min(r0 + _BLOCK, n) * line)
    return out


def _release_pages(buf: np.memmap, start: int, stop: int) -> int:
    """Drop the whole pages of ``buf``'s bytes [start, stop) that are read (``MADV_DONTNEED``: the page cache
    keeps them, this process's resident set does not), so a national file read once through the mapping does
    not count its whole size in the peak RSS; returns the new start. A no-op where ``madvise`` is missing."""
    mm = getattr(buf, "_mmap", None)
    stop -= stop % mmap.PAGESIZE
    if mm is None or not hasattr(mm, "madvise") or stop <= start:
        return start
    mm.madvise(mmap.MADV_DONTNEED, start, stop - start)
    return stop


def _fixed_layout(path: Path, name: str, delim: str) -> tuple[int, np.ndarray, np.ndarray,
                                                             list[tuple[str, int]]] | None:
    """(line length, separator positions, their expected bytes, (column, start) pairs) of a file that
    :func:`_read_fixed_lines` may read as a byte matrix, with its header checked; None otherwise."""
    schema, widths = SCHEMAS[name], WIDTHS[name]
    if set(widths) != set(schema):
        return None
    header = (delim.join(schema) + "\n").encode()
    line = sum(widths.values()) + len(schema)
    size = path.stat().st_size
    if size < len(header) or (size - len(header)) % line:
        return None
    with open(path, "rb") as f:
        if f.read(len(header)) != header:
            return None
    starts = np.cumsum([0, *[widths[c] + 1 for c in schema]])
    expected = np.full(len(schema), ord(delim), dtype=np.uint8)
    expected[-1] = ord("\n")
    return line, starts[1:] - 1, expected, list(zip(schema, starts[:-1].tolist(), strict=True))


@functools.lru_cache(maxsize=4)
def _mafid_spans(path: str, name: str, delim: str, version: tuple[int, int, int, int]
                 ) -> tuple[np.ndarray, np.ndarray] | None:
    """(lowest, highest) MAFID of each ``_BLOCK``-row block of a fixed-width file, from one buffered scan that
    checks every row's layout and MAFID; None if a block is not that layout (the caller reads the file whole,
    whose reader names the bad row). ``version`` (device, inode, size, mtime) keys the cache to the file's
    contents. Two int64 per 65,536 rows: about 34 KB for a national ``geo.csv`` of 140 M rows."""
    layout = _fixed_layout(Path(path), name, delim)
    if layout is None:
        return None
    line, seps, expected, cols = layout
    at, width, pattern = dict(cols)["MAFID"], WIDTHS[name]["MAFID"], SCHEMAS[name]["MAFID"]
    lo: list[int] = []
    hi: list[int] = []
    with open(path, "rb") as f:
        f.seek(len(delim.join(SCHEMAS[name])) + 1)
        for block in _row_blocks(f, line):  # over row blocks, not records
            if not bool((block[:, seps] == expected).all()):
                return None
            mafid = _decode_block(block[:, at:at + width], pattern)
            if mafid is None:
                return None
            lo.append(int(mafid.min()))
            hi.append(int(mafid.max()))
    return np.array(lo, dtype=np.int64), np.array(hi, dtype=np.int64)


def _read_fixed_rows_of(path: Path, name: str, delim: str, keys: np.ndarray,
                        select: Callable[[np.ndarray], np.ndarray]) -> dict[str, np.ndarray] | None:
    """:func:`_read_fixed_selected` over the blocks of a fixed-width file whose MAFID span holds one of
    ``keys`` (sorted, unique): the other blocks hold no selected row. None if the file is not that layout."""
    st = path.stat()
    spans = _mafid_spans(str(path), name, delim, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))
    layout = _fixed_layout(path, name, delim)
    if spans is None or layout is None:
        return None
    line, seps, expected, cols = layout
    lo, hi = spans
    wanted = np.flatnonzero(np.searchsorted(keys, hi, side="right") > np.searchsorted(keys, lo, side="left"))
    start = len(delim.join(SCHEMAS[name])) + 1

    def blocks(f: BinaryIO) -> Iterator[np.ndarray]:
        for b in wanted.tolist():  # over row blocks, not records
            f.seek(start + b * _BLOCK * line)
            yield np.frombuffer(f.read(_BLOCK * line), dtype=np.uint8).reshape(-1, line)

    with open(path, "rb") as f:
        return _read_fixed_selected(blocks(f), name, seps, expected, cols, select)


def _row_blocks(f: BinaryIO, line: int) -> Iterator[np.ndarray]:
    """The rest of a fixed-width file as (rows, line length) byte matrices of at most ``_BLOCK`` rows."""
    while block := f.read(_BLOCK * line):
        yield np.frombuffer(block, dtype=np.uint8).reshape(-1, line)


def _read_fixed_selected(blocks: Iterable[np.ndarray], name: str, seps: np.ndarray, expected: np.ndarray,
                         cols: list[tuple[str, int]], select: Callable[[np.ndarray], np.ndarray]
                         ) -> dict[str, np.ndarray] | None:
    """:func:`_read_fixed_lines` keeping the rows ``select`` (MAFID values of a row block -> rows to keep)
    picks from each block: every row's layout and MAFID are checked, the other columns only of the kept rows,
    and only those rows are held."""
    schema, widths = SCHEMAS[name], WIDTHS[name]
    mafid_at = dict(cols)["MAFID"]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in INT_COLUMNS[name]}
    for block in blocks:  # over row blocks, not records
        if not bool((block[:, seps] == expected).all()):
            return None
        mafid = _decode_block(block[:, mafid_at:mafid_at + widths["MAFID"]], schema["MAFID"])
        if mafid is None:
            return None
        keep = np.flatnonzero(select(mafid))
        if keep.size == 0:
            continue
        rows = block[keep]
        for col, start in cols:
            value = _decode_block(rows[:, start:start + widths[col]], schema[col])
            if value is None:
                return None
            if col in parts:
                parts[col].append(value.astype(_int_dtype(col), copy=False))
    return {c: (np.concatenate(v) if v else np.zeros(0, dtype=_int_dtype(c))) for c, v in parts.items()}


def _read_fast(path: Path, name: str, delim: str) -> dict[str, np.ndarray] | None:
    """Phase 2 without per-value regular expressions; None when anything is off (the exact path then finds
    and reports the first bad value).

    Fixed-width columns are parsed as fixed-size binary (a value of another length fails the parse) and
    checked digit by digit; variable-width ones are dictionary-encoded and only their distinct values are
    matched. Accepts exactly the files :func:`_read_exact` accepts, with the same integer values.
    """
    schema, widths = SCHEMAS[name], WIDTHS[name]
    types = {c: (pa.binary(widths[c]) if c in widths else pa.dictionary(pa.int32(), pa.string())) for c in schema}
    try:
        table = _parse(path, list(schema), delim, types)
    except (pa.ArrowInvalid, UnicodeDecodeError):
        return None
    out: dict[str, np.ndarray] = {}
    for col, pattern in schema.items():
        if col in widths:
            values = _decode_fixed(table.column(col), widths[col], pattern)
        else:
            values = _decode_dictionary(table.column(col), pattern, col in INT_COLUMNS[name], _int_dtype(col))
        if values is None:
            return None
        if col in INT_COLUMNS[name]:
            out[col] = values.astype(_int_dtype(col), copy=False)
    return out


def _parse(path: Path, columns: list[str], delim: str, types: Mapping[str, pa.DataType]) -> pa.Table:
    """pyarrow CSV parse in cache-sized 2 MB blocks; buffers from the system allocator, which reuses the
    freed blocks (pyarrow's default pool hands pages back and faults them in again: ~0.5 s of system time
    per 10 M persons)."""
    return pacsv.read_csv(
        path,
        read_options=pacsv.ReadOptions(column_names=columns, skip_rows=1, block_size=1 << 21),
        parse_options=pacsv.ParseOptions(delimiter=delim),
        convert_options=pacsv.ConvertOptions(column_types=dict(types), strings_can_be_null=False,
                                             quoted_strings_can_be_null=False),
        memory_pool=pa.system_memory_pool(),
    )


def _read_exact(path: Path, name: str, delim: str) -> dict[str, np.ndarray]:
    """Phase 2 value by value (every column as text, one anchored regex each); raises on the first bad row."""
    schema = SCHEMAS[name]
    expected = list(schema)
    try:
        table = _parse(path, expected, delim, {c: pa.string() for c in expected})
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise InputError(f"malformed file: {arrow_reason(exc)}", file=str(path)) from None
    out: dict[str, np.ndarray] = {}
    for col, pattern in schema.items():
        arr = table.column(col)
        ok = pc.match_substring_regex(arr, f"^(?:{pattern})$")
        ok = pc.fill_null(ok, False)
        if not pc.all(ok, min_count=0).as_py():
            bad = int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0])
            raise InputError(f"invalid value (expected /{pattern}/)", file=str(path), row=bad + 2,
                             column=col)
        if col in INT_COLUMNS[name]:
            dtype = _int_dtype(col)
            out[col] = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return out


def _checked_header(path: Path, name: str) -> str:
    """Phase 1: the file exists and its header is exactly the schema's columns; returns its delimiter."""
    if not path.exists():
        raise InputError(f"missing input file {path.name}", file=str(path))
    schema = SCHEMAS[name]
    delim = _delimiter(path)
    try:
        with path.open("rb") as fh:
            header = fh.readline().decode("utf-8").rstrip("\r\n").split(delim)
    except UnicodeDecodeError as exc:
        raise InputError("not UTF-8 text", file=str(path), row=1) from exc
    header = [h.strip() for h in header]
    expected = list(schema)
    if header != expected:
        for i, (got, want) in enumerate(zip(header, expected, strict=False)):
            if got != want:
                raise InputError(f"column {i + 1} is {got!r}, expected {want!r} (columns must be "
                                 f"{'|'.join(expected)} in this order)", file=str(path), row=1, column=want)
        raise InputError(f"expected {len(expected)} columns {'|'.join(expected)}, got {len(header)}",
                         file=str(path), row=1)
    return delim


def read_table(path: Path, name: str) -> dict[str, np.ndarray]:
    """Read one input file, run phases 1–2 on it, and return its integer columns.

    The fast path (:func:`_read_fast`) validates without a regex per value; any file it does not accept is
    re-read by the exact path, which raises ``InputError`` naming the first bad row and column.
    """
    delim = _checked_header(path, name)
    fast = _read_fixed_lines(path, name, delim)
    if fast is None:
        fast = _read_fast(path, name, delim)
    return fast if fast is not None else _read_exact(path, name, delim)


def read_rows_of(path: Path, name: str, mafids: np.ndarray) -> dict[str, np.ndarray]:
    """The rows of one input file whose MAFID is in ``mafids`` (e.g. the public geo rows of one partition's
    units), in file order, with the integer columns :func:`read_table` gives.

    A fixed-width file is read by row blocks: a first call scans it once and keeps each block's lowest and
    highest MAFID (:func:`_mafid_spans`, cached per file version), and every call then reads only the blocks
    whose span holds a wanted MAFID, decoding and holding only the selected rows — so memory follows the
    selection, and a file read for many partitions (PHSafe's national ``geo.csv``, MAFIDs in state runs) is
    scanned once, not once per partition. Every other file is read whole by :func:`read_table` and then
    filtered (same rows, same values). The file as a whole passed phases 1–2 in the validate stage (bound to
    its hash); here every row's layout and MAFID is checked again (in the scan), and every column of the rows
    kept."""
    keys = unique(np.asarray(mafids, dtype=np.int64))

    def select(values: np.ndarray) -> np.ndarray:
        if keys.size == 0:
            return np.zeros(values.size, dtype=bool)
        pos = np.minimum(np.searchsorted(keys, values), keys.size - 1)
        return np.asarray(keys[pos] == values)

    delim = _checked_header(path, name)
    rows = _read_fixed_rows_of(path, name, delim, keys, select)
    if rows is not None:
        return rows
    whole = read_table(path, name)
    keep = select(whole["MAFID"].astype(np.int64))
    return {c: v[keep] for c, v in whole.items()}


class LazyTable(Mapping[str, np.ndarray]):
    """A file's integer columns (:func:`read_table`), read when first used: a public input that the plan and a
    partitioned preprocess never read whole costs nothing there."""

    def __init__(self, path: Callable[[], Path], name: str) -> None:
        self._path = path
        self._name = name
        self._columns: dict[str, np.ndarray] | None = None

    def _load(self) -> dict[str, np.ndarray]:
        if self._columns is None:
            self._columns = read_table(self._path(), self._name)
        return self._columns

    def __getitem__(self, column: str) -> np.ndarray:
        return self._load()[column]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())


def read_inputs(data_path: str | Path) -> Inputs:
    """Read ``persons.csv``, ``units.csv`` and ``geo.csv`` from ``data_path`` (phases 1–2)."""
    root = Path(data_path)
    if not root.is_dir():
        raise InputError("DATA_PATH is not a directory", file=str(root))
    files = {n: str(root / f"{n}.csv") for n in ("persons", "units", "geo")}
    tables = {n: read_table(Path(p), n) for n, p in files.items()}
    return Inputs(persons=tables["persons"], units=tables["units"], geo=tables["geo"], files=files)


def _first_dup(values: np.ndarray) -> int | None:
    """Index of the first row whose value also occurs earlier, or None."""
    if values.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    s = values[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size == 0:
        return None
    return int(order[dup + 1].min())


def check_cross_file(inputs: Inputs, state_filter: tuple[str, ...]) -> None:
    """Phase 3: cross-file consistency; raises InputError naming the file, row and column."""
    p, u, g, f = inputs.persons, inputs.units, inputs.geo, inputs.files
    i = _first_dup(u["MAFID"])
    if i is not None:
        raise InputError("duplicate MAFID", file=f["units"], row=i + 2, column="MAFID")
    i = _first_dup(g["MAFID"])
    if i is not None:
        raise InputError("duplicate MAFID", file=f["geo"], row=i + 2, column="MAFID")
    missing = ~np.isin(p["MAFID"], u["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError("person MAFID is not in units", file=f["persons"], row=i + 2,
                         column="MAFID")
    missing = ~np.isin(u["MAFID"], g["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError("unit MAFID is not in geo", file=f["units"], row=i + 2,
                         column="MAFID")
    missing = ~np.isin(g["MAFID"], u["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError("geo MAFID is not in units", file=f["geo"], row=i + 2,
                         column="MAFID")
    allowed = np.array(sorted(int(s) for s in state_filter), dtype=np.int16)
    outside = ~np.isin(g["TABBLKST"], allowed)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise InputError(f"TABBLKST {int(g['TABBLKST'][i]):02d} is not in state_filter", file=f["geo"],
                         row=i + 2, column="TABBLKST")
    occupied = (u["RTYPE"] == 2) & (u["HHT"] != 0)
    for col in ("HHRACE", "HHSPAN", "TEN", "HHT2"):
        bad = occupied & (u[col] == 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{col} is NIU (0) for an occupied housing unit", file=f["units"], row=i + 2,
                             column=col)
    gq_person = (p["RTYPE"] == 5) != np.isin(p["RELSHIP"], (37, 38))
    if gq_person.any():
        i = int(np.flatnonzero(gq_person)[0])
        raise InputError("RTYPE and RELSHIP disagree (GQ persons are RTYPE 5 with RELSHIP 37/38)",
                         file=f["persons"], row=i + 2, column="RELSHIP")
