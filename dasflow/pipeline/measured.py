"""Committed measurements read by key: held within a byte budget, else reloaded from the ledger when read.

Two readers need many of a product's measurements: an adaptive product's later keys (SafeTab-P's stage 2 chooses
its query shape from the committed stage-1 totals) and the product's post-processing. Holding every table of a
product at once makes memory grow with the whole plan (at national size every stage-1 and stage-2 table of
SafeTab-P). :class:`Measured` holds tables up to ``budget_bytes`` in all and otherwise only where they are
committed: reading one that is not held loads it from the ledger — verified against its committed SHA-256 and
the release's binding — and keeps it until another is read, so what a reader sees is exactly the committed
bytes, and at most one table beyond the budget is in memory.

Privacy: nothing here draws noise or changes a value. In the measure stage the mapping lists only the keys
measured before the current one in plan order (the adaptivity argument of the plan: a later key's query shape is
a function of earlier noisy answers only); a reloaded table equals the committed one (``ledger.load``), so a
reader sees the same values whether a table was held or reloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from dasflow.privacy.measurement import NoisyMeasurement

Load = Callable[[str], NoisyMeasurement]
#: a segmented key's segments by id, in index order: each loads (and verifies) one segment when called
SegmentLoaders = Mapping[str, Callable[[], NoisyMeasurement]]


class Measured(Mapping[str, NoisyMeasurement]):
    """The measurements of the keys added so far (in the order added), by key: tables held while their deep size
    fits ``budget_bytes`` in all, the others loaded with ``load(key)`` when read (the last one kept); a segmented
    key's segments one at a time through ``segments(key)`` (:meth:`segment_loaders`)."""

    #: measured tables held in memory up to this deep size in all
    BUDGET_BYTES = 256 << 20

    def __init__(self, load: Load, budget_bytes: int | None = None,
                 segments: Callable[[str], SegmentLoaders | None] | None = None) -> None:
        self._load = load
        self._segments = segments
        self._budget = self.BUDGET_BYTES if budget_bytes is None else budget_bytes
        self._keys: dict[str, None] = {}  # in the order added
        self._held: dict[str, NoisyMeasurement] = {}
        self._held_bytes = 0
        self._last: tuple[str, NoisyMeasurement] | None = None
        self.reloads = 0  # how many reads went to the ledger

    def add(self, key: str, measurement: NoisyMeasurement | None = None) -> None:
        """List ``key`` (committed); hold its ``measurement`` if given and it fits the budget."""
        self._keys.setdefault(key, None)
        if measurement is not None and key not in self._held:
            self._hold(key, measurement)

    def _hold(self, key: str, measurement: NoisyMeasurement) -> bool:
        if self._held_bytes >= self._budget:
            return False  # full (or a budget of 0): no deep size computed over the table's text
        size = int(measurement.table.memory_usage(deep=True).sum())
        if self._held_bytes + size > self._budget:
            return False
        self._held[key] = measurement
        self._held_bytes += size
        return True

    def segment_loaders(self, key: str) -> SegmentLoaders | None:
        """Loaders of a segmented key's committed segments by id, in index order, each verified when called (a reader
        going through a key segment by segment holds one segment); None for a key stored whole."""
        if key not in self._keys:
            raise KeyError(key)
        return None if self._segments is None else self._segments(key)

    def __getitem__(self, key: str) -> NoisyMeasurement:
        if key in self._held:
            return self._held[key]
        if key not in self._keys:
            raise KeyError(key)  # not listed (in the measure stage: not measured before the current key)
        if self._last is None or self._last[0] != key:
            self._last = None  # drop the previous table before reading the next
            measurement = self._load(key)
            self.reloads += 1
            if self._hold(key, measurement):
                return measurement
            self._last = (key, measurement)
        return self._last[1]

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._keys))

    def __len__(self) -> int:
        return len(self._keys)
