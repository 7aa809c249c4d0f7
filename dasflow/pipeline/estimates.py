"""A product's stored post-processed estimates, read on demand: a frame when one is asked for, or the rows of a
large estimate one group at a time (TopDown's blocks state by state), never every estimate at once.

Post-processing writes a large estimate as one Parquet row group per partition (``write_estimates``); a group
reader uses the row groups' min/max statistics to know which row groups can still hold a group, so a group is
handed out as soon as the last row group that may hold it is read. With row groups in group order (TopDown:
one per level-a subtree, in path order) memory holds one group and one row group; any other order still gives
every group complete (at the cost of holding more). Estimates are DP outputs: reading them is post-processing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dasflow.io.store import ObjectStore


class StoredEstimates(Mapping[str, pd.DataFrame]):
    """``name -> frame`` over a post-processing manifest's outputs (``{key: {"name": …}}``); each access reads
    the object (nothing is cached), and :meth:`groups` streams one."""

    def __init__(self, store: ObjectStore, outputs: Mapping[str, Mapping[str, Any]]) -> None:
        self._store = store
        self._keys = {str(out["name"]): key for key, out in sorted(outputs.items())}

    def __getitem__(self, name: str) -> pd.DataFrame:
        with self._store.reader(self._keys[name]) as fh:
            frame: pd.DataFrame = pq.read_table(fh).to_pandas()
        return frame

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def row_groups(self, name: str) -> Iterator[pd.DataFrame]:
        """The rows of ``name`` one stored row group at a time (a stream's chunks, in order); one empty frame of
        its schema when it has no row group."""
        with self._store.reader(self._keys[name]) as fh:
            pf = pq.ParquetFile(fh)
            if pf.metadata.num_row_groups == 0:
                yield pf.schema_arrow.empty_table().to_pandas()
            for i in range(pf.metadata.num_row_groups):
                yield pf.read_row_group(i).to_pandas()

    def groups(self, name: str, column: str, width: int) -> Iterator[pd.DataFrame]:
        """The rows of ``name`` grouped by the first ``width`` characters of the text ``column``: one frame per
        group in ascending order, its rows in stored order (index reset)."""
        with self._store.reader(self._keys[name]) as fh:
            pf = pq.ParquetFile(fh)
            n = pf.metadata.num_row_groups
            index = pf.schema_arrow.get_field_index(column)
            lows: list[str | None] = []
            for i in range(n):
                stats = pf.metadata.row_group(i).column(index).statistics
                if stats is not None and stats.has_min_max:
                    lows.append(str(stats.min)[:width])
                else:
                    low = pc.min_max(pf.read_row_group(i, columns=[column]).column(0))["min"].as_py()
                    lows.append(None if low is None else str(low)[:width])
            pending: dict[str, list[pd.DataFrame]] = {}
            for i in range(n):
                frame = pf.read_row_group(i).to_pandas()
                for key, part in frame.groupby(frame[column].str[:width], sort=True):
                    pending.setdefault(str(key), []).append(part)
                later = [low for low in lows[i + 1:] if low is not None]
                floor = min(later) if later else None
                for key in sorted(pending):
                    if floor is not None and key >= floor:  # a later row group may still hold rows of it
                        break
                    yield pd.concat(pending.pop(key), ignore_index=True)
