"""Pipe-delimited release text, written through Arrow's CSV writer where that gives the very bytes of the pandas
path it replaces, and through pandas otherwise.

Release tables are mostly integer codes and counts with digit-string GEOIDs: pandas formats them one Python
object at a time (4.5× the CPU of Arrow on a 10 M run's tables, ``benchmarks/release_text.py``). Arrow is used
only where its result is provably the pandas one:

* writing: every column is a NumPy integer or a string column (a lone column: integers only, as pandas quotes
  an empty field that is a whole row) and no header name needs quoting; Arrow then
  writes the rows unquoted (``quoting_style="none"``), which it refuses — falling back to pandas for that
  chunk — exactly when a value holds the delimiter, a quote or a line break, the only values pandas quotes.
  Integers print the same in both; a missing string is an empty field in both.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
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
