"""TopDown estimation as independent parts (scale-out over states, then over the families of each state).

Steps, in order (``dasflow.pipeline.partitions``):

``combine``
    the NMFs as per-level query answers, after the bottom-up combination when configured: part ``all`` holds
    one table per level and query group down to level a, and per level-a subtree the tables of the levels the
    bottom-up pass reads whole (down to its start level, within its memory bound); one part per measurement
    segment (a state's FIPS, or ``first-last`` for a run of small states) holds the deeper levels' tables of the
    segment's subtrees, read from that segment of the keys (the measure stage draws those keys one segment at a
    time), so no part holds a deep level of the nation.
``level-0``
    the root (one part).
``level-1`` … ``level-a``
    one part each: all families of the level (a = the *partition level*, the shallowest level with at least
    ``MIN_PARTS`` units — the states under a national root, the counties under a state root).
``level-l`` for l > a
    one part per unit s of level a: the families whose parents descend from s. Each part reads only its own
    subtree's parents (the part of the same s one level up) and its own children's answers, so parts run on
    different machines with memory bounded by one subtree.

Every family's problem depends only on its parent's integer histogram and its children's answers, so splitting
families between parts leaves each family's solution as the single-process estimator computes it, up to the
solver's batching of families (batches share a stopping test). Pure post-processing: no confidential input.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

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
from dasflow.products.topdown.product import TopDown, group_answers_of, invariant_listing, measurement_key
from dasflow.products.topdown.spine import Spine

#: The partition level is the shallowest level with at least this many units (or the deepest internal level).
MIN_PARTS = 8

#: Blocks one scale-out task should hold at least (``PostStep.batch_weight``): ≈ 0.25 ms CPU per block for the
#: levels below the partition level (PL 94 strategy, BENCHMARKS.md "Scale-out") makes that ≈ 10 CPU-s a task,
#: against ≈ 0.3 CPU-s of fixed cost per task (Prefect task run, public inputs, input parts).
BATCH_BLOCKS = 40_000

#: the combine step's state parts only split stored answers (no solver): this many times ``BATCH_BLOCKS`` a task
COMBINE_BATCH = 8

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


def _subtree_tables(level: int, g: GroupAnswers, owner_of_unit: IntArray, subtrees: IntArray) -> Tables:
    """One table per level-a subtree in ``subtrees`` of a group's answers at ``level`` (also a subtree without a
    measured unit: every part of the level's step reads one); rows in unit order."""
    owner = owner_of_unit[g.units]
    ordered = bool((owner[1:] >= owner[:-1]).all())  # subtrees are contiguous in unit order
    out: Tables = {}
    for s in subtrees:
        if ordered:
            i, j = np.searchsorted(owner, [s, s + 1])
            sel: Any = slice(int(i), int(j))
        else:
            sel = owner == s
        sub = GroupAnswers(g.name, g.row_index, g.n_rows, g.units[sel], np.asarray(g.answers)[sel],
                           g.variance[sel], g.detailed)
        out[_answers_name(level, g.name, str(int(s)))] = _answers_table(sub)
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
    keys = np.union1d(ka, kb)
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

    def _layout(self, public: Mapping[str, Any]) -> tuple[Spine, int, list[IntArray]]:
        sp = self.product.spine(public)
        a = partition_level(sp)
        return sp, a, _ancestors(sp, a)

    def _whole(self, sp: Spine, a: int) -> int:
        """The deepest level the combine step's ``all`` part holds: level a, or the bottom-up pass's start level
        when that is deeper (the pass reads it and the levels above whole); deeper levels come per segment."""
        opts = self.product.config.options
        if not opts.bottom_up:
            return a
        if (sp.input_hash, a) not in self._whole_of:  # public sizes only: once per spine, not once per part
            self._whole_of[(sp.input_hash, a)] = max(a, bottom_up_start(sp, self._templates(),
                                                                         opts.bottom_up_max_entries))
        return self._whole_of[(sp.input_hash, a)]

    def _states(self, sp: Spine, a: int) -> tuple[tuple[str, ...], IntArray | None]:
        """The combine step's segment parts (the measure stage's segments: a state's FIPS, or a run of small
        states) and each level-a unit's index among them; none when the levels below the ``all`` part are absent
        or the spine has no states."""
        segs = self.product.segmentation(sp)
        of_a = segs.segment_of(a) if a < len(segs.of_unit) else None
        if of_a is None or not segs.ids or self._whole(sp, a) >= sp.n_levels - 1:
            return (), None
        return segs.ids, of_a

    def post_steps(self, public: Mapping[str, Any]) -> list[PostStep]:
        sp, a, anc = self._layout(public)
        blocks = np.bincount(anc[-1], minlength=sp.n_units(a))  # a subtree's work grows with its blocks
        codes, of_a = self._states(sp, a)
        if of_a is None:
            steps = [PostStep("combine", ("all",))]
        else:
            per_state = np.bincount(of_a, weights=blocks, minlength=len(codes))
            steps = [PostStep("combine", ("all", *codes), weights=(float(per_state.max()), *per_state.tolist()),
                              batch_weight=BATCH_BLOCKS * COMBINE_BATCH)]
        steps.append(PostStep("level-0", ("root",)))
        for l in range(1, sp.n_levels):
            if l <= a:
                steps.append(PostStep(f"level-{l}", ("all",)))
            else:  # parts = level-a units with descendants at level l; part s reads level l-1's part s only
                units = np.unique(anc[l])
                steps.append(PostStep(f"level-{l}", tuple(str(int(s)) for s in units), chained=l > a + 1,
                                      weights=tuple(float(blocks[s]) for s in units), batch_weight=BATCH_BLOCKS))
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
        """The level's combined answers: all of them, or (``part``: a level-a unit) those of that unit's
        subtree only — its own tables, so a part never reads or filters another part's answers."""
        templates = self._templates()[level]
        names = [_answers_name(level, t.name, part) for t in templates]
        where = "all"
        if part is not None:
            sp = self.product.spine(self._public)
            a = partition_level(sp)
            codes, of_a = self._states(sp, a)
            if of_a is not None and level > self._whole(sp, a):
                where = codes[int(of_a[int(part)])]
        tables = source.part("combine", where, names)
        return [_answers_from_table(t, tables[n]) for t, n in zip(templates, names, strict=True)]

    def _combine_all(self, sp: Spine, a: int, anc: list[IntArray], source: PartSource) -> Tables:
        """The combine step's ``all`` part: the levels down to :meth:`_whole`, read whole (after the bottom-up
        pass when configured); levels up to a as one table per group, deeper ones per level-a subtree."""
        st = self.product.config.strategy
        opts = self.product.config.options
        whole = self._whole(sp, a)
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
                    out.update(_subtree_tables(l, g, anc[l], np.unique(anc[l])))
        return out

    def _combine_state(self, sp: Spine, a: int, anc: list[IntArray], source: PartSource, state: str) -> Tables:
        """The combine step's part of one segment (``state``: a state, or a run of small states): the levels
        below :meth:`_whole`, one table per level, group and level-a subtree of the segment, from the segment of
        each key only (raw answers: the bottom-up pass does not reach these levels)."""
        st = self.product.config.strategy
        codes, of_a = self._states(sp, a)
        assert of_a is not None
        code = codes.index(state)
        out: Tables = {}
        for l in range(self._whole(sp, a) + 1, sp.n_levels):
            subtrees = np.unique(anc[l])
            subtrees = subtrees[of_a[subtrees] == code]
            for g, template in zip(st.per_level[l].groups, self._templates()[l], strict=True):
                key = measurement_key(st.levels[l], g.name)
                segments = source.measurement_segments(key)
                if segments is None:  # a key drawn whole (no measured unit below the state level)
                    table = source.measurements([key])[key].table
                elif state in segments:
                    table = source.measurement_segment(key, state).table
                else:  # no measured unit of this segment at the level
                    out.update(_subtree_tables(l, template, anc[l], subtrees))
                    continue
                out.update(_subtree_tables(l, group_answers_of(st, g, table), anc[l], subtrees))
        return out

    def post_part(self, step: str, part: str, source: PartSource, public: Mapping[str, Any]) -> Tables:
        sp, a, anc = self._layout(public)
        opts = self.product.config.options
        self._public = public
        if step == "combine":
            if part == "all":
                return self._combine_all(sp, a, anc, source)
            return self._combine_state(sp, a, anc, source, part)
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
                s = int(part)
                parents = np.flatnonzero(anc[level - 1] == s).astype(np.int64)
                parent_hist = _hist_from(source.part(f"level-{level - 1}", "all" if level - 1 == a else part))
            res = estimate_families(sp, level, parents, parent_hist,
                                    self._groups(source, level, None if level <= a else part), opts,
                                    constraints=constraints)
        return _hist_table(res.hist, res.status, res.iterations, time.perf_counter() - t0,
                           time.process_time() - c0)

    def post_combine(self, steps: Sequence[PostStep], source: PartSource,
                     public: Mapping[str, Any]) -> CombinedEstimates:
        """The estimates streamed part by part (``TableStream``): each level's histogram and the block table
        one level-a subtree at a time, never the nation's; the diagnostics (solver statuses, consistency with
        the parent level, invariant violations) are running aggregates over the parts, reported after the
        streams. Same rows, order and figures as one concatenation of the parts."""
        sp, a, anc = self._layout(public)
        constraints = self.product.constraints(public)
        total = self._total(public)
        levels = [(int(st.name.removeprefix("level-")), st) for st in steps if st.name.startswith("level-")]
        reports: dict[int, LevelReport] = {}
        est: CombinedEstimates = {}
        for level, step in levels:
            est[f"internal/{sp.levels[level]}"] = TableStream(_HIST_SCHEMA, functools.partial(
                self._level_tables, sp, a, anc, level, step, source, total, constraints, reports))
        last, last_step = levels[-1]
        est["block"] = TableStream(_BLOCK_SCHEMA, functools.partial(self._block_tables, sp, anc, last, last_step,
                                                                    source))
        est["diagnostics"] = lambda: pd.DataFrame([reports[level].__dict__ for level, _ in levels])
        est["invariants"] = invariant_listing(sp, self.product.total(public), constraints)
        return est

    def _hists(self, anc: Sequence[IntArray], level: int, step: PostStep,
               source: PartSource) -> Iterator[tuple[str, Tables, Histogram, Histogram | None]]:
        """Per part of the level: its tables, its histogram, and the rows to emit — sorted by (unit, cell) so
        that the emitted rows' concatenation is sorted. Part by part where the level's units are ordered by
        their level-a subtree (the spine's path order); on any other spine all parts are emitted together with
        the last one."""
        ordered = anc[level].size == 0 or bool((anc[level][1:] >= anc[level][:-1]).all())
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

    def _level_tables(self, sp: Spine, a: int, anc: Sequence[IntArray], level: int, step: PostStep,
                      source: PartSource, total: int | None, constraints: Constraints | None,
                      reports: dict[int, LevelReport]) -> Iterator[pa.Table]:
        """One level's histogram, part by part; its ``LevelReport`` (running sums) in ``reports`` at the end."""
        status: dict[str, int] = {}
        secs = cpu = 0.0
        iters = viol = bad = 0
        states = constraints is not None and constraints.has_states and constraints.state_level == level
        sums = np.zeros(0 if constraints is None or constraints.state_totals is None
                        else constraints.state_totals.size, dtype=np.int64)
        whole_parent: Histogram | None = None
        for part, tables, h, out in self._hists(anc, level, step, source):
            st = tables["status"]
            for k, v in zip(st.column("STATUS").to_pylist(), st.column("COUNT").to_pylist(), strict=True):
                status[k] = status.get(k, 0) + int(v)
            run = tables["run"]
            iters = max(iters, int(run.column("ITERATIONS")[0].as_py()))
            secs += float(run.column("SECONDS")[0].as_py())
            cpu += float(run.column("CPU_SECONDS")[0].as_py())
            if level == 0:
                viol += 0 if total is None else int(h.count.sum() != total)
            elif level - 1 > a:
                viol += _violations(sp, level, h, _hist_from(source.part(f"level-{level - 1}", part)))
            else:  # the parent level is one part: read once, restricted to this part's parents
                if whole_parent is None:
                    whole_parent = _hist_from(source.part(f"level-{level - 1}", "root" if level == 1 else "all"))
                parent = whole_parent
                if level > a:
                    keep = anc[level - 1][parent.unit] == int(part)
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

    def _block_tables(self, sp: Spine, anc: Sequence[IntArray], level: int, step: PostStep,
                      source: PartSource) -> Iterator[pa.Table]:
        """The block estimates (GEOID, CELL, COUNT) part by part."""
        for _, _, _, h in self._hists(anc, level, step, source):
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
