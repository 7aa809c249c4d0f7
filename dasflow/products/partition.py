"""The partition interface of a product's post-processing: steps of independent parts (the unit of scale-out).

A product whose post-processing decomposes (TopDown: level by level, the families of each state independently)
exposes it through its plugin (``ProductPlugin.partitioned``) as *steps* of *parts*. Every part of a step
depends only on the committed noisy measurements, the public inputs and parts of earlier steps, so the parts of
one step can run anywhere at once; ``dasflow.pipeline.partitions`` runs and stores them.

Privacy: parts are post-processing — they read committed measurements and public inputs only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from dasflow.products.base import Estimates, NoisyMeasurement

Tables = dict[str, pa.Table]
RowRange = tuple[str, int, int]


@dataclass(frozen=True)
class PostStep:
    """One step of a partitioned post-processing: its name and its independent parts (plan order)."""

    name: str
    parts: tuple[str, ...]


class PartSource(Protocol):
    """What a part may read: committed measurements (by the product's own keys) and earlier parts' tables."""

    def measurements(self, keys: Sequence[str] | None = None) -> Mapping[str, NoisyMeasurement]: ...

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

    def post_combine(self, steps: Sequence[PostStep], source: PartSource, public: Mapping[str, Any]) -> Estimates:
        """The product's estimates from all parts (same names and columns as ``postprocess`` returns)."""
        ...
