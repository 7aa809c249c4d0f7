"""The partition interface of a product's post-processing: steps of independent parts (the unit of scale-out).

A product whose post-processing decomposes (TopDown: level by level, the families of each state independently)
exposes it through its plugin (``ProductPlugin.partitioned``) as *steps* of *parts*. Every part of a step
depends only on the committed noisy measurements, the public inputs and parts of earlier steps, so the parts of
one step can run anywhere at once; ``dasflow.pipeline.partitions`` runs and stores them.

Privacy: parts are post-processing — they read committed measurements and public inputs only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pandas as pd
import pyarrow as pa

from dasflow.products.base import NoisyMeasurement

Tables = dict[str, pa.Table]
RowRange = tuple[str, int, int]


@dataclass(frozen=True)
class TableStream:
    """A large estimate produced one partition at a time: ``chunks()`` yields Arrow tables of ``schema`` whose
    concatenation is the estimate (the post-processing stage writes each as a Parquet row group, so the
    nation's table is never in memory)."""

    schema: pa.Schema
    chunks: Callable[[], Iterator[pa.Table]]


#: ``post_combine``'s estimates, consumed **in insertion order**: frames, streams, and frames computed only when
#: reached (after the streams before them were consumed: running aggregates such as diagnostics)
CombinedEstimates = dict[str, pd.DataFrame | TableStream | Callable[[], pd.DataFrame]]


class GroupedEstimates(Protocol):
    """Stored estimates that can be read a group of rows at a time (the release stage's view of them)."""

    def __getitem__(self, name: str) -> pd.DataFrame: ...

    def groups(self, name: str, column: str, width: int) -> Iterator[pd.DataFrame]:
        """The rows of estimate ``name`` grouped by the first ``width`` characters of the text ``column``: one
        frame per group, in ascending order of the group, rows in stored order."""
        ...


@dataclass(frozen=True)
class PostStep:
    """One step of a partitioned post-processing: its name and its independent parts (plan order).

    Optional facts a runner uses to group parts into tasks (``dasflow.pipeline.partitions.task_waves``), all
    from public inputs:

    ``chained``
        part p of this step reads, of the previous step, only part p (the previous step has the same parts), so
        one task may run p's parts of consecutive chained steps in order.
    ``weights``
        the relative work of each part (TopDown: blocks in the part's subtree), in the unit of ``batch_weight``.
    ``batch_weight``
        the work one task should hold at least, so that a task's fixed cost (scheduling, reading the public
        inputs and its input parts) stays small against its compute; None: one part per task.
    ``groups``
        per part, the input it shares with its neighbours (TopDown: the measurement segment its blocks lie in):
        a runner keeps the parts of one group in one task, so each task reads a shared input once.
    """

    name: str
    parts: tuple[str, ...]
    chained: bool = False
    weights: tuple[float, ...] | None = None
    batch_weight: float | None = None
    groups: tuple[str, ...] | None = None


class PartSource(Protocol):
    """What a part may read: committed measurements (by the product's own keys) and earlier parts' tables."""

    def measurements(self, keys: Sequence[str] | None = None) -> Mapping[str, NoisyMeasurement]: ...

    def measurement_segments(self, key: str) -> Sequence[str] | None:
        """The segment ids of a key measured in segments (the ledger's index order), None for a whole key."""
        ...

    def measurement_segment(self, key: str, segment: str) -> NoisyMeasurement:
        """One segment of a segmented key, verified against the key's committed index (not cached)."""
        ...

    def part(self, step: str, part: str, names: Sequence[str] | None = None,
             rows: RowRange | None = None) -> Tables:
        """The part's tables (only ``names`` if given; with ``rows = (column, lo, hi)`` only the rows whose
        integer ``column`` lies in [lo, hi], read by row group from the column's statistics)."""
        ...


class PartitionedPostprocess(Protocol):
    """A product's post-processing as steps of parts (the same estimates as one ``postprocess`` call would
    give up to solver batching)."""

    def post_steps(self, public: Mapping[str, Any]) -> list[PostStep]:
        """The steps and their parts, from public inputs only."""
        ...

    def post_part(self, step: str, part: str, source: PartSource, public: Mapping[str, Any]) -> Tables:
        """One part's output tables (Arrow, so dense arrays travel without per-row Python objects)."""
        ...

    def post_combine(self, steps: Sequence[PostStep], source: PartSource,
                     public: Mapping[str, Any]) -> CombinedEstimates:
        """The product's estimates from all parts (same names and columns as ``postprocess`` returns); large ones
        may be :class:`TableStream` s and late ones callables, consumed in the mapping's order."""
        ...

    def drop_held(self) -> None:
        """Forget any measurement data held between parts (called after each batch of parts: a long-lived
        worker keeps the object, and with it the public layout it derived once, but no noisy answers)."""
        ...
