"""TopDown estimation as independent parts (scale-out over states, then over the families of each state).

Steps, in order (``dasflow.pipeline.partitions``):

``combine``
    the NMFs as per-level query answers, after the bottom-up combination when configured (one part, ``all``):
    one table per level and query group down to level a, and per part the tables of the levels the bottom-up
    pass reads whole (down to its start level, within its memory bound). The deeper levels are not copied: a
    part reads its own units' raw answers from the measurement segments its blocks lie in (a state's FIPS,
    ``first-last`` for a run of small states, ``SS.k`` for a chunk of a large state's counties, ``SS.k.j`` for a
    chunk of a large county's tracts; the measure
    stage draws those keys one segment at a time), so no part holds a deep level of the nation, and the
    parts of one segment are run in one task (``PostStep.groups``), which decodes each segment once.
``level-0``
    the root (one part).
``level-1`` … ``level-a``
    one part each: all families of the level (a = the *partition level*, the shallowest level with at least
    ``MIN_PARTS`` units — the states under a national root, the counties under a state root).
``level-l`` for l > a
    one part per pack of consecutive units of level a holding at most ``PACK_BLOCKS`` (or the config's smaller
    ``segment_blocks``) blocks together (``"s"`` for unit s alone, ``"s-t"`` for units s … t; a larger unit
    alone): the families whose parents descend from the pack. Tiny states share a part, so a part's fixed cost
    (its stored objects) is not paid per state of a few blocks. Each part reads
    only its own subtrees' parents (the part of the same pack one level up) and its own children's answers, so
    parts run on different machines with memory bounded by the bound or by one subtree. A unit s with more
    blocks than the bound is split below its children: part ``"s"`` solves only its children's families at level
    a + 1, and from level a + 2 down part ``"s.k"`` holds chunk k of its children's subtrees (consecutive
    children of at most that many blocks together, or one larger child) and reads, one level up, part ``"s"``
    at level a + 1, then its own name (:class:`_Layout`). A chunk that is one child above the bound (a county
    larger than the bound) is split again below its children (``"s.k.j"`` from level a + 3), and so on down to
    the level above the blocks. A part's families at a level then hang under parents with at most the bound's
    blocks together, or are one parent's family: memory is bounded by the bound or by one family (a block
    group's blocks, a tract's block groups), not by the largest state or county.

Every family's problem depends only on its parent's integer histogram and its children's answers, so splitting
families between parts leaves each family's solution as the single-process estimator computes it, up to the
solver's batching of families (batches share a stopping test). Pure post-processing: no confidential input.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from dasflow.errors import IntegrityError
from dasflow.io.arrays import unique
from dasflow.products.base import NOISY_COLUMN, VARIANCE_COLUMN
from dasflow.products.partition import CombinedEstimates, PartSource, PostStep, Tables, TableStream
from dasflow.products.topdown.estimate import (
    Constraints,
    GroupAnswers,
    Histogram,
    LevelReport,
    bottom_up_start,
    combine_bottom_up,
    estimate_families,
    estimate_root,
    root_total,
)
from dasflow.products.topdown.measure import Chunking, chunk_below, consecutive_runs
from dasflow.products.topdown.product import TopDown, group_answers_of, invariant_listing, measurement_key
from dasflow.products.topdown.spine import Spine

#: The partition level is the shallowest level with at least this many units (or the deepest internal level).
MIN_PARTS = 8

#: Blocks one scale-out task should hold at least (``PostStep.batch_weight``): ≈ 0.25 ms CPU per block for the
#: levels below the partition level (PL 94 strategy, BENCHMARKS.md "Scale-out") makes that ≈ 10 CPU-s a task,
#: against ≈ 0.3 CPU-s of fixed cost per task (Prefect task run, public inputs, input parts).
BATCH_BLOCKS = 40_000

#: Consecutive small level-a units share a part up to this many blocks (or ``segment_blocks`` if smaller): a
#: part's fixed cost (≈ 45 ms of stored objects) is then ≤ 10 % of its solving (≈ 0.25 ms CPU per block). Larger
#: packs cost more than they save: families solved together share the solver's stopping test, so every family of
#: a pack iterates as long as its slowest (8 states of ≈ 1 M persons packed: 16.0 → 22.1 CPU-s).
PACK_BLOCKS = 2_000

IntArray = np.ndarray[Any, np.dtype[np.int64]]


def partition_level(spine: Spine) -> int:
    """Level whose units key the parts of every deeper level."""
    for l in range(1, spine.n_levels - 1):
        if spine.n_units(l) >= MIN_PARTS:
            return l
    return max(spine.n_levels - 2, 1)


def _ancestors(spine: Spine, a: int) -> list[IntArray]:
    """``anc[l][u]`` = the level-a ancestor of unit u of level l (for l ≥ a)."""
    anc: list[IntArray] = [np.zeros(0, dtype=np.int64)] * spine.n_levels
    anc[a] = np.arange(spine.n_units(a), dtype=np.int64)
    for l in range(a + 1, spine.n_levels):
        anc[l] = anc[l - 1][spine.parent[l]]
    return anc


@dataclass(frozen=True)
class _Layout:
    """Where every family below the partition level a is solved (public: the spine and a block bound only).

    A part is the subtrees of a pack of consecutive level-a units with at most min(bound, ``PACK_BLOCKS``)
    blocks together (named ``"s"`` for unit s alone, s its index, ``"s-t"`` for units s … t), or a unit's subtree
    alone. A unit above the bound whose children have children of their own is split below its children: its
    own part solves only its children's family, and from the next level down part ``"<its part>.k"`` (k = 0, 1,
    …) holds chunk k of its children (consecutive in unit order, together at most the bound's blocks, or one
    larger child alone) and their subtrees — and a chunk that is one child above the bound is split the same way
    one level further down (``"s.k.j"``), so every part's families at a level either hang under parents with at
    most the bound's blocks together or are one parent's family (which no split can divide). ``key[l][u]``
    (l ≥ a) indexes ``names`` with the part holding the families whose parent is unit u, ``own[l][u]`` (l > a)
    the part holding unit u's own family; ``first[p]``/``last[p]`` are the first and last levels at which part p
    holds families (``last`` < the block level: p was split), ``split`` says whether any unit was."""

    a: int
    anc: list[IntArray]
    names: tuple[str, ...]
    key: list[IntArray]
    own: list[IntArray]
    split: bool
    first: tuple[int, ...] = ()
    last: tuple[int, ...] = ()
    _parent_part: dict[int, IntArray] = field(default_factory=dict, compare=False, repr=False)

    @functools.cached_property
    def index(self) -> dict[str, int]:
        return {n: i for i, n in enumerate(self.names)}

    def parent_part(self, level: int) -> IntArray:
        """Per part of ``level`` (> a + 1), the part of ``level - 1`` holding its parents' families (−1: none);
        computed once per level (every part of the level asks). A part's parents' families lie in one part: its
        own, or, at its first level, the part it was split from."""
        if level not in self._parent_part:
            out = np.full(len(self.names), -1, dtype=np.int64)
            out[self.key[level - 1]] = self.own[level - 1]
            self._parent_part[level] = out
        return self._parent_part[level]


def parts_layout(sp: Spine, bound: int) -> _Layout:
    """The parts of :class:`_Layout` for a spine and a block bound (one step per level-a unit and per split unit:
    public sizes)."""
    a = partition_level(sp)
    anc = _ancestors(sp, a)
    n_a, bottom = sp.n_units(a), sp.n_levels - 1
    blocks = [np.bincount(sp.block_unit[l], minlength=sp.n_units(l)) for l in range(sp.n_levels)]
    names: list[str] = []
    first: list[int] = []
    last: list[int] = []
    chunked: list[tuple[int, IntArray, IntArray]] = []  # (level, units, their key there) after inheritance

    def add(name: str, level: int) -> int:
        names.append(name)
        first.append(level)
        last.append(bottom)
        return len(names) - 1

    def split(level: int, u: int, part: int) -> None:
        """Parts ``"<part>.k"`` for the runs of unit u's children when u is split (:func:`chunk_below`, the
        measurement segments' rule); depth first: a part's chunks follow it in ``names``, so every level's units
        stay in part order."""
        chunks = chunk_below(sp, blocks.__getitem__, level, u, bound)
        if chunks is not None:
            name(chunks, part)

    def name(chunks: Chunking, part: int) -> None:
        last[part] = chunks.level
        key_of = np.zeros(chunks.children.size, dtype=np.int64)
        for k in range(chunks.n_chunks):
            key_of[chunks.chunk == k] = sub = add(f"{names[part]}.{k}", chunks.level + 1)
            if k in chunks.below:
                name(chunks.below[k], sub)
        chunked.append((chunks.level, chunks.children, key_of))

    starts = consecutive_runs(blocks[a].tolist(), min(bound, PACK_BLOCKS))[0]  # small units packed (public sizes)
    ends = [*starts[1:], n_a]
    rank = np.zeros(n_a, dtype=np.int64)
    for s, e in zip(starts, ends, strict=True):  # one step per pack
        rank[s:e] = add(str(s) if e - s == 1 else f"{s}-{e - 1}", a + 1)
        if e - s == 1:  # above the bound: alone in its pack
            split(a, s, int(rank[s]))
    key = [np.zeros(0, dtype=np.int64)] * sp.n_levels
    own = [np.zeros(0, dtype=np.int64)] * sp.n_levels
    key[a] = rank
    for l in range(a + 1, sp.n_levels):
        own[l] = key[l - 1][sp.parent[l]]
        key[l] = own[l]
        here = [(units, k) for c, units, k in chunked if c == l]
        if here:
            key[l] = own[l].copy()
            for units, k in here:
                key[l][units] = k
    return _Layout(a, anc, tuple(names), key, own, bool(chunked), tuple(first), tuple(last))


def _compact(answers: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Integer answers (the raw noisy answers of levels below the bottom-up combination) in the narrowest of
    int8/16/32/64 that holds them; combined (float) answers as float64. Either converts back to the float64
    values the estimator uses bit for bit."""
    if answers.size and np.issubdtype(answers.dtype, np.integer):
        lo, hi = int(answers.min()), int(answers.max())
        for dtype in (np.int8, np.int16, np.int32, np.int64):
            info = np.iinfo(dtype)
            if info.min <= lo and hi <= info.max:
                return answers.astype(dtype, copy=False)
    return np.asarray(answers, dtype=np.float64)


#: rows of an NMF table stacked at a time when a segment is decoded
DECODE_ROWS = 4096


def _variances(column: npt.NDArray[Any]) -> npt.NDArray[np.float64]:
    """An NMF's per-unit variances as floats. Exact variances are ``Fraction`` objects, one object per distinct
    value as the NMF decoder builds them: they are grouped by object identity (hashing a ``Fraction`` costs more
    than the rest of a segment's decode), and each group converted once — equal values held by distinct
    objects only cost one more conversion."""
    if column.dtype != object:
        return column.astype(np.float64)
    ids = np.fromiter(map(id, column), dtype=np.uint64, count=column.size)
    _, first, codes = np.unique(ids, return_index=True, return_inverse=True)
    return np.array([float(column[i]) for i in first], dtype=np.float64)[codes.reshape(-1)]


def _segment_answers(table: pd.DataFrame, n_rows: int) -> tuple[IntArray, npt.NDArray[Any], npt.NDArray[np.float64]]:
    """One NMF table (a segment of a key) as units, answers and variances: the answers as ``_compact`` gives
    them (the narrowest of int8/16/32/64 holding every answer, float64 for float answers), stacked
    ``DECODE_ROWS`` rows at a time into that array, widened when a block needs it — never the whole segment
    as int64 (a county-sized segment of the detailed query is ≈ 1 GB in int64)."""
    units = table["UNIT"].to_numpy(np.int64)
    values = table[NOISY_COLUMN].to_numpy()
    variance = _variances(table[VARIANCE_COLUMN].to_numpy())
    if not units.size:
        return units, np.zeros((0, n_rows)), variance
    out: npt.NDArray[Any] = np.empty((units.size, n_rows), dtype=np.int8)
    for i in range(0, units.size, DECODE_ROWS):
        rows = values[i:i + DECODE_ROWS]
        if (np.fromiter(map(len, rows), dtype=np.int64, count=rows.size) != n_rows).any():
            raise IntegrityError(f"an NMF answer vector does not hold the query's {n_rows} answers")
        block = np.concatenate(rows.tolist()).reshape(-1, n_rows)   # one copy (np.stack: a view per row first)
        if block.dtype.kind == "f":
            out = out.astype(np.float64)
        elif out.dtype.kind != "f":
            need = _compact(block).dtype
            if need.itemsize > out.dtype.itemsize:
                out = out.astype(need)
        out[i:i + block.shape[0]] = block
    return units, out, variance


def _answers_table(g: GroupAnswers) -> pa.Table:
    """One query group's combined answers as a table: UNIT, VARIANCE and ANSWERS, each unit's answer vector as
    one fixed-size binary value holding its row of a C-contiguous array of dtype ``answers_dtype`` (schema
    metadata; see :func:`_compact`). Parquet reads that as a block copy, where a list column decodes
    repetition levels per element (2,016 per block for the detailed query), and integers take 1–4 bytes."""
    values = np.ascontiguousarray(_compact(np.asarray(g.answers)).reshape(len(g.units), g.n_rows))
    width = values.dtype.itemsize * g.n_rows
    if width == 0:
        values, width = np.zeros(len(g.units)), 8
    answers = pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), len(g.units), [None, pa.py_buffer(values)])
    table = pa.table({"UNIT": pa.array(g.units, type=pa.int64()), "VARIANCE": pa.array(g.variance),
                      "ANSWERS": answers})
    return table.replace_schema_metadata({"answers_dtype": values.dtype.str})


def _answers_name(level: int, group: str, part: str | None) -> str:
    """Table name of a query group's combined answers at ``level`` (of one part's subtree when ``part``)."""
    return f"L{level}.{group}" if part is None else f"L{level}.{group}.{part}"


def _answers_from_table(template: GroupAnswers, table: pa.Table) -> GroupAnswers:
    units = table.column("UNIT").to_numpy().astype(np.int64)
    variance = table.column("VARIANCE").to_numpy().astype(np.float64)
    dtype = np.dtype((table.schema.metadata or {}).get(b"answers_dtype", b"<f8").decode())
    if template.n_rows:
        column = table.column("ANSWERS").combine_chunks()
        width = dtype.itemsize * template.n_rows
        raw = np.frombuffer(column.buffers()[1], dtype=np.uint8)[column.offset * width:
                                                                   (column.offset + len(column)) * width]
        answers = raw.view(dtype).reshape(units.size, template.n_rows).astype(np.float64)
    else:
        answers = np.zeros((units.size, 0))
    return GroupAnswers(template.name, template.row_index, template.n_rows, units, answers, variance,
                        template.detailed)


def _concat_answers(template: GroupAnswers, got: Sequence[GroupAnswers]) -> GroupAnswers:
    """One part's answers read from several combine parts (a part whose units span segments), in unit order."""
    units = np.concatenate([g.units for g in got])
    answers = np.concatenate([np.asarray(g.answers).reshape(g.units.size, template.n_rows) for g in got])
    variance = np.concatenate([g.variance for g in got])
    if units.size > 1 and not bool((units[1:] > units[:-1]).all()):
        order = np.argsort(units, kind="stable")
        units, answers, variance = units[order], answers[order], variance[order]
    return GroupAnswers(template.name, template.row_index, template.n_rows, units, answers, variance,
                        template.detailed)


def _subtree_tables(level: int, g: GroupAnswers, owner_of_unit: IntArray, owners: IntArray,
                    names: Sequence[str]) -> Tables:
    """One table per part in ``owners`` (indices into ``names``) of a group's answers at ``level`` (also a part
    without a measured unit there: every part of the level's step reads one); rows in unit order."""
    owner = owner_of_unit[g.units]
    ordered = bool((owner[1:] >= owner[:-1]).all())  # parts are contiguous in unit order
    out: Tables = {}
    for s in owners:
        if ordered:
            i, j = np.searchsorted(owner, [s, s + 1])
            sel: Any = slice(int(i), int(j))
        else:
            sel = owner == s
        sub = GroupAnswers(g.name, g.row_index, g.n_rows, g.units[sel], np.asarray(g.answers)[sel],
                           g.variance[sel], g.detailed)
        out[_answers_name(level, g.name, names[int(s)])] = _answers_table(sub)
    return out


def _hist_table(h: Histogram, status: Mapping[str, int], iterations: int, seconds: float, cpu: float) -> Tables:
    stat = pa.table({"STATUS": pa.array(sorted(status), type=pa.string()),
                     "COUNT": pa.array([status[k] for k in sorted(status)], type=pa.int64())})
    run = pa.table({"ITERATIONS": [iterations], "SECONDS": [seconds], "CPU_SECONDS": [cpu]})
    return {"hist": pa.table({"UNIT": h.unit, "CELL": h.cell, "COUNT": h.count}), "status": stat, "run": run}


def _hist_from(tables: Tables) -> Histogram:
    t = tables["hist"]
    return Histogram(*(t.column(c).to_numpy().astype(np.int64) for c in ("UNIT", "CELL", "COUNT")))


_HIST_SCHEMA = pa.schema([("UNIT", pa.int64()), ("CELL", pa.int64()), ("COUNT", pa.int64())])
_BLOCK_SCHEMA = pa.schema([("GEOID", pa.string()), ("CELL", pa.int64()), ("COUNT", pa.int64())])


def _sorted(h: Histogram) -> Histogram:
    order = np.lexsort((h.cell, h.unit))
    return Histogram(h.unit[order], h.cell[order], h.count[order])


def _violations(sp: Spine, level: int, child: Histogram, parent: Histogram) -> int:
    """(parent unit, cell) entries where the children do not sum to the parent (absent = 0): what
    ``consistency_violations`` counts, vectorised, for one part's families and their parents."""
    agg = child.aggregate(sp.parent[level])
    n_cells = int(max(agg.cell.max(initial=0), parent.cell.max(initial=0))) + 1
    ka, kb = agg.unit * n_cells + agg.cell, parent.unit * n_cells + parent.cell
    keys = unique(np.concatenate((ka, kb)))  # np.union1d, by one sort
    va, vb = np.zeros(keys.size, dtype=np.int64), np.zeros(keys.size, dtype=np.int64)
    va[np.searchsorted(keys, ka)] = agg.count
    vb[np.searchsorted(keys, kb)] = parent.count
    return int(np.count_nonzero(va != vb))


class PartitionedTopDown:
    """``PartitionedPostprocess`` for a ``TopDown`` product (see the module docstring)."""

    def __init__(self, product: TopDown) -> None:
        self.product = product
        self._public: Mapping[str, Any] = {}
        self._whole_of: dict[tuple[str, int], int] = {}
        self._layouts: dict[str, _Layout] = {}
        self._where: dict[tuple[str, int], dict[int, list[str]]] = {}
        self._affinity: dict[str, tuple[str, ...]] = {}
        #: per (level, query group): the last measurement segment decoded (segment, units, compact answers,
        #: variances): a task's parts of one segment decode it once; one segment per key is held
        self._decoded: dict[tuple[int, str], tuple[str, IntArray, npt.NDArray[Any], npt.NDArray[np.float64]]] = {}

    def _layout(self, public: Mapping[str, Any]) -> tuple[Spine, _Layout]:
        sp = self.product.spine(public)
        if sp.input_hash not in self._layouts:  # public sizes only: once per spine
            self._layouts[sp.input_hash] = parts_layout(sp, self.product.config.segment_blocks)
        return sp, self._layouts[sp.input_hash]

    def _whole(self, sp: Spine, a: int) -> int:
        """The deepest level the combine step's ``all`` part holds: level a, or the bottom-up pass's start level
        when that is deeper (the pass reads it and the levels above whole); deeper levels come per segment (all
        levels when the spine has no measurement segments)."""
        if (sp.input_hash, a) not in self._whole_of:  # public sizes only: once per spine, not once per part
            opts = self.product.config.options
            whole = a
            if opts.bottom_up:
                whole = max(a, bottom_up_start(sp, self._templates(), opts.bottom_up_max_entries))
            segs = self.product.segmentation(sp)
            if whole < sp.n_levels - 1 and (not segs.ids or segs.segment_of(whole + 1) is None):
                whole = sp.n_levels - 1
            self._whole_of[(sp.input_hash, a)] = whole
        return self._whole_of[(sp.input_hash, a)]

    def _placement(self, sp: Spine, lay: _Layout, level: int) -> dict[int, list[str]]:
        """For a level below the ``all`` part: the measurement segments holding each part's units (in segment
        order; every pair with a unit there, measured or not)."""
        if (sp.input_hash, level) not in self._where:
            segs = self.product.segmentation(sp)
            seg = segs.segment_of(level)
            assert seg is not None
            n = max(len(segs.ids), 1)
            pairs = unique(lay.own[level] * n + seg)
            by_part: dict[int, list[str]] = {}
            for p, w in zip((pairs // n).tolist(), (pairs % n).tolist(), strict=True):  # one step per pair
                by_part.setdefault(p, []).append(segs.ids[w])
            self._where[(sp.input_hash, level)] = by_part
        return self._where[(sp.input_hash, level)]

    def _groups_of(self, sp: Spine, lay: _Layout) -> tuple[str, ...] | None:
        """Per part (``lay.names``), the measurement segment of its first block: the parts of one segment share
        their reads (``PostStep.groups``); None when every level comes from the ``all`` part."""
        if self._whole(sp, lay.a) >= sp.n_levels - 1:
            return None
        if sp.input_hash not in self._affinity:
            segs = self.product.segmentation(sp)
            seg = segs.segment_of(sp.n_levels - 1)
            assert seg is not None
            first = np.full(len(lay.names), len(segs.ids), dtype=np.int64)
            np.minimum.at(first, lay.own[sp.n_levels - 1], seg)
            ids = (*segs.ids, "")
            self._affinity[sp.input_hash] = tuple(ids[int(k)] for k in first)
        return self._affinity[sp.input_hash]

    def post_steps(self, public: Mapping[str, Any]) -> list[PostStep]:
        sp, lay = self._layout(public)
        a = lay.a
        affinity = self._groups_of(sp, lay)
        steps = [PostStep("combine", ("all",)), PostStep("level-0", ("root",))]
        for l in range(1, sp.n_levels):
            if l <= a:
                steps.append(PostStep(f"level-{l}", ("all",)))
                continue
            # parts = those with families at level l; part p reads level l-1's part holding its parents (its own
            # name, except a chunk's first level, which reads the part it was split from: a new wave then)
            parts = unique(lay.own[l])
            blocks = np.bincount(lay.own[l][sp.block_unit[l]], minlength=len(lay.names)).astype(np.float64)
            for p in parts.tolist():
                if lay.last[p] == l < sp.n_levels - 1:  # a split part: one level of its subtree's work here
                    blocks[p] /= sp.n_levels - l
            steps.append(PostStep(f"level-{l}", tuple(lay.names[int(p)] for p in parts),
                                  chained=l > a + 1 and all(lay.first[p] < l for p in parts.tolist()),
                                  weights=tuple(float(blocks[p]) for p in parts), batch_weight=BATCH_BLOCKS,
                                  groups=None if affinity is None else tuple(affinity[int(p)] for p in parts)))
        return steps

    @functools.cached_property
    def _template_rows(self) -> list[list[GroupAnswers]]:
        """Per level, the query groups' static facts (rows, names) with no answers (built once)."""
        st = self.product.config.strategy
        out = []
        for l in range(len(st.levels)):
            out.append([GroupAnswers(g.name, g.row_index(st.schema), g.n_rows(st.schema),
                                     np.zeros(0, dtype=np.int64), np.zeros((0, g.n_rows(st.schema))),
                                     np.zeros(0), set(g.keep) == set(st.schema.names))
                        for g in st.per_level[l].groups])
        return out

    def _templates(self) -> list[list[GroupAnswers]]:
        """Per level, the query groups' static facts (fresh lists of the frozen templates)."""
        return [list(t) for t in self._template_rows]

    def _groups(self, source: PartSource, level: int, part: str | None) -> list[GroupAnswers]:
        """The level's combined answers: all of them from the ``all`` part, or (``part``) those of that part's
        families only — from the ``all`` part's table of the part, or, below the levels it holds, the part's own
        units' rows of the measurement segments its units lie in (in segment order), so a part never holds
        another segment's answers."""
        templates = self._templates()[level]
        sp, lay = self._layout(self._public)
        if part is not None and level > self._whole(sp, lay.a):
            r = lay.index[part]
            out = []
            for t in templates:
                got = [self._segment_rows(source, sp, lay, level, t, w, r)
                       for w in self._placement(sp, lay, level)[r]]
                out.append(got[0] if len(got) == 1 else _concat_answers(t, got))
            return out
        names = [_answers_name(level, t.name, part) for t in templates]
        tables = source.part("combine", "all", names)
        return [_answers_from_table(t, tables[n]) for t, n in zip(templates, names, strict=True)]

    def _segment_rows(self, source: PartSource, sp: Spine, lay: _Layout, level: int, template: GroupAnswers,
                      segment: str, r: int) -> GroupAnswers:
        """Part ``r``'s rows of one measurement segment of a level's query group: the segment is read (verified
        against its key's committed index) and decoded once while consecutive parts ask for it. The answers stay
        in the decoded segment's compact dtype (a view where the part's rows are contiguous): the estimator
        reads only the (child, cell) pairs of its parents' support, converting those to float64
        (:meth:`GroupAnswers.gather`, exact), never the part's whole dense answer array."""
        held = self._decoded.get((level, template.name))
        if held is None or held[0] != segment:
            self._decoded.pop((level, template.name), None)  # at most one segment per key held
            st = self.product.config.strategy
            g = next(q for q in st.per_level[level].groups if q.name == template.name)
            key = measurement_key(st.levels[level], g.name)
            segments = source.measurement_segments(key)
            held = (segment, np.zeros(0, dtype=np.int64), np.zeros((0, template.n_rows)), np.zeros(0))
            if segments is None:  # a key drawn whole (no measured unit below the state level): its rows here
                table = source.measurements([key])[key].table
                segs = self.product.segmentation(sp)
                seg_of = segs.segment_of(level)
                assert seg_of is not None
                keep = seg_of[table["UNIT"].to_numpy(np.int64)] == segs.ids.index(segment)
                held = (segment, *_segment_answers(table[keep], template.n_rows))
            elif segment in segments:  # no measured unit of this segment at the level otherwise
                held = (segment, *_segment_answers(source.measurement_segment(key, segment).table, template.n_rows))
            self._decoded[(level, template.name)] = held
        _, units, answers, variance = held
        owner = lay.own[level][units]
        if owner.size < 2 or bool((owner[1:] >= owner[:-1]).all()):  # parts are contiguous in unit order
            i, j = np.searchsorted(owner, [r, r + 1])
            sel: Any = slice(int(i), int(j))
        else:
            sel = owner == r
        return GroupAnswers(template.name, template.row_index, template.n_rows, units[sel], answers[sel],
                            variance[sel], template.detailed)

    def _combine_all(self, sp: Spine, lay: _Layout, source: PartSource) -> Tables:
        """The combine step's ``all`` part: the levels down to :meth:`_whole`, read whole (after the bottom-up
        pass when configured); levels up to a as one table per group, deeper ones per part."""
        st = self.product.config.strategy
        opts = self.product.config.options
        a, whole = lay.a, self._whole(sp, lay.a)
        keys = [measurement_key(st.levels[l], g.name) for l in range(whole + 1) for g in st.per_level[l].groups]
        loaded = source.measurements(keys)
        groups = [[group_answers_of(st, g, loaded[measurement_key(st.levels[l], g.name)].table)
                   for g in st.per_level[l].groups] if l <= whole else t
                  for l, t in enumerate(self._templates())]
        del loaded
        if opts.bottom_up:
            groups = combine_bottom_up(sp, groups, opts.bottom_up_max_entries)
        out: Tables = {}
        for l in range(whole + 1):
            for g in groups[l]:
                if l <= a:
                    out[_answers_name(l, g.name, None)] = _answers_table(g)
                else:
                    out.update(_subtree_tables(l, g, lay.own[l], unique(lay.own[l]), lay.names))
        return out

    def drop_held(self) -> None:
        self._decoded.clear()

    def post_part(self, step: str, part: str, source: PartSource, public: Mapping[str, Any]) -> Tables:
        sp, lay = self._layout(public)
        a = lay.a
        opts = self.product.config.options
        self._public = public
        if step == "combine":
            return self._combine_all(sp, lay, source)
        level = int(step.removeprefix("level-"))
        t0, c0 = time.perf_counter(), time.process_time()
        constraints = self._constraints(public, level)
        if level == 0:
            res = estimate_root(sp, self._groups(source, 0, None), self.product.config.strategy.schema.n_cells,
                                self._total(public), opts, constraints=constraints)
        else:
            if level <= a:
                parents = np.arange(sp.n_units(level - 1), dtype=np.int64)
                parent_hist = _hist_from(source.part(f"level-{level - 1}",
                                                     "root" if level == 1 else "all"))
            else:
                r = lay.index[part]
                parents = np.flatnonzero(lay.key[level - 1] == r).astype(np.int64)
                src = "all" if level - 1 == a else lay.names[int(lay.parent_part(level)[r])]
                parent_hist = _hist_from(source.part(f"level-{level - 1}", src))
            res = estimate_families(sp, level, parents, parent_hist,
                                    self._groups(source, level, None if level <= a else part), opts,
                                    constraints=constraints)
        return _hist_table(res.hist, res.status, res.iterations, time.perf_counter() - t0,
                           time.process_time() - c0)

    def post_combine(self, steps: Sequence[PostStep], source: PartSource,
                     public: Mapping[str, Any]) -> CombinedEstimates:
        """The estimates streamed part by part (``TableStream``): each level's histogram and the block table
        one part at a time, never the nation's; the diagnostics (solver statuses, consistency with the parent
        level, invariant violations) are running aggregates over the parts, reported after the streams. Same
        rows, order and figures as one concatenation of the parts."""
        sp, lay = self._layout(public)
        constraints = self.product.constraints(public)
        total = self._total(public)
        levels = [(int(st.name.removeprefix("level-")), st) for st in steps if st.name.startswith("level-")]
        reports: dict[int, LevelReport] = {}
        est: CombinedEstimates = {}
        for level, step in levels:
            est[f"internal/{sp.levels[level]}"] = TableStream(_HIST_SCHEMA, functools.partial(
                self._level_tables, sp, lay, level, step, source, total, constraints, reports))
        last, last_step = levels[-1]
        est["block"] = TableStream(_BLOCK_SCHEMA, functools.partial(self._block_tables, sp, lay, last, last_step,
                                                                    source))
        est["diagnostics"] = lambda: pd.DataFrame([reports[level].__dict__ for level, _ in levels])
        est["invariants"] = invariant_listing(sp, self.product.total(public), constraints)
        return est

    def _hists(self, lay: _Layout, level: int, step: PostStep,
               source: PartSource) -> Iterator[tuple[str, Tables, Histogram, Histogram | None]]:
        """Per part of the level: its tables, its histogram, and the rows to emit — sorted by (unit, cell) so
        that the emitted rows' concatenation is sorted. Part by part where the level's units are ordered by
        their part (the spine's path order); on any other spine all parts are emitted together with the last
        one."""
        own = lay.own[level] if level > lay.a else np.zeros(0, dtype=np.int64)
        ordered = own.size == 0 or bool((own[1:] >= own[:-1]).all())
        held: list[Histogram] = []
        for i, part in enumerate(step.parts):
            tables = source.part(step.name, part)
            h = _hist_from(tables)
            if ordered:
                yield part, tables, h, _sorted(h)
                continue
            held.append(h)
            last = i == len(step.parts) - 1
            yield part, tables, h, _sorted(Histogram(*(np.concatenate([getattr(x, f) for x in held])
                                                       for f in ("unit", "cell", "count")))) if last else None

    def _level_tables(self, sp: Spine, lay: _Layout, level: int, step: PostStep, source: PartSource,
                      total: int | None, constraints: Constraints | None,
                      reports: dict[int, LevelReport]) -> Iterator[pa.Table]:
        """One level's histogram, part by part; its ``LevelReport`` (running sums) in ``reports`` at the end."""
        a = lay.a
        status: dict[str, int] = {}
        secs = cpu = 0.0
        iters = viol = bad = 0
        states = constraints is not None and constraints.has_states and constraints.state_level == level
        sums = np.zeros(0 if constraints is None or constraints.state_totals is None
                        else constraints.state_totals.size, dtype=np.int64)
        held: tuple[str, Histogram] | None = None  # the parent part last read (chunks share their unit's)
        above = lay.parent_part(level) if level > a + 1 else None
        for part, tables, h, out in self._hists(lay, level, step, source):
            st = tables["status"]
            for k, v in zip(st.column("STATUS").to_pylist(), st.column("COUNT").to_pylist(), strict=True):
                status[k] = status.get(k, 0) + int(v)
            run = tables["run"]
            iters = max(iters, int(run.column("ITERATIONS")[0].as_py()))
            secs += float(run.column("SECONDS")[0].as_py())
            cpu += float(run.column("CPU_SECONDS")[0].as_py())
            if level == 0:
                viol += 0 if total is None else int(h.count.sum() != total)
            else:
                src = ("root" if level == 1 else "all") if above is None else \
                    lay.names[int(above[lay.index[part]])]
                if held is None or held[0] != src:
                    held = (src, _hist_from(source.part(f"level-{level - 1}", src)))
                parent = held[1]
                if level > a:  # this part's parents only
                    keep = lay.key[level - 1][parent.unit] == lay.index[part]
                    parent = Histogram(parent.unit[keep], parent.cell[keep], parent.count[keep])
                viol += _violations(sp, level, h, parent)
            if constraints is not None:
                bad += int(np.count_nonzero(~constraints.allowed_cells(level, h.unit, h.cell)))
                if states:
                    assert constraints.state_of_unit is not None
                    su = constraints.state_of_unit[h.unit]
                    sums += np.bincount(su[su >= 0], weights=h.count[su >= 0],
                                        minlength=sums.size).astype(np.int64)
            if out is not None:
                yield pa.table({"UNIT": out.unit, "CELL": out.cell, "COUNT": out.count}, schema=_HIST_SCHEMA)
        if states:
            assert constraints is not None and constraints.state_totals is not None
            bad += int(np.count_nonzero(sums != constraints.state_totals))
        reports[level] = LevelReport(sp.levels[level], sp.n_units(level), status, secs, iters, viol,
                                     cpu_seconds=cpu, invariant_violations=0 if constraints is None else bad)

    def _block_tables(self, sp: Spine, lay: _Layout, level: int, step: PostStep,
                      source: PartSource) -> Iterator[pa.Table]:
        """The block estimates (GEOID, CELL, COUNT) part by part."""
        for _, _, _, h in self._hists(lay, level, step, source):
            if h is not None:
                geoid = pa.array(sp.block_geoid[h.unit].astype(str), type=pa.string())
                yield pa.table({"GEOID": geoid, "CELL": h.cell, "COUNT": h.count}, schema=_BLOCK_SCHEMA)

    def _constraints(self, public: Mapping[str, Any], level: int) -> Constraints | None:
        """The public constraints one level's parts need (state totals only at the state level)."""
        constraints = self.product.constraints(public)
        return None if constraints is None else constraints.for_level(level)

    def _total(self, public: Mapping[str, Any]) -> int | None:
        """The root's invariant total, as ``TopDown.postprocess`` holds it."""
        return root_total(self.product.total(public), self.product.constraints(public))
