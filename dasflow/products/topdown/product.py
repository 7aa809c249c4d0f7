"""The TopDown product (DESIGN §3): plan → prepare → measure → postprocess → tables.

One plan key per (geolevel, query group): ``topdown/<level>/<group>``; the key's NoisyMeasurement holds one
row per measured geounit (γ > 0) with its noisy answer vector. Budget of a key = ρ·β_l·α_i (ε·β_l·α_i under
pure DP); the keys compose to ρ·Σβ·Σα = ρ. After Alg 3 a geounit's γ may differ from β_l (PLB moved up a
path); Theorem 3 bounds the loss by the path sum of γ, which the spine certifies equals Σβ for every block
(S14), so the plan's sequential total is still exactly the release's loss. The key's ``noise`` is the nominal
σ² at γ = β_l; ``detail["noise_by_gamma"]`` lists the σ² of every γ actually used.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import InputError
from dasflow.products.base import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    Estimates,
    MeasurementSpec,
    Mechanism,
    NoisyMeasurement,
    Prepared,
)
from dasflow.products.topdown.estimate import (
    Constraints,
    EstimatorOptions,
    GroupAnswers,
    Histogram,
    LevelReport,
    estimate_topdown,
)
from dasflow.products.topdown.invariants import (
    BLOCK_FACTS_FILE,
    INVARIANTS_FILE,
    STRUCTURAL_ATTRIBUTE,
    block_masks,
    check_gq_types,
    level_masks,
    parse_state_invariants,
    structural_cell_codes,
)
from dasflow.products.topdown.measure import (
    SEGMENT_BLOCKS,
    GroupMeasurement,
    StateSegments,
    block_histogram,
    level_histograms,
    measure_group,
    measured_units,
    noise_parameter,
    noise_variance,
    state_segments,
)
from dasflow.products.topdown.spine import Spine, SpineConfig, build_spine
from dasflow.products.topdown.strategy import CHANGE_ONE_SENSITIVITY, QueryGroup, Strategy

IntArray = npt.NDArray[np.int64]

#: Standard (published) geolevels and their GEOID prefix lengths (S21: from the block GEOID only).
STANDARD_LEVELS: tuple[tuple[str, int], ...] = (
    ("US", 0), ("state", 2), ("county", 5), ("tract", 11), ("block_group", 12), ("block", 15),
)


INVARIANT_KINDS = ("total", "state")

#: Block rows the release tables aggregate at least per chunk (whole states; a larger state alone): the per-chunk
#: fixed cost (a group-by per table, its validation) is paid per this many rows, not per small state.
TABLE_CHUNK_ROWS = 1_000_000


@dataclass(frozen=True)
class TopDownConfig:
    """Spine settings, strategy (levels must match the spine's), invariants and solver options.

    ``invariants``: which population totals are held exactly — any of ``"total"`` (the root) and ``"state"``
    (each state); ``None`` = what the 2020 DAS held, total and state, unless ``total_invariant=False`` (the
    older switch: then none). ``structural_zeros``: impose the public block facts (``None`` = whenever the
    schema has the HHGQ attribute). ``segment_blocks``: the public bound on a measurement segment (keys below the
    state level are drawn per segment: one state, consecutive states of at most this many blocks together, or a
    chunk of at most this many blocks of a larger state's counties)."""

    spine: SpineConfig
    strategy: Strategy
    total_invariant: bool = True
    options: EstimatorOptions = field(default_factory=EstimatorOptions)
    invariants: tuple[str, ...] | None = None
    structural_zeros: bool | None = None
    segment_blocks: int = SEGMENT_BLOCKS

    def __post_init__(self) -> None:
        if isinstance(self.segment_blocks, bool) or not isinstance(self.segment_blocks, int) \
                or self.segment_blocks < 1:
            raise InputError("topdown: segment_blocks must be a positive integer", column="segment_blocks")
        if tuple(self.strategy.levels) != tuple(self.spine.levels):
            raise InputError(f"topdown: strategy levels {self.strategy.levels} ≠ spine levels "
                             f"{self.spine.levels}")
        if tuple(self.strategy.beta) != tuple(self.spine.beta):
            raise InputError("topdown: strategy β and spine β differ")
        if self.invariants is not None:
            unknown = sorted(set(self.invariants) - set(INVARIANT_KINDS))
            if unknown:
                raise InputError(f"topdown: unknown invariant(s) {unknown}; known {list(INVARIANT_KINDS)}",
                                 column="invariants")
            if not self.total_invariant and "total" in self.invariants:
                raise InputError("topdown: total_invariant = false contradicts invariants holding 'total'",
                                 column="invariants")
        if self.structural_zeros and STRUCTURAL_ATTRIBUTE not in self.strategy.schema.names:
            raise InputError(f"topdown: structural zeros need the {STRUCTURAL_ATTRIBUTE} attribute in the schema",
                             column="structural_zeros")

    @property
    def invariant_kinds(self) -> tuple[str, ...]:
        if self.invariants is not None:
            return tuple(k for k in INVARIANT_KINDS if k in self.invariants)
        return INVARIANT_KINDS if self.total_invariant else ()

    @property
    def uses_structural_zeros(self) -> bool:
        if self.structural_zeros is not None:
            return self.structural_zeros
        return STRUCTURAL_ATTRIBUTE in self.strategy.schema.names


def _key(level: str, group: str) -> str:
    return f"topdown/{level}/{group}"


class TopDown:
    """TopDown on the optimised spine. ``public`` carries ``blocks`` (the block geography) or a built
    ``spine``; optional ``spine_cache_dir``; ``invariants`` = ``{"total": N, "state": {FIPS: n}}`` as configured
    and ``block_facts`` (a DataFrame in the ``block_facts.csv`` format of :mod:`.invariants`; optional
    ``block_facts_source``) when structural zeros are on."""

    name = "topdown"

    def __init__(self, config: TopDownConfig) -> None:
        self.config = config
        self._spines: dict[str, Spine] = {}
        self._masks: dict[tuple[str, int], tuple[pd.DataFrame, IntArray]] = {}
        self._by_blocks: dict[int, tuple[pd.DataFrame, SpineConfig, Spine]] = {}
        self._segments: dict[str, StateSegments] = {}
        self._constraints: dict[tuple[str, int, int], tuple[Any, Any, Constraints | None]] = {}

    # -- public helpers ----------------------------------------------------------------------------------
    def spine(self, public: Mapping[str, Any], config: TopDownConfig | None = None) -> Spine:
        """The spine from public geography only (built once per input hash; S20)."""
        cfg = config or self.config
        if "spine" in public:
            sp: Spine = public["spine"]
            self._spines[sp.input_hash] = sp
            return sp
        if "blocks" not in public:
            raise InputError("topdown: public inputs need 'blocks' (block geography) or a built 'spine'")
        blocks: pd.DataFrame = public["blocks"]
        held = self._by_blocks.get(id(blocks))
        if held is not None and held[0] is blocks and held[1] is cfg.spine:
            return held[2]   # the same geography object and settings: built once per product (prepare, facts)
        sp = build_spine(blocks, cfg.spine, source=str(public.get("blocks_source", "<blocks>")),
                         cache_dir=public.get("spine_cache_dir"))
        self._spines[sp.input_hash] = sp
        self._by_blocks[id(blocks)] = (blocks, cfg.spine, sp)
        return sp

    def block_mask(self, public: Mapping[str, Any]) -> IntArray | None:
        """Allowed structural codes per block (internal order) from the public block facts; ``None`` when
        structural zeros are off or no facts were given (``constraints`` refuses the latter)."""
        if not self.config.uses_structural_zeros or public.get("block_facts") is None:
            return None
        sp = self.spine(public)
        facts: pd.DataFrame = public["block_facts"]
        key = (sp.input_hash, id(facts))
        if key not in self._masks or self._masks[key][0] is not facts:
            source = str(public.get("block_facts_source", BLOCK_FACTS_FILE))
            n_codes = dict(self.config.strategy.schema.attributes)[STRUCTURAL_ATTRIBUTE]
            if isinstance(public.get("blocks"), pd.DataFrame):
                check_gq_types(public["blocks"], facts, n_codes, str(public.get("blocks_source", "<blocks>")),
                               source)
            self._masks[key] = (facts, block_masks(sp, facts, n_codes, source))
        return self._masks[key][1]

    def constraints(self, public: Mapping[str, Any]) -> Constraints | None:
        """The estimator's public constraints (state totals, structural zeros) as configured; InputError naming
        the public file and key when one is missing or inconsistent. ``None`` when there are none."""
        sp = self.spine(public)
        inv = public.get("invariants") or {}
        facts = public.get("block_facts")
        held = self._constraints.get((sp.input_hash, id(inv), id(facts)))
        if held is not None and held[0] is inv and held[1] is facts:
            return held[2]  # the same public objects: built once per process (every post-processing part asks)
        found = self._build_constraints(public, sp, inv)
        self._constraints[(sp.input_hash, id(inv), id(facts))] = (inv, facts, found)
        return found

    def _build_constraints(self, public: Mapping[str, Any], sp: Spine, inv: Mapping[str, Any]
                           ) -> Constraints | None:
        cfg = self.config
        kinds = cfg.invariant_kinds
        kw: dict[str, Any] = {}
        if "state" in kinds:
            if "state" not in inv:
                raise InputError("the state invariants are configured but 'state' is missing", file=INVARIANTS_FILE,
                                 column="state")
            level, of_unit, labels, totals = parse_state_invariants(inv["state"], sp)
            if "total" in kinds and "total" in inv and int(inv["total"]) != int(totals.sum()):
                raise InputError(f"the state populations sum to {int(totals.sum())}, not the total "
                                 f"{inv['total']}", file=INVARIANTS_FILE, column="state")
            kw.update(state_level=level, state_of_unit=of_unit, state_labels=labels, state_totals=totals)
        if cfg.uses_structural_zeros:
            if public.get("block_facts") is None:
                raise InputError("structural zeros are configured but the public block facts are missing",
                                 file=BLOCK_FACTS_FILE)
            bm = self.block_mask(public)
            assert bm is not None
            kw.update(cell_code=structural_cell_codes(cfg.strategy.schema), allowed=tuple(level_masks(sp, bm)))
        return Constraints(**kw) if kw else None

    def group_answers(self, measurements: Mapping[str, NoisyMeasurement]) -> list[list[GroupAnswers]]:
        """NMF tables → per level, the query groups' answers (the estimator's input)."""
        st = self.config.strategy
        per_level: list[list[GroupAnswers]] = []
        for l, level in enumerate(st.levels):
            groups = []
            for g in st.per_level[l].groups:
                key = _key(level, g.name)
                if key not in measurements:
                    raise InputError(f"topdown: measurement {key} missing")
                groups.append(group_answers_of(st, g, measurements[key].table))
            per_level.append(groups)
        return per_level

    # -- Product interface ---------------------------------------------------------------------------------
    def plan(self, config: TopDownConfig | None, public: Mapping[str, Any]) -> list[MeasurementSpec]:
        """Every (geolevel, query group) key with budget ρβα and its σ² (data-independent)."""
        cfg: TopDownConfig = config if isinstance(config, TopDownConfig) else self.config
        sp = self.spine(public, cfg)
        st = cfg.strategy
        mech: Mechanism = "discrete_gaussian" if st.privacy_defn == "zcdp" else "two_sided_geometric"
        specs: list[MeasurementSpec] = []
        for l, level in enumerate(st.levels):
            units = measured_units(sp, l)
            vals, counts = np.unique(sp.gamma_num[l][units], return_counts=True)
            for g in st.per_level[l].groups:
                nominal = noise_parameter(st, st.beta[l], g.alpha)
                by_gamma = {str(Fraction(int(v), sp.denominator)):
                            str(noise_parameter(st, Fraction(int(v), sp.denominator), g.alpha)) for v in vals}
                specs.append(MeasurementSpec(
                    product=self.name, key=_key(level, g.name), level=level,
                    privacy_defn="zcdp" if st.privacy_defn == "zcdp" else "puredp", mechanism=mech,
                    budget=st.budget * st.beta[l] * g.alpha, sensitivity=CHANGE_ONE_SENSITIVITY,
                    noise=nominal, cells=int(units.size) * g.n_rows(st.schema),
                    variance=noise_variance(st, nominal),
                    detail={"level_index": l, "query_group": g.name, "keep": list(g.keep),
                            "alpha": str(g.alpha), "beta": str(st.beta[l]),
                            "sensitivity_note": "change-one-record neighbours: L1 = L2² = 2 (Lemma 4)",
                            "gamma_counts": {str(Fraction(int(v), sp.denominator)): int(c)
                                             for v, c in zip(vals, counts, strict=True)},
                            "noise_by_gamma": by_gamma, "spine_hash": sp.input_hash},
                ))
        return specs

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Tabulate persons (GEOID + schema attributes) onto every internal level (stability 1)."""
        sp = self.spine(public)
        persons: pd.DataFrame = inputs["persons"]
        bm = self.block_mask(public)
        bh = block_histogram(sp, persons, self.config.strategy.schema,
                             source=str(inputs.get("persons_source", "<persons>")),
                             structural=None if bm is None else (STRUCTURAL_ATTRIBUTE, bm))
        out: Prepared = {}
        for l, h in enumerate(level_histograms(sp, bh)):
            out[f"hist/{sp.levels[l]}"] = pd.DataFrame({"UNIT": h.unit, "CELL": h.cell, "COUNT": h.count})
        return out

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        """Noise for one planned key (exact samplers; generator spawned from the key)."""
        sp = self._spine_for(spec)
        l = int(spec.detail["level_index"])
        df = prepared[f"hist/{spec.level}"]
        hist = Histogram(df["UNIT"].to_numpy(np.int64), df["CELL"].to_numpy(np.int64),
                         df["COUNT"].to_numpy(np.int64))
        g = rng.spawn(spec.key)
        return self._measurement(sp, spec, measure_group(sp, self.config.strategy, l, self._group(spec), hist, g), g)

    def segments(self, spec: MeasurementSpec) -> list[str] | None:
        """The segments a key may be drawn in (public, from the spine and ``segment_blocks``): below the state
        level the segments (a state's FIPS code, ``"first-last"`` for a run of small states, ``"SS.k"`` for a
        chunk of a large state's counties, ``"SS.k.j"`` below a county above the bound) with a measured unit at
        the key's level; None for the keys at and above the state level (drawn whole)."""
        sp = self._spine_for(spec)
        return self.segmentation(sp).measured(sp, int(spec.detail["level_index"]))

    def measure_segment(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, segment: str,
                        rng: Any) -> NoisyMeasurement:
        """The key's noisy answers at the measured units of one segment (of :meth:`segments`), from ``prepared``
        holding its states' ``hist/<level>`` (their partitions' frames; rows of other states are ignored, a
        segment without persons may have none). Generator spawned from the key, then the segment, so the
        noise does not depend on which segments are drawn when or where. Privacy: each unit's answers get the
        noise of its γ_u exactly as in :meth:`measure`; the segments are disjoint units of the one planned key."""
        sp = self._spine_for(spec)
        l = int(spec.detail["level_index"])
        segs = self.segmentation(sp)
        if segs.segment_of(l) is None or segment not in segs.ids:
            raise InputError(f"topdown: {spec.key} has no segment {segment!r}")
        units = segs.measured_units(sp, l, segment)
        name = f"hist/{spec.level}"
        if name in prepared:
            df = prepared[name]
            hist = Histogram(df["UNIT"].to_numpy(np.int64), df["CELL"].to_numpy(np.int64),
                             df["COUNT"].to_numpy(np.int64))
            if units.size and bool((hist.unit[1:] >= hist.unit[:-1]).all()):  # a chunk: its units' rows only
                i, j = np.searchsorted(hist.unit, [units[0], units[-1] + 1])
                hist = Histogram(hist.unit[i:j], hist.cell[i:j], hist.count[i:j])
        else:
            hist = Histogram(*(np.zeros(0, dtype=np.int64) for _ in range(3)))
        g = rng.spawn(spec.key).spawn(f"segment/{segment}")
        gm = measure_group(sp, self.config.strategy, l, self._group(spec), hist, g, units=units)
        return self._measurement(sp, spec, gm, g)

    def segment_parts(self, spec: MeasurementSpec, segment: str) -> list[str]:
        """The preprocessing partitions (states, FIPS) holding a segment's counts (a chunk's: its state's)."""
        return list(self.segmentation(self._spine_for(spec)).members(segment))

    def segmentation(self, sp: Spine) -> StateSegments:
        """The spine's states as measurement segments (public; built once per spine)."""
        if sp.input_hash not in self._segments:
            self._segments[sp.input_hash] = state_segments(sp, self.config.segment_blocks)
        return self._segments[sp.input_hash]

    def _group(self, spec: MeasurementSpec) -> QueryGroup:
        l = int(spec.detail["level_index"])
        return next(g for g in self.config.strategy.per_level[l].groups if g.name == spec.detail["query_group"])

    def _measurement(self, sp: Spine, spec: MeasurementSpec, gm: GroupMeasurement, g: Any) -> NoisyMeasurement:
        table = pd.DataFrame({
            "GEOUNIT": sp.labels[gm.level][gm.units], "UNIT": gm.units,
            NOISY_COLUMN: list(gm.answers), VARIANCE_COLUMN: list(gm.variance),
            MECHANISM_COLUMN: spec.mechanism,
        })
        return NoisyMeasurement(spec=spec, table=table, rng_mode=str(getattr(g, "mode", "unknown")))

    def postprocess(self, measurements: Mapping[str, NoisyMeasurement], public: Mapping[str, Any]
                    ) -> Estimates:
        """Top-down estimation from the NMFs and public facts only."""
        sp = self.spine(public)
        total = self.total(public)
        cons = self.constraints(public)
        hists, reports = estimate_topdown(sp, self.group_answers(measurements), self.config.strategy.schema.n_cells,
                                          total, opts=self.config.options, constraints=cons)
        return estimates_from_histograms(sp, hists, reports, total, cons)

    def total(self, public: Mapping[str, Any]) -> int | None:
        """The configured root total invariant (``None`` if the total is not held)."""
        if "total" not in self.config.invariant_kinds:
            return None
        inv = public.get("invariants") or {}
        if "total" not in inv:
            raise InputError("topdown: the total invariant is configured but public['invariants']['total'] "
                             "is missing", file=INVARIANTS_FILE, column="total")
        return int(inv["total"])

    def tables(self, estimates: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        """Histograms per standard geolevel, aggregated from the block GEOIDs (consistent by construction): the
        chunks of :meth:`table_chunks` concatenated."""
        parts: dict[str, list[pd.DataFrame]] = {f"topdown_{name}": [] for name, _ in STANDARD_LEVELS}
        for name, chunk in self.table_chunks(estimates):
            parts[name].append(chunk)
        return {name: pd.concat(chunks, ignore_index=True) if len(chunks) > 1 else chunks[0]
                for name, chunks in parts.items()}

    def table_chunks(self, estimates: Mapping[str, pd.DataFrame]) -> Iterator[tuple[str, pd.DataFrame]]:
        """The published tables a run of whole states at a time (consecutive states until ``TABLE_CHUNK_ROWS``
        block rows, or one larger state): ``(table, chunk)`` pairs whose chunks, concatenated per table in the
        order given, are the table (rows sorted by GEOID then cell; every GEOID below the nation starts with its
        state's code, so chunks of whole states in order concatenate in order). The nation's row per cell is a
        running integer sum over the chunks. Blocks come from the estimates' ``groups`` reader when they have
        one (stored estimates: one state's blocks read at a time), else from the ``block`` frame. Every table
        gets at least one chunk."""
        n_cells = int(self.config.strategy.schema.n_cells)
        us = np.zeros(n_cells, dtype=np.int64)
        seen = np.zeros(n_cells, dtype=bool)
        grouped = getattr(estimates, "groups", None)
        states = grouped("block", "GEOID", 2) if callable(grouped) else _state_groups(estimates["block"])
        empty = True
        for b in _batched(states, TABLE_CHUNK_ROWS):
            cells, counts = b["CELL"].to_numpy(np.int64), b["COUNT"].to_numpy(np.int64)
            np.add.at(us, cells, counts)
            seen[cells] = True
            sums = _level_sums(b["GEOID"], cells, counts, n_cells)
            for name, width in STANDARD_LEVELS:
                if width:
                    agg = sums[width] if sums is not None else \
                        (pd.DataFrame({"GEOID": b["GEOID"].str[:width], "CELL": cells, "COUNT": counts})
                         .groupby(["GEOID", "CELL"], sort=True, as_index=False).sum())
                    yield f"topdown_{name}", self._geo_table(agg)
                    empty = False
        present = np.flatnonzero(seen)
        yield "topdown_US", self._geo_table(pd.DataFrame({"GEOID": ["US"] * present.size, "CELL": present,
                                                          "COUNT": us[present]}))
        if empty:
            none = pd.DataFrame({"GEOID": pd.Series([], dtype=object), "CELL": np.zeros(0, dtype=np.int64),
                                 "COUNT": np.zeros(0, dtype=np.int64)})
            for name, width in STANDARD_LEVELS:
                if width:
                    yield f"topdown_{name}", self._geo_table(none)

    def _geo_table(self, agg: pd.DataFrame) -> pd.DataFrame:
        """GEOID, the schema's attributes (from the cell index) and COUNT."""
        schema = self.config.strategy.schema
        attrs = np.unravel_index(agg["CELL"].to_numpy(np.int64), schema.shape)
        table = pd.DataFrame({"GEOID": agg["GEOID"]})
        for a, v in zip(schema.names, attrs, strict=True):
            table[a] = v
        table["COUNT"] = agg["COUNT"].to_numpy()
        return table

    def _spine_for(self, spec: MeasurementSpec) -> Spine:
        h = spec.detail.get("spine_hash", "")
        if h in self._spines:
            return self._spines[h]
        if len(self._spines) == 1:
            return next(iter(self._spines.values()))
        raise InputError("topdown: measure() needs the spine of the plan; call plan() with the same product")


#: characters of a block GEOID (state 2, county 3, tract 6, block 4)
BLOCK_GEOID_WIDTH = 15


def _level_sums(geoid: pd.Series, cells: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
                n_cells: int) -> dict[int, pd.DataFrame] | None:
    """Block rows summed to every standard level's (GEOID prefix, cell), keyed by prefix width: the frames
    ``groupby([GEOID.str[:width], CELL], sort=True, as_index=False).sum()`` gives, from integer keys instead
    of strings. Every block GEOID is 15 ASCII digits, so a prefix is the GEOID's integer divided by a power of
    ten, its order is the strings' order, and ``prefix · n_cells + cell`` orders as (GEOID, cell) does; each
    level is summed from the next finer one (integer sums: exact in any order). ``None`` where that does not
    hold (another GEOID form, a key that would not fit in 63 bits, a cell outside the schema, no rows): the
    caller groups the strings."""
    n = len(geoid)
    if n == 0 or 10 ** BLOCK_GEOID_WIDTH * n_cells >= 2**63 or cells.min() < 0 or cells.max() >= n_cells:
        return None
    text = pa.array(geoid, type=pa.string())
    if text.null_count or not pc.all(pc.equal(pc.utf8_length(text), BLOCK_GEOID_WIDTH)).as_py() \
            or not pc.all(pc.ascii_is_decimal(text)).as_py():
        return None
    geo = pc.cast(text, pa.int64()).to_numpy()
    key = geo * n_cells + cells
    rep = np.arange(n)  # a row of the chunk in each group, for its GEOID text
    out: dict[int, pd.DataFrame] = {}
    finer = BLOCK_GEOID_WIDTH
    for width in sorted((w for _, w in STANDARD_LEVELS if w), reverse=True):
        key = (key // n_cells) // 10 ** (finer - width) * n_cells + key % n_cells
        order = np.argsort(key, kind="stable")
        key, counts, rep = key[order], counts[order], rep[order]
        starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
        key, counts, rep = key[starts], np.add.reduceat(counts, starts), rep[starts]
        out[width] = pd.DataFrame({"GEOID": geoid.iloc[rep].str[:width].reset_index(drop=True),
                                   "CELL": key % n_cells, "COUNT": counts})
        finer = width
    return out


def _batched(frames: Iterable[pd.DataFrame], rows: int) -> Iterator[pd.DataFrame]:
    """Consecutive frames concatenated until they hold at least ``rows`` rows (the last batch may hold fewer):
    small states' blocks aggregated together, so a table's fixed cost per chunk is paid per ``rows``, not per
    state; memory stays bounded by ``rows`` plus the largest state."""
    held: list[pd.DataFrame] = []
    n = 0
    for frame in frames:
        held.append(frame)
        n += len(frame)
        if n >= rows:
            yield held[0] if len(held) == 1 else pd.concat(held, ignore_index=True)
            held, n = [], 0
    if held:
        yield held[0] if len(held) == 1 else pd.concat(held, ignore_index=True)


def measurement_key(level: str, group: str) -> str:
    """The plan key of a (level, query group): ``topdown/<level>/<group>``."""
    return _key(level, group)


def group_answers_of(st: Strategy, g: QueryGroup, table: pd.DataFrame) -> GroupAnswers:
    """One query group's NMF table (all of a key, or one segment of it) as the estimator's answers."""
    units = table["UNIT"].to_numpy(np.int64)
    answers = (np.stack(table[NOISY_COLUMN].to_list()) if len(table)
               else np.zeros((0, g.n_rows(st.schema)), dtype=np.int64))
    return GroupAnswers(g.name, g.row_index(st.schema), g.n_rows(st.schema), units, answers,
                        np.array([float(v) for v in table[VARIANCE_COLUMN]]), set(g.keep) == set(st.schema.names))


def _state_groups(block: pd.DataFrame) -> Iterator[pd.DataFrame]:
    """An in-memory block frame's rows per state (GEOID's first two characters), in state order."""
    for _, part in block.groupby(block["GEOID"].str[:2], sort=True):
        yield part


def invariant_listing(sp: Spine, total: int | None, cons: Constraints | None) -> pd.DataFrame:
    """What the estimation held exactly (the certificate's list of invariants): the total, each state's
    population, and per level the number of (unit, HHGQ code) pairs that were structural zeros."""
    rows: list[dict[str, Any]] = []
    if total is not None:
        rows.append({"KIND": "total", "SCOPE": sp.levels[0], "VALUE": int(total)})
    if cons is not None and cons.has_states and cons.state_totals is not None:
        rows += [{"KIND": "state", "SCOPE": k, "VALUE": int(v)}
                 for k, v in zip(cons.state_labels, cons.state_totals.tolist(), strict=True)]
    if cons is not None and cons.cell_code is not None:
        n_codes = int(cons.cell_code.max()) + 1
        for l, al in enumerate(cons.allowed):
            if al is not None:
                held = sum(int(np.count_nonzero((al >> k) & 1)) for k in range(n_codes))
                rows.append({"KIND": "structural_zeros", "SCOPE": sp.levels[l],
                             "VALUE": al.size * n_codes - held})
    return pd.DataFrame(rows, columns=["KIND", "SCOPE", "VALUE"])


def estimates_from_histograms(sp: Spine, hists: Sequence[Histogram], reports: Sequence[LevelReport],
                              total: int | None, constraints: Constraints | None) -> Estimates:
    """The estimates of a top-down pass: per internal level and per block, diagnostics, invariants held."""
    est: Estimates = {}
    for l, h in enumerate(hists):
        est[f"internal/{sp.levels[l]}"] = pd.DataFrame({"UNIT": h.unit, "CELL": h.cell, "COUNT": h.count})
    bh = hists[-1]
    est["block"] = pd.DataFrame({"GEOID": sp.block_geoid[bh.unit].astype(str), "CELL": bh.cell,
                                 "COUNT": bh.count})
    est["diagnostics"] = pd.DataFrame([r.__dict__ for r in reports])
    est["invariants"] = invariant_listing(sp, total, constraints)
    return est


def l1_report(estimates: Estimates, prepared: Prepared, levels: tuple[str, ...]) -> dict[str, float]:
    """Test mode only: per internal level, L1 distance between the estimate and the confidential truth."""
    out: dict[str, float] = {}
    for level in levels:
        e = estimates[f"internal/{level}"]
        t = prepared[f"hist/{level}"]
        m = e.merge(t, on=["UNIT", "CELL"], how="outer", suffixes=("_E", "_T")).fillna(0)
        out[level] = float((m["COUNT_E"] - m["COUNT_T"]).abs().sum())
    return out
