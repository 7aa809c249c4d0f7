"""Pipe-delimited release text, written and checked through Arrow's CSV engine where that gives the very bytes
(and the very verdict) of the pandas path it replaces, and through pandas otherwise.

Release tables are mostly integer codes and counts with digit-string GEOIDs: pandas formats them one Python
object at a time and parses them back the same way in the release stage's check (4.5× and 5.8× the CPU of
Arrow on a 10 M run's tables, ``benchmarks/release_text.py``). Arrow is used only where its result is provably
the pandas one:

* writing: every column is a NumPy integer or a string column (a lone column: integers only, as pandas quotes
  an empty field that is a whole row) and no header name needs quoting; Arrow then
  writes the rows unquoted (``quoting_style="none"``), which it refuses — falling back to pandas for that
  chunk — exactly when a value holds the delimiter, a quote or a line break, the only values pandas quotes.
  Integers print the same in both; a missing string is an empty field in both.
* checking: a table whose rows all parse, whose bytes are UTF-8 and whose one COUNT column Arrow reads as 64-bit
  integers with no empty field passes pandas' ``to_numeric`` test too; anything Arrow does not accept (a
  ragged row, a non-integer, bad UTF-8, a second COUNT column) is left to the pandas check, which names the
  file's row. The file is read here, block by block, and each block handed to Arrow as bytes in memory: no
  Arrow reader ever holds the caller's file handle (Arrow's streaming reader reads ahead on a file handle in a
  background thread, which a caller reading the same handle afterwards would race).
* reading a public text table whole (:func:`read_text_table`): Arrow parses it when no byte or value could make
  pandas read it otherwise (no quote, no BOM, unique plain header names, no value pandas reads as missing);
  else pandas reads it (2.5× the CPU on the national GRF-C).
"""

from __future__ import annotations

import io
from typing import IO

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

#: characters that make pandas quote a field (QUOTE_MINIMAL with ``sep="|"``)
_NEEDS_QUOTES = ("|", '"', "\n", "\r")


def _arrow_writable(frame: pd.DataFrame) -> bool:
    for name, dtype in frame.dtypes.items():
        if not isinstance(name, str) or any(c in name for c in _NEEDS_QUOTES):
            return False
        integer = isinstance(dtype, np.dtype) and dtype.kind in "iu"
        if not integer and (not isinstance(dtype, pd.StringDtype) or len(frame.columns) == 1):
            return False  # a lone text column: pandas quotes an empty field that is a whole row (``""``)
    return True


def pipe_text(frame: pd.DataFrame, header: bool = True) -> bytes:
    """``frame`` as pipe-delimited text with ``\\n`` line ends (no index; a header line if ``header``): the bytes
    of ``frame.to_csv(index=False, sep="|", lineterminator="\\n", header=header)``."""
    if _arrow_writable(frame) and len(frame.columns):
        sink = pa.BufferOutputStream()
        try:
            pacsv.write_csv(pa.Table.from_pandas(frame, preserve_index=False), sink,
                            pacsv.WriteOptions(include_header=False, delimiter="|", quoting_style="none"))
        except pa.ArrowInvalid:  # a value pandas would quote
            pass
        else:
            head = ("|".join(frame.columns) + "\n").encode() if header else b""
            return head + bytes(sink.getvalue().to_pybytes())
    return str(frame.to_csv(index=False, sep="|", lineterminator="\n", header=header)).encode()


#: bytes of a delimited table read (and parsed by Arrow) at a time by :func:`integer_counts`
CHECK_BLOCK_BYTES = 32 << 20


def integer_counts(fh: IO[bytes], column: str = "COUNT", block: int = CHECK_BLOCK_BYTES) -> bool:
    """Whether the pipe-delimited table read from ``fh`` (from its current position: the header line) parses
    whole, is UTF-8, and has one ``column`` holding only integers, as Arrow reads it: every row is parsed (a
    ragged row fails) and only that column converted. ``True`` implies the pandas check passes; ``False`` means
    only "not shown here": the caller's exact check then decides and names the row. Reads ``fh`` synchronously
    to its end, ``block`` bytes at a time (cut after the last line end; the header is put in front of each
    block); memory: one block and its parsed column."""
    header = fh.readline()
    try:
        names = header.decode("utf-8").rstrip("\r\n").split("|")
    except UnicodeDecodeError:
        return False
    if names.count(column) != 1:
        return False
    options = {"parse_options": pacsv.ParseOptions(delimiter="|"),
               "convert_options": pacsv.ConvertOptions(column_types={column: pa.int64()}, include_columns=[column],
                                                       null_values=[], strings_can_be_null=False)}
    tail = b""
    while True:
        chunk = fh.read(block)
        data = tail + chunk
        cut = len(data) if not chunk else data.rfind(b"\n") + 1
        body, tail = data[:cut], data[cut:]
        if body:
            try:
                body.decode("utf-8")  # pandas decodes every byte; Arrow would not look at the unconverted columns
                table = pacsv.read_csv(pa.py_buffer(header + body), **options)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError, UnicodeDecodeError):
                return False
            if table.column(column).null_count:
                return False
        if not chunk:
            return True


#: the texts ``pd.read_csv`` reads as missing by default (``keep_default_na=True``)
_PANDAS_NA = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "<NA>",
              "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null")


def read_text_table(data: bytes, sep: str = "|") -> pd.DataFrame:
    """``pd.read_csv(io.BytesIO(data), sep=sep, dtype=str)``: every column as text, the same frame (values,
    dtypes, columns). Arrow parses ``data`` when that is provably pandas' result: no quote character and no
    byte-order mark, a header of unique non-empty names, at least one row, every row parsed (Arrow refuses a ragged
    row) and valid UTF-8, and no value that pandas reads as missing (:data:`_PANDAS_NA`, the empty field
    included). Anything else is read by pandas itself, which also raises its own error for a bad table."""
    fallback = b'"' in data or data.startswith(b"\xef\xbb\xbf") or not data
    names: list[str] = []
    if not fallback:
        try:
            names = data.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8").split(sep)
        except UnicodeDecodeError:
            fallback = True
    if not fallback and len(set(names)) == len(names) and all(names):
        try:
            table = pacsv.read_csv(pa.py_buffer(data), parse_options=pacsv.ParseOptions(delimiter=sep),
                                   convert_options=pacsv.ConvertOptions(
                                       column_types={c: pa.string() for c in names}, strings_can_be_null=False))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            table = None
        if table is not None and table.column_names == names and table.num_rows and not any(
                pc.any(pc.is_in(table.column(c), value_set=pa.array(_PANDAS_NA))).as_py() for c in names):
            frame: pd.DataFrame = table.to_pandas()
            return frame
    return pd.read_csv(io.BytesIO(data), sep=sep, dtype=str)
