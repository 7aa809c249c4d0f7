"""Domain frames: the distinct values of each column, so that GX runs on kilobytes instead of 10 M rows.

Every membership-type expectation (``ExpectColumnValuesToBeInSet``, ``…ToBeBetween``, ``…ToMatchRegex``,
``…ToNotBeNull``, ``…OfType``, the ordered column list) depends only on the column's dtype and the *set* of its
values, so validating the distinct values is exactly equivalent to validating every row. A column checked only by
range, null and type expectations (MAFID: millions of distinct values) keeps only its min, max and a null if
any, which decide those expectations for all rows. Columns of different distinct-value counts are padded by
repeating their first value (a repeat does not change the set). Row-level rules that are not set properties
(uniqueness, cross-file joins, row counts) are computed vectorised over the full data and reach GX as a *facts*
frame (one row per rule with its violation count).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

Column: TypeAlias = "npt.NDArray[Any] | pa.ChunkedArray | pa.Array | pd.Series"


def _distinct(values: Column) -> pd.Series:
    if isinstance(values, pa.ChunkedArray | pa.Array):
        return pd.Series(pc.unique(values).to_pandas(), dtype=object if pa.types.is_string(values.type)
                         else None)
    if isinstance(values, pd.Series):
        return pd.Series(pd.unique(values), dtype=values.dtype)
    arr = np.asarray(values)
    return pd.Series(pd.unique(arr), dtype=arr.dtype)


def _extremes(values: Column) -> pd.Series:
    """Min, max (and a null if any) — all a range/null/type expectation depends on."""
    s = values.to_pandas() if isinstance(values, pa.ChunkedArray | pa.Array) else (
        values if isinstance(values, pd.Series) else pd.Series(np.asarray(values)))
    if len(s) == 0:
        return s.iloc[:0]
    picks = [s.min(), s.max()] if s.notna().any() else []
    out = pd.Series(picks, dtype=s.dtype)
    if s.isna().any():
        out = pd.concat([out, s[s.isna()].iloc[:1]], ignore_index=True)
    return out


def domain_parts(columns: Mapping[str, Column], extremes_only: set[str] | frozenset[str] = frozenset()
                 ) -> dict[str, pd.Series]:
    """Each column's distinct values in order of first appearance (or, in ``extremes_only``, its min, max and
    a null if present), unpadded: what :func:`domain_frame` pads into one frame."""
    return {name: (_extremes(v) if name in extremes_only else _distinct(v)) for name, v in columns.items()}


def merge_parts(first: Mapping[str, pd.Series], then: Mapping[str, pd.Series],
                extremes_only: set[str] | frozenset[str] = frozenset()) -> dict[str, pd.Series]:
    """The parts of ``first``'s rows followed by ``then``'s: distinct values of the concatenation keep the order
    of first appearance, extremes are the extremes of both, so folding the parts of consecutive chunks gives
    exactly the parts of the whole column (columns in ``first``'s order, then any new ones)."""
    out = dict(first)
    for name, s in then.items():
        if name not in out:
            out[name] = s
            continue
        if len(s) == 0:
            continue
        if len(out[name]) == 0:
            out[name] = s
            continue
        both = pd.concat([out[name], s], ignore_index=True)
        out[name] = _extremes(both) if name in extremes_only else _distinct(both)
    return out


def pad_parts(parts: Mapping[str, pd.Series]) -> pd.DataFrame:
    """One frame of the parts, each padded to the longest by repeating its first value (dtypes kept)."""
    n = max((len(s) for s in parts.values()), default=0)
    out = {}
    for name, s in parts.items():
        if len(s) == 0:
            out[name] = s.reindex(range(n))
            continue
        pad = n - len(s)
        out[name] = pd.concat([s, pd.Series([s.iloc[0]] * pad, dtype=s.dtype)], ignore_index=True) if pad else s
    return pd.DataFrame(out)


def domain_frame(columns: Mapping[str, Column], extremes_only: set[str] | frozenset[str] = frozenset()
                 ) -> pd.DataFrame:
    """One column per input column holding its distinct values (padded with repeats), dtypes kept.

    Columns in ``extremes_only`` (checked only by range, null and type expectations) keep just their min, max
    and a null if present: ``min <= v <= max`` for every v, so a range holds for all rows iff it holds for both.
    """
    return pad_parts(domain_parts(columns, extremes_only))


def facts_frame(facts: list[dict[str, object]]) -> pd.DataFrame:
    """Rows ``rule, file, column, violations, first_row`` (first_row 1-based with the header as row 1; 0 = none)."""
    cols = ["rule", "file", "column", "violations", "first_row"]
    frame = pd.DataFrame(facts, columns=cols)
    frame["violations"] = frame["violations"].astype(np.int64)
    frame["first_row"] = frame["first_row"].astype(np.int64)
    return frame
