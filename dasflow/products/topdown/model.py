"""Data types of top-down estimation (topdown-estimation.md): noisy answers, integer histograms, public
constraints, solver options and results, level reports.

Plain containers and the checks that only need them (consistency, invariant violations, the root's total); the
solver (:mod:`~dasflow.products.topdown.batch`) and the whole pass (:mod:`~dasflow.products.topdown.estimate`)
build on them. Everything here is public or post-processed: noisy answers and their variances, the spine's
public facts, and the invariants the agency publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.products.topdown.spine import Spine

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GroupAnswers:
    """Noisy answers of one query group at one level.

    ``row_index[cell]`` = row of the cell; ``answers[k]`` is the answer vector (length n_rows) of unit
    ``units[k]`` (a 2-D integer array; sorted unit ids, measured units only) and ``variance[k]`` its
    per-answer variance (float, used as a weight only).
    """

    name: str
    row_index: IntArray
    n_rows: int
    units: IntArray
    answers: npt.NDArray[np.integer[Any]] | FloatArray
    variance: FloatArray
    detailed: bool

    def position(self, unit: IntArray) -> IntArray:
        pos = np.searchsorted(self.units, unit)
        pos = np.minimum(pos, max(self.units.size - 1, 0))
        if self.units.size == 0 or not np.array_equal(self.units[pos], unit):
            raise ValueError(f"query group {self.name}: some units have no measurement")
        return pos.astype(np.int64)

    def gather(self, unit: IntArray, rows: IntArray) -> FloatArray:
        """Answers at (unit, row) pairs."""
        return self.answers[self.position(unit), rows].astype(np.float64)


@dataclass(frozen=True)
class Histogram:
    """Sparse integer histograms of the units of one level: sorted (unit, cell) with count > 0."""

    unit: IntArray
    cell: IntArray
    count: IntArray

    @staticmethod
    def from_dense(unit_ids: IntArray, dense: IntArray) -> Histogram:
        r, c = np.nonzero(dense)
        return Histogram(unit_ids[r].astype(np.int64), c.astype(np.int64), dense[r, c].astype(np.int64))

    def dense(self, n_units: int, n_cells: int) -> IntArray:
        out = np.zeros((n_units, n_cells), dtype=np.int64)
        out[self.unit, self.cell] = self.count
        return out

    def aggregate(self, mapping: IntArray) -> Histogram:
        """Sum into parent units: ``mapping[unit]`` = parent id."""
        pu = mapping[self.unit]
        n_cells = int(self.cell.max(initial=0)) + 1
        key = pu * n_cells + self.cell
        uk, inv = np.unique(key, return_inverse=True)
        cnt = np.bincount(inv, weights=self.count).astype(np.int64)
        keep = cnt != 0
        return Histogram((uk // n_cells)[keep], (uk % n_cells)[keep], cnt[keep])


@dataclass(frozen=True)
class Constraints:
    """Public invariants beyond the root total (inputs to estimation, never noisy; docs/topdown.md).

    *State totals*: the units of level ``state_level`` nest in states (level 1 under a US root: the states or
    their AIAN/non-AIAN halves; level 0 for a state-rooted spine); ``state_of_unit[u]`` indexes
    ``state_labels``/``state_totals`` (−1: no state). The units of one state share one parent, so a state's
    total couples the children of one family only.

    *Structural zeros*: ``cell_code[j]`` is cell j's code on the structural attribute (HHGQ: 0 household,
    1–7 GQ major type); bit k of ``allowed[l][u]`` says unit u of level l may hold persons of code k (the OR
    over its blocks: a cell is a structural zero at a unit iff it is one in all its blocks). ``allowed[l]``
    may be ``None`` (no facts kept for that level, see :meth:`for_level`).
    """

    state_level: int = -1
    state_of_unit: IntArray | None = None
    state_labels: tuple[str, ...] = ()
    state_totals: IntArray | None = None
    cell_code: IntArray | None = None
    allowed: tuple[IntArray | None, ...] = ()

    def __post_init__(self) -> None:
        if self.has_states:
            assert self.state_of_unit is not None and self.state_totals is not None
            if len(self.state_labels) != self.state_totals.shape[0] or (self.state_totals < 0).any():
                raise ValueError("constraints: one non-negative total per state label")

    @property
    def has_states(self) -> bool:
        return self.state_level >= 0 and self.state_totals is not None and self.state_of_unit is not None

    @property
    def has_zeros(self) -> bool:
        return self.cell_code is not None

    def state_total(self) -> int | None:
        return int(self.state_totals.sum()) if self.has_states and self.state_totals is not None else None

    def allowed_cells(self, level: int, units: IntArray, cells: IntArray) -> npt.NDArray[np.bool_]:
        """Whether each (unit, cell) pair may be non-zero (broadcasting ``units`` against ``cells``)."""
        if self.cell_code is None or level >= len(self.allowed) or self.allowed[level] is None:
            return np.ones(np.broadcast(units, cells).shape, dtype=bool)
        al = self.allowed[level]
        assert al is not None
        out: npt.NDArray[np.bool_] = ((al[units] >> self.cell_code[cells]) & 1).astype(bool)
        return out

    def for_level(self, level: int) -> Constraints:
        """The part one task needs: for the root (level 0) the root's zeros and the state units' facts; for
        level l ≥ 1 the zeros of levels l − 1 and l, and the state totals only if l is the state level."""
        keep = {0, self.state_level} if level == 0 else {level - 1, level}
        allowed = tuple(a if i in keep else None for i, a in enumerate(self.allowed))
        if level == 0 or level == self.state_level:
            return replace(self, allowed=allowed)
        return replace(self, allowed=allowed, state_level=-1, state_of_unit=None, state_labels=(),
                       state_totals=None)

    def violations(self, level: int, hist: Histogram) -> int:
        """Entries of ``hist`` (level ``level``) in structural-zero cells, plus states whose total is off."""
        bad = int(np.count_nonzero(~self.allowed_cells(level, hist.unit, hist.cell)))
        if self.has_states and level == self.state_level:
            assert self.state_of_unit is not None and self.state_totals is not None
            st = self.state_of_unit[hist.unit]
            sums = np.bincount(st[st >= 0], weights=hist.count[st >= 0], minlength=self.state_totals.size)
            bad += int(np.count_nonzero(sums.astype(np.int64) != self.state_totals))
        return bad


@dataclass
class FamilyResult:
    """Children histograms of a set of families plus their solver statuses."""

    hist: Histogram
    status: dict[str, int] = field(default_factory=dict)
    iterations: int = 0


@dataclass
class EstimatorOptions:
    """Solver knobs (post-processing only; they never touch privacy)."""

    tol: float = 1e-2
    max_iter: int = 3000
    batch_vars: int = 2_000_000
    bottom_up: bool = True
    bottom_up_max_entries: int = 20_000_000


def root_total(total: int | None, constraints: Constraints | None) -> int | None:
    """The root's invariant total: ``total``, or the sum of the state totals; both given → they must agree."""
    st = constraints.state_total() if constraints is not None else None
    if total is not None and st is not None and int(total) != st:
        raise ValueError(f"invariants disagree: total {total} ≠ {st}, the sum of the state totals")
    return int(total) if total is not None else st


@dataclass
class LevelReport:
    level: str
    units: int
    status: dict[str, int]
    seconds: float
    iterations: int
    consistency_violations: int
    l1_error: float | None = None
    cpu_seconds: float = 0.0
    invariant_violations: int = 0


def consistency_violations(spine: Spine, level: int, child: Histogram, parent: Histogram) -> int:
    """Number of (parent, cell) entries where the children do not sum to the parent (must be 0)."""
    agg = child.aggregate(spine.parent[level])
    n_cells = int(max(agg.cell.max(initial=0), parent.cell.max(initial=0))) + 1
    a = dict(zip((agg.unit * n_cells + agg.cell).tolist(), agg.count.tolist(), strict=True))
    b = dict(zip((parent.unit * n_cells + parent.cell).tolist(), parent.count.tolist(), strict=True))
    keys = set(a) | set(b)
    return sum(1 for k in keys if a.get(k, 0) != b.get(k, 0))
