"""Phase 0 — file-level checks that run before any product reader parses a delimited text file.

A reader (pyarrow CSV) meeting a truncated line, a wrong delimiter or a bad byte raises an untyped parser error
without a row; these checks turn each into an :class:`InputError` with file, row (1-based, header = row 1) and
column, so no malformed line reaches a parser. Vectorised over the raw bytes in blocks (numpy; memory is
O(block), not O(file)): UTF-8 validity, a non-empty header naming the expected columns with the expected
delimiter, and the same field count on every non-blank line (blank lines are skipped by the readers).
Quoting is not part of the Census formats (pipe-delimited, no quotes) while the pyarrow/pandas readers treat
``"`` as a quote that swallows delimiters and line ends, so a quote character is rejected. Parquet inputs are
decoded page by page (:func:`check_parquet_files`) for the same reason: a corrupt page would otherwise surface
as an untyped pyarrow error inside a product reader.
"""

from __future__ import annotations

import codecs
import io
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore

BLOCK = 1 << 23
_OTHER_DELIMITERS = ("|", ",", "\t", ";")


def check_delimited(path: str | Path, columns: Sequence[str] | None, delimiter: str | None = "|", *,
                    extra_columns: bool = False, block: int = BLOCK) -> tuple[str, list[str], int]:
    """Check one delimited file; return (delimiter, header, data rows).

    ``columns``: the required header (exact order unless ``extra_columns``: then they must all be present).
    ``delimiter`` None: detect "|" else "," from the header (PHSafe accepts both).
    """
    p = Path(path)
    name = str(p)
    if not p.is_file():
        raise InputError("missing input file", file=name)
    size = p.stat().st_size
    if size == 0:
        raise InputError("empty file (no header)", file=name, row=1)
    with p.open("rb") as fh:
        first = fh.readline()
    try:
        header_text = first.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {first[exc.start]:#04x})", file=name, row=1) from None
    if header_text.startswith("\ufeff"):
        raise InputError("byte-order mark before the header (save as UTF-8 without BOM)", file=name, row=1)
    if '"' in header_text:
        raise InputError("quote character '\"' in the header (the formats are unquoted)", file=name, row=1)
    if not header_text.strip():
        raise InputError("empty header line", file=name, row=1)
    delim = delimiter if delimiter is not None else ("|" if "|" in header_text else ",")
    header = [h.strip() for h in header_text.split(delim)]
    if columns is not None:
        _check_header(header, list(columns), header_text, delim, name, extra_columns)
    n_fields = len(header)
    rows = _scan_body(p, len(first), n_fields, delim.encode(), header, name, block)
    return delim, header, rows


def check_parquet_files(store: ObjectStore, prefix: str) -> None:
    """Every ``*.parquet`` object under ``prefix`` decodes completely (every page); ``InputError`` naming the key
    of the first that does not."""
    for key in store.list(prefix):
        if key.endswith(".parquet"):
            try:
                pq.read_table(io.BytesIO(store.get(key)))
            except (pa.ArrowException, OSError, ValueError) as exc:
                raise InputError(f"not a readable Parquet file: {exc}", file=key) from None


def _check_header(header: list[str], columns: list[str], text: str, delim: str, name: str,
                  extra_columns: bool) -> None:
    if len(header) == 1 and len(columns) > 1:
        for other in _OTHER_DELIMITERS:
            if other != delim and other in text:
                raise InputError(f"wrong delimiter: header is split by {other!r}, expected {delim!r}", file=name,
                                 row=1, column=columns[0])
    if extra_columns:
        missing = [c for c in columns if c not in header]
        if missing:
            raise InputError(f"missing column(s) {', '.join(missing)}", file=name, row=1, column=missing[0])
        return
    if header != columns:
        for i, want in enumerate(columns):
            got = header[i] if i < len(header) else None
            if got != want:
                raise InputError(f"column {i + 1} is {got!r}, expected {want!r} (header must be "
                                 f"{delim.join(columns)})", file=name, row=1, column=want)
        raise InputError(f"{len(header) - len(columns)} extra column(s) after {columns[-1]}", file=name, row=1,
                         column=header[len(columns)])


def _scan_body(p: Path, offset: int, n_fields: int, delim: bytes, header: list[str], name: str,
               block: int) -> int:
    """Field counts of every data line, UTF-8 validity; returns the number of data rows."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    row_base = 2  # row number of the first line in the current block
    carry = b""
    rows = 0
    d = np.frombuffer(delim, dtype=np.uint8)[0]
    with p.open("rb") as fh:
        fh.seek(offset)
        while True:
            chunk = fh.read(block)
            final = not chunk
            data = carry + chunk
            if not final:
                cut = data.rfind(b"\n")
                if cut < 0:
                    carry = data
                    continue
                data, carry = data[:cut + 1], data[cut + 1:]
            elif not data:
                break
            try:
                decoder.decode(data, final=final)
            except UnicodeDecodeError as exc:
                line = row_base + data.count(b"\n", 0, exc.start)
                start = data.rfind(b"\n", 0, exc.start) + 1
                col = min(data.count(delim, start, exc.start), n_fields - 1)
                raise InputError(f"not UTF-8 text (byte {data[exc.start]:#04x})", file=name, row=line,
                                 column=header[col]) from None
            quote = data.find(b'"')
            if quote >= 0:  # the readers would take it as a quote and swallow delimiters and line ends
                line = row_base + data.count(b"\n", 0, quote)
                start = data.rfind(b"\n", 0, quote) + 1
                col = min(data.count(delim, start, quote), n_fields - 1)
                raise InputError("quote character '\"' (the formats are unquoted)", file=name, row=line,
                                 column=header[col])
            arr = np.frombuffer(data, dtype=np.uint8)
            nl = np.flatnonzero(arr == 10)
            if final and (nl.size == 0 or nl[-1] != arr.size - 1):
                nl = np.append(nl, arr.size)  # last line without a newline
            starts = np.concatenate([[0], nl[:-1] + 1]) if nl.size else np.zeros(0, np.int64)
            empty = (nl - starts) == 0
            crlf_empty = ((nl - starts) == 1) & (arr[np.minimum(starts, arr.size - 1)] == 13)
            blank = empty | crlf_empty
            if _every_line_has(arr, d, n_fields - 1, starts, nl, blank):
                bad = np.zeros(nl.size, dtype=bool)
            else:  # some line has another count: count per line (one segmented sum) to name the first
                counts = (np.add.reduceat((arr == d).view(np.uint8), starts, dtype=np.int64) if nl.size
                          else np.zeros(0, np.int64))
                bad = (counts != n_fields - 1) & ~blank  # blank lines are skipped by the readers
            if bad.any():
                i = int(np.flatnonzero(bad)[0])
                row = row_base + i
                got = int(counts[i]) + 1
                if got < n_fields:
                    raise InputError(f"truncated line: {got} field(s), expected {n_fields}", file=name, row=row,
                                     column=header[got])
                raise InputError(f"{got} fields, expected {n_fields} (wrong delimiter or stray {delim.decode()!r})",
                                 file=name, row=row, column=header[-1])
            rows += int((~blank).sum())
            row_base += int(nl.size)
            if final:
                break
    return rows


def _every_line_has(arr: npt.NDArray[np.uint8], d: np.uint8, k: int, starts: npt.NDArray[np.int64],
                    ends: npt.NDArray[np.int64], blank: npt.NDArray[np.bool_]) -> bool:
    """Whether every line ``[starts[i], ends[i])`` of ``arr`` holds exactly ``k`` delimiters ``d`` (False also
    when a line is blank: the caller counts then). From the delimiters' positions alone, without a count per
    line: if there are ``k`` per line in all and the i-th run of ``k`` lies inside line i for every i, each line
    holds at least its own run, so exactly ``k``."""
    lines = ends.size
    if lines == 0 or k == 0 or bool(blank.any()):
        return False
    at = np.flatnonzero(arr == d)
    if at.size != k * lines:
        return False
    runs = at.reshape(lines, k)
    return bool((runs[:, 0] >= starts).all() and (runs[:, -1] < ends).all())

