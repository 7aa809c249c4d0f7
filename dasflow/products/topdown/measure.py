"""Tabulation of person records onto the internal spine and the noisy measurements per geounit.

Privacy argument. For the query group i at a geounit u with γ_u > 0 the true answers ``Q_i x_u`` (integers)
get independent exact noise: discrete Gaussian with ``σ² = Δ₂²/(2·ρ·γ_u·α_i) = 1/(ρ γ_u α_i)`` (Δ₂² = 2 under
change-one-record neighbours, :func:`dasflow.privacy.accounting.gaussian_sigma2_sq`), or under pure DP the
two-sided geometric with scale ``Δ₁/(ε γ_u α_i) = 2/(ε γ_u α_i)``. Geounits with γ_u = 0 emit nothing
(Theorem 3: their y is ∞). Together with the spine's path-sum invariant this is ρ-zCDP (ε-DP) overall.

Segments. Below the state level a key's measured units split by state, small states grouped up to a public block
bound (:func:`state_segments`, from the public spine only), and the key may be drawn one segment at a time (only
that segment's histogram in memory): every unit still gets its own independent noise with the parameter of its
γ_u, so the segments together are exactly the key's planned mechanism on the same query — spec, budget and
sensitivity unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from dasflow.errors import InputError
from dasflow.io.arrays import unique
from dasflow.privacy import accounting, samplers
from dasflow.products.topdown.model import Histogram
from dasflow.products.topdown.spine import Spine
from dasflow.products.topdown.strategy import CHANGE_ONE_SENSITIVITY, QueryGroup, Schema, Strategy

IntArray = npt.NDArray[np.int64]


def block_histogram(spine: Spine, persons: pd.DataFrame, schema: Schema, *, source: str = "<persons>",
                    geoid_column: str = "GEOID", structural: tuple[str, IntArray] | None = None) -> Histogram:
    """Tabulate person records (block GEOID + schema attribute codes) to internal block histograms.

    Every record must name a block of the spine and valid attribute codes (InputError with the row otherwise).
    ``structural = (attribute, block_mask)``: every record's code on ``attribute`` must be allowed in its block
    (bit set in ``block_mask[block]``, public block facts) — a person in a structural-zero cell is refused
    with its row and the attribute's column.
    """
    if geoid_column not in persons.columns:
        raise InputError(f"persons: column {geoid_column} missing", file=source, column=geoid_column)
    block = _block_index(spine, persons[geoid_column])
    bad = np.flatnonzero(block < 0)
    if bad.size:
        raise InputError("persons: a block that is not in the geography", file=source,
                         row=int(bad[0]) + 2, column=geoid_column)
    cell = schema.cell_index({a: persons[a].to_numpy() for a in schema.names if a in persons.columns},
                             source)
    if structural is not None:
        attr, bmask = structural
        code = np.asarray(persons[attr].to_numpy(), dtype=np.int64)
        bad = np.flatnonzero(((bmask[block] >> code) & 1) == 0)
        if bad.size:
            i = int(bad[0])
            raise InputError(f"person's {attr} is a structural zero of the person's block (the public block "
                             "facts give the block no such housing unit or group quarters)", file=source, row=i + 2,
                             column=attr)
    n = schema.n_cells
    key = block * n + cell
    uk, cnt = np.unique(key, return_counts=True)
    return Histogram(uk // n, uk % n, cnt.astype(np.int64))


def _block_index(spine: Spine, geoid: pd.Series) -> IntArray:
    """Each record's block (internal index), −1 where its GEOID (as text) names no block of the spine: the
    spine's :class:`~dasflow.validation.lookup.GeoidIndex` on the GEOIDs as Arrow strings (≈ 20 bytes per
    record, no Python object per record — a large state's partition holds tens of millions of records)."""
    text = geoid.astype("string[pyarrow]") if geoid.dtype != "string[pyarrow]" else geoid
    return spine.block_index.positions(pa.array(text))


def level_histograms(spine: Spine, block_hist: Histogram) -> list[Histogram]:
    """Aggregate block histograms up the internal spine (index = level)."""
    out: list[Histogram] = [block_hist]
    cur = block_hist
    for l in range(spine.n_levels - 1, 0, -1):
        cur = cur.aggregate(spine.parent[l])
        out.append(cur)
    return out[::-1]


def measured_units(spine: Spine, level: int) -> IntArray:
    return np.flatnonzero(spine.gamma_num[level] > 0).astype(np.int64)


#: Default bound on a measurement segment's public size: states are grouped in FIPS order into segments of at most
#: this many blocks (≈ 1 M persons), and a larger state is split into chunks of consecutive units of the level
#: below the state (counties) of at most this many blocks each; a county above it is split again below it (its
#: tracts' runs, and so on), so a segment's units at a level hold at most this many blocks' counts, or are one
#: unit, or one block group's blocks (the largest synthetic county at 331 M persons has 283,000 blocks).
SEGMENT_BLOCKS = 25_000


@dataclass(frozen=True)
class StateSegments:
    """The states of a spine grouped into measurement segments (public: from the spine and a block bound only).

    ``codes`` are the states (sorted 2-digit FIPS), ``top`` the state level, ``of_unit`` per level the index into
    ``codes`` of every unit's state (``None`` above the state level); ``ids`` are the segments, ``of_state`` the
    index into ``ids`` of every state (its first chunk for a split state), ``seg_unit`` per level below the state
    level the index into ``ids`` of every unit's segment, and ``chunk_state`` per segment the index into ``codes``
    of the state it is a chunk of (−1: a whole state or a run of states). A segment is one state (its id is the
    FIPS code, the id of its preprocessing partition), a run of consecutive small states (id ``"first-last"``), or
    a chunk of consecutive units of the level below the state of a state with more blocks than the bound (id
    ``"SS.k"``, k = 0, 1, … in unit order; its partition is the state's). A chunk that is one unit above the
    bound (a county larger than the bound) keeps that unit, and its descendants are chunked one level further
    down (``"SS.k.j"``, recursively while the children have children), so a segment's units at a level hold at
    most the bound's blocks together, or are one unit, or one unit's children that are blocks. Keys at and
    above ``top`` are whole; deeper keys are drawn per segment."""

    codes: tuple[str, ...]
    top: int
    of_unit: tuple[IntArray | None, ...]
    ids: tuple[str, ...] = ()
    of_state: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    seg_unit: tuple[IntArray | None, ...] = ()
    chunk_state: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    _measured: dict[int, dict[str, IntArray]] = field(default_factory=dict, compare=False, repr=False)

    def segment_of(self, level: int) -> IntArray | None:
        """Every unit's segment index at ``level`` below the state level (``None`` at and above it)."""
        return self.seg_unit[level] if level < len(self.seg_unit) else None

    def members(self, segment: str) -> tuple[str, ...]:
        """The states (FIPS codes, ascending) whose partitions hold a segment's counts; InputError for an unknown
        id."""
        if segment not in self.ids:
            raise InputError(f"topdown: no measurement segment {segment!r}")
        k = self.ids.index(segment)
        if self.chunk_state[k] >= 0:
            return (self.codes[int(self.chunk_state[k])],)
        return tuple(c for c, s in zip(self.codes, self.of_state.tolist(), strict=True) if s == k)

    def _split(self, spine: Spine, level: int) -> dict[str, IntArray]:
        """The measured units of ``level`` per segment (ascending), computed once per level."""
        if level not in self._measured:
            of = self.segment_of(level)
            assert of is not None
            units = measured_units(spine, level)
            order = np.argsort(of[units], kind="stable")
            code, start = np.unique(of[units][order], return_index=True)
            groups = np.split(units[order], start[1:]) if units.size else []
            self._measured[level] = {self.ids[int(c)]: g for c, g in zip(code, groups, strict=True)}
        return self._measured[level]

    def measured(self, spine: Spine, level: int) -> list[str] | None:
        """The segments of a key at ``level``: those with a measured unit there (None: a whole key)."""
        if self.segment_of(level) is None:
            return None
        return list(self._split(spine, level)) or None

    def measured_units(self, spine: Spine, level: int, segment: str) -> IntArray:
        """The measured units of ``level`` in ``segment`` (ascending; empty if it has none)."""
        return self._split(spine, level).get(segment, np.zeros(0, dtype=np.int64))


def group_states(codes: Sequence[str], blocks: Sequence[int], max_blocks: int) -> tuple[list[str], IntArray]:
    """Consecutive states (FIPS order) grouped while their blocks sum to at most ``max_blocks``; a state with
    more blocks is a group of its own. Returns the group ids (a lone state's FIPS code, else ``"first-last"``)
    and every state's group index."""
    starts, of_state = consecutive_runs(blocks, max_blocks)
    ends = [*starts[1:], len(codes)]
    ids = [codes[s] if e - s == 1 else f"{codes[s]}-{codes[e - 1]}" for s, e in zip(starts, ends, strict=True)]
    return ids, of_state


def consecutive_runs(sizes: Sequence[int], bound: int) -> tuple[list[int], IntArray]:
    """Consecutive items grouped while their sizes sum to at most ``bound`` (a larger item alone): the first item
    of each group and every item's group index (one step per item: states or counties, public sizes only)."""
    if bound < 1:
        raise InputError(f"topdown: segment_blocks must be at least 1, not {bound}", column="segment_blocks")
    of = np.zeros(len(sizes), dtype=np.int64)
    starts: list[int] = []
    held = 0
    for i, b in enumerate(sizes):
        if not starts or held + int(b) > bound:
            starts.append(i)
            held = 0
        held += int(b)
        of[i] = len(starts) - 1
    return starts, of


@dataclass(frozen=True)
class Chunking:
    """A unit above the block bound split below it: ``children`` (of ``level``, in unit order) in consecutive
    runs, ``chunk`` each child's run index, and ``below[k]`` the same split of run k when it is one child above
    the bound (:func:`chunk_below`)."""

    level: int
    children: IntArray
    chunk: IntArray
    n_chunks: int
    below: dict[int, Chunking]


def chunk_below(spine: Spine, blocks: Callable[[int], IntArray], level: int, u: int,
                bound: int) -> Chunking | None:
    """How unit u of ``level`` is split when it has more than ``bound`` blocks: its children in consecutive runs
    of at most ``bound`` blocks (a larger child alone), an only child's children instead, and a run of one child
    above the bound split again, while the children have children (None: u is not split). The one rule the
    measurement segments (``"SS.k.j"``) and the post-processing parts (``"s.k.j"``) share, so a part reads the
    segments of its own blocks. ``blocks(l)``: blocks per unit of level l. Public sizes only."""
    c = level + 1
    if blocks(level)[u] <= bound or c >= spine.n_levels - 1:
        return None
    children = np.flatnonzero(spine.parent[c] == u)
    if children.size == 1:
        return chunk_below(spine, blocks, c, int(children[0]), bound)
    starts, of = consecutive_runs(blocks(c)[children].tolist(), bound)
    if len(starts) < 2:
        return None
    below = {}
    for k in range(len(starts)):  # one step per run
        members = np.flatnonzero(of == k)
        if members.size == 1 and (sub := chunk_below(spine, blocks, c, int(children[members[0]]), bound)):
            below[k] = sub
    return Chunking(c, children, of, len(starts), below)


def state_segments(spine: Spine, max_blocks: int = SEGMENT_BLOCKS) -> StateSegments:
    """Each unit's state (the first two digits of its blocks' GEOIDs) at the state level and below, the states
    grouped into segments of at most ``max_blocks`` blocks (:func:`group_states`), and a state with more blocks
    than that split into chunks of consecutive units of the level below it (:func:`consecutive_runs` over their
    blocks; a state with one such unit stays whole; a chunk of one unit above the bound split again below it);
    InputError if a unit there spans two states (public geography only)."""
    if "state" not in spine.levels:
        return StateSegments((), spine.n_levels, (None,) * spine.n_levels)
    top = spine.levels.index("state")
    block_state = np.asarray(spine.block_geoid.astype(str).astype("U2"))
    codes, block_code = np.unique(block_state, return_inverse=True)
    block_code = block_code.astype(np.int64)
    of_unit: list[IntArray | None] = [None] * spine.n_levels
    for l, bu in enumerate(spine.block_unit):
        if l < top:
            continue
        of = np.zeros(spine.n_units(l), dtype=np.int64)
        of[bu] = block_code
        if not np.array_equal(of[bu], block_code):
            raise InputError(f"topdown: a {spine.levels[l]} unit of the spine spans two states")
        of_unit[l] = of
    names = [str(c) for c in codes]
    blocks = np.bincount(block_code, minlength=len(names))
    ids, grouped = group_states(names, blocks.tolist(), max_blocks)
    seg_unit: list[IntArray | None] = [None] * spine.n_levels
    sub = top + 1
    if sub >= spine.n_levels:
        return StateSegments(tuple(names), top, tuple(of_unit), tuple(ids), grouped, tuple(seg_unit),
                             np.full(len(ids), -1, dtype=np.int64))
    # chunks: the level below the state, per state in unit order (units of a state are not assumed contiguous)
    sub_state = of_unit[sub]
    assert sub_state is not None
    sub_blocks = np.bincount(spine.block_unit[sub], minlength=spine.n_units(sub))
    new_ids: list[str] = []
    chunk_state: list[int] = []
    level_blocks = {sub: sub_blocks}
    deeper: list[tuple[int, IntArray, IntArray]] = []  # (level, units, their segment) overriding the parent's

    def blocks_at(l: int) -> IntArray:
        if l not in level_blocks:
            level_blocks[l] = np.bincount(spine.block_unit[l], minlength=spine.n_units(l))
        return level_blocks[l]

    def name_chunks(split: Chunking, name: str, s: int) -> None:
        """Segments ``name.j`` for the runs of a split unit (depth first: ids in unit order)."""
        seg_of = np.zeros(split.children.size, dtype=np.int64)
        for j in range(split.n_chunks):
            seg_of[split.chunk == j] = len(new_ids)
            new_ids.append(f"{name}.{j}")
            chunk_state.append(s)
            if j in split.below:
                name_chunks(split.below[j], f"{name}.{j}", s)
        deeper.append((split.level, split.children, seg_of))

    of_state = np.zeros(len(names), dtype=np.int64)
    sub_seg = np.zeros(spine.n_units(sub), dtype=np.int64)
    for k, seg in enumerate(ids):  # one step per segment (≤ 56 states), public sizes only
        states = np.flatnonzero(grouped == k)
        s = int(states[0])
        units = np.flatnonzero(sub_state == s) if states.size == 1 and blocks[s] > max_blocks else None
        if units is None or units.size < 2:
            of_state[states] = len(new_ids)
            sub_seg[np.isin(sub_state, states)] = len(new_ids)
            new_ids.append(seg)
            chunk_state.append(-1)
            continue
        starts, of_chunk = consecutive_runs(sub_blocks[units].tolist(), max_blocks)
        of_state[s] = len(new_ids)
        for c in range(len(starts)):
            members = units[of_chunk == c]
            sub_seg[members] = len(new_ids)
            new_ids.append(f"{seg}.{c}")
            chunk_state.append(s)
            if members.size == 1 and (split := chunk_below(spine, blocks_at, sub, int(members[0]), max_blocks)):
                name_chunks(split, f"{seg}.{c}", s)
    up = sub_seg
    seg_unit[sub] = sub_seg
    for l in range(sub + 1, spine.n_levels):
        up = up[spine.parent[l]]
        here = [(below, seg_of) for c, below, seg_of in deeper if c == l]
        if here:
            up = up.copy()
            for below, seg_of in here:
                up[below] = seg_of
        seg_unit[l] = up
    return StateSegments(tuple(names), top, tuple(of_unit), tuple(new_ids), of_state, tuple(seg_unit),
                         np.asarray(chunk_state, dtype=np.int64))


def noise_parameter(strategy: Strategy, gamma: Fraction, alpha: Fraction) -> Fraction:
    """σ² (zCDP) or geometric scale (pure DP) through the privacy core's calibrations (S3)."""
    share = strategy.budget * gamma * alpha
    if strategy.privacy_defn == "zcdp":
        return accounting.gaussian_sigma2_sq(share, CHANGE_ONE_SENSITIVITY)
    return accounting.geometric_scale(share, CHANGE_ONE_SENSITIVITY)


def noise_variance(strategy: Strategy, param: Fraction) -> Fraction | float:
    """Per-answer variance: σ² exactly, or 2a/(1−a)² with a = e^{−1/b} for the two-sided geometric."""
    if strategy.privacy_defn == "zcdp":
        return param
    a = float(np.exp(-1.0 / float(param)))
    return 2.0 * a / (1.0 - a) ** 2


@dataclass(frozen=True)
class GroupMeasurement:
    """Noisy answers of one (level, query group): measured units, a 2-D answer array, per-unit parameters."""

    level: int
    group: QueryGroup
    units: IntArray
    answers: npt.NDArray[np.integer[Any]]
    noise: Sequence[Fraction]
    variance: Sequence[Fraction | float]


def _fit(out: npt.NDArray[np.integer[Any]], values: IntArray) -> npt.NDArray[np.integer[Any]]:
    """Widen the answer array (int16 → int32 → int64) when ``values`` do not fit (memory: int16 first)."""
    if values.size == 0:
        return out
    lo, hi = int(values.min()), int(values.max())
    for dt in (np.int16, np.int32, np.int64):
        info = np.iinfo(dt)
        if info.min <= lo and hi <= info.max:
            if np.iinfo(out.dtype).bits < info.bits:
                return out.astype(dt)
            return out
    return out


def measure_group(spine: Spine, strategy: Strategy, level: int, group: QueryGroup, hist: Histogram,
                  g: Any, *, chunk_cells: int = 8_000_000, units: IntArray | None = None) -> GroupMeasurement:
    """Noisy answers of ``group`` at every measured unit of ``level`` (chunked; exact samplers only), or at the
    measured units ``units`` only (ascending; one segment of the level, e.g. one state's units: rows of ``hist``
    at other units are ignored)."""
    units = measured_units(spine, level) if units is None else units
    schema = strategy.schema
    rows = group.row_index(schema)
    R = group.n_rows(schema)
    gam = spine.gamma_num[level][units]
    params = {int(v): noise_parameter(strategy, Fraction(int(v), spine.denominator), group.alpha)
              for v in unique(gam)}
    out: npt.NDArray[np.integer[Any]] = np.empty((units.size, R), dtype=np.int16)
    hpos = np.searchsorted(units, hist.unit)
    hpos_c = np.minimum(hpos, max(units.size - 1, 0))
    in_measured = (units[hpos_c] == hist.unit) if units.size else np.zeros(hist.unit.size, dtype=bool)
    one_row = unique(rows).size == rows.size  # every cell its own row (the detailed query)
    step = max(1, chunk_cells // max(R, 1))
    for s in range(0, units.size, step):
        e = min(units.size, s + step)
        noisy: IntArray | None = None
        for v, param in params.items():
            m = np.flatnonzero(gam[s:e] == v)
            if m.size == 0:
                continue
            size = int(m.size) * R
            if strategy.privacy_defn == "zcdp":
                noise = samplers.discrete_gaussian(param, size, g)
            else:
                noise = samplers.two_sided_geometric(param, size, g)
            drawn = np.asarray(noise, dtype=np.int64).reshape(m.size, R)
            if m.size == e - s:  # one γ in the chunk: the noise array is the chunk
                noisy = drawn
            else:
                if noisy is None:
                    noisy = np.empty((e - s, R), dtype=np.int64)
                noisy[m] = drawn
        assert noisy is not None  # every unit has a γ (a key of params)
        # the true answers, added where they are non-zero: O(the chunk's histogram), not O(units × answers)
        sel = in_measured & (hpos_c >= s) & (hpos_c < e)
        key = (hpos_c[sel] - s) * R + rows[hist.cell[sel]]
        flat = noisy.reshape(-1)
        if one_row:  # distinct keys: one scatter-add
            flat[key] += hist.count[sel]
        else:
            uk, inv = np.unique(key, return_inverse=True)
            flat[uk] += np.bincount(inv, weights=hist.count[sel], minlength=uk.size).astype(np.int64)
        out = _fit(out, noisy)
        out[s:e] = noisy
    noise_of = [params[int(v)] for v in gam]
    var_of = {k: noise_variance(strategy, p) for k, p in params.items()}
    return GroupMeasurement(level, group, units, out, noise_of, [var_of[int(v)] for v in gam])
