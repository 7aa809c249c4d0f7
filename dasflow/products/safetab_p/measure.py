"""Noise for one planned key (Algorithms 2-5), exact integer samplers only.

Stage 1 (``…/stage1``): a noisy total of every non-TotalOnly group of the (region type, level) — its whole public
domain, zeros included (W6). Stage 2 (``…/stage2``) reads the committed stage-1 noisy totals from
``prepared[<stage-1 key>]`` (the DAG adds them with :func:`with_stage1` after committing stage 1); its query SHAPE
comes from ``stat_level = digitize(noisy_total, (θ1, θ2, θ3))`` (strict <: a total equal to θ_k goes up), its
budget is fixed by the plan:

- TotalOnly group: one count, budget ρ_i/s;
- stat 0: the total; stat 1/2/3: every Sex × AGE4/AGE9/AGE23 cell of the public domain (empty cells included),
  each with (1−γ)ρ_i/s.

The stage-1 totals are never published (ST7); only stage 2 feeds the outputs.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.errors import DasflowError
from dasflow.privacy import samplers
from dasflow.products.base import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    MeasurementSpec,
    NoisyMeasurement,
)
from dasflow.products.safetab_p.plan import AGE_BINS
from dasflow.products.safetab_p.records import MAX_AGE
from dasflow.products.safetab_p.tabulate import binned_cells, group_totals

IntArray = npt.NDArray[np.int64]
#: prepared frames by name (``Prepared``, or a partitioned preprocess's frames combined when read)
Frames = Mapping[str, pd.DataFrame]
TOTAL_ONLY_STAT = -1


def sparse_key(universe: str, region_type: str, level: int) -> str:
    """Prepared key of the sparse (GROUP, CELL, COUNT) counts of one (region type, level)."""
    return f"counts/{universe}/{region_type}/{level}"


def regions_key(universe: str, region_type: str) -> str:
    """Prepared key of the public region IDs (row i = region index i)."""
    return f"regions/{universe}/{region_type}"


def iterations_key(level: int, iteration_set: str = "all") -> str:
    """Prepared key of the public iteration list (ITERATION_CODE, TOTAL_ONLY) of a level restricted to a
    region granularity (``"detailed"``/``"coarse"``; ``"all"`` = granularity rule off)."""
    return f"iterations/{level}" if iteration_set == "all" else f"iterations/{level}/{iteration_set}"


def spec_iterations_key(spec: MeasurementSpec) -> str:
    """The prepared iteration list a key's groups are numbered over."""
    d = spec.detail
    return iterations_key(d["iteration_level"], d.get("iteration_set", "all"))


def stage1_key(spec: MeasurementSpec) -> str:
    """Where stage 2 finds the committed stage-1 NOISY table inside ``prepared``: the stage-1 ledger key."""
    return spec.key.rsplit("/", 1)[0] + "/stage1"


class WithStage1(Mapping[str, pd.DataFrame]):
    """``prepared`` with committed stage-1 tables added on top, without copying it (a partitioned preprocess's
    frames are combined only when read: copying would combine every name at once)."""

    _base: Mapping[str, pd.DataFrame]
    _extra: dict[str, pd.DataFrame]

    def __init__(self, prepared: Mapping[str, pd.DataFrame], extra: Mapping[str, pd.DataFrame]) -> None:
        if isinstance(prepared, WithStage1):
            extra = {**prepared._extra, **extra}
            prepared = prepared._base
        self._base = prepared
        self._extra = dict(extra)

    def __getitem__(self, key: str) -> pd.DataFrame:
        return self._extra[key] if key in self._extra else self._base[key]

    def __contains__(self, key: object) -> bool:
        return key in self._extra or key in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._extra
        yield from (k for k in self._base if k not in self._extra)

    def __len__(self) -> int:
        return len(self._extra) + sum(1 for k in self._base if k not in self._extra)


def with_stage1(prepared: Mapping[str, pd.DataFrame], stage1: NoisyMeasurement) -> Mapping[str, pd.DataFrame]:
    """``prepared`` holding the committed stage-1 measurement too, as stage 2's ``measure`` needs it."""
    return WithStage1(prepared, {stage1.spec.key: stage1.table})


def draw(spec: MeasurementSpec, noise: Fraction, size: int, rng: Any) -> IntArray:
    """``size`` i.i.d. draws of the key's mechanism with σ² / b = ``noise`` (zeros when noise is off)."""
    if spec.mechanism == "none" or noise == 0 or size == 0:
        return np.zeros(size, dtype=np.int64)
    if spec.mechanism == "discrete_gaussian":
        out = samplers.discrete_gaussian(noise, size, rng)
    elif spec.mechanism == "two_sided_geometric":
        out = samplers.two_sided_geometric(noise, size, rng)
    else:
        raise DasflowError(f"unknown mechanism {spec.mechanism!r}")
    return np.asarray(out, dtype=np.int64)


def _labels(prepared: Frames, spec: MeasurementSpec, groups: IntArray) -> dict[str, Any]:
    d = spec.detail
    regions = prepared[regions_key(d["universe"], d["region_type"])]["REGION_ID"].to_numpy(dtype=object)
    its = prepared[spec_iterations_key(spec)]["ITERATION_CODE"].to_numpy(dtype=object)
    n_it = len(its)
    # region and iteration indices in int32 arithmetic (group ids of a key are < n_regions · n_iterations)
    small = groups.astype(np.int32) if len(regions) * max(n_it, 1) < 1 << 31 else groups
    region, iteration = np.divmod(small, n_it)
    return {
        "GROUP": groups,
        "REGION_ID": pd.Categorical.from_codes(region.astype(np.int32, copy=False),
                                               categories=pd.Index(regions, dtype=object), validate=False),
        "REGION_TYPE": _constant(d["region_type"], len(groups)),
        "ITERATION_CODE": pd.Categorical.from_codes(iteration.astype(np.int32, copy=False),
                                                    categories=pd.Index(its, dtype=object), validate=False),
    }


def _constant(value: str, n: int) -> pd.Categorical:
    return pd.Categorical.from_codes(np.zeros(n, np.int8), categories=pd.Index([value], dtype=object))


def _variance_column(v: Fraction | float, n: int) -> npt.NDArray[np.float64]:
    return np.full(n, float(v), dtype=np.float64)


def segment_ids(spec: MeasurementSpec) -> list[str] | None:
    """The region segments of a key planned with ``segment_regions`` (``r{first}-{end}``: region indices
    first..end-1, in region order, covering every region once); None for a key measured whole."""
    per = spec.detail.get("segment_regions")
    n = int(spec.detail["n_regions"])
    if not per or n == 0:
        return None
    return [f"r{lo}-{min(lo + int(per), n)}" for lo in range(0, n, int(per))]


def segment_regions(spec: MeasurementSpec, segment: str) -> tuple[int, int]:
    """The region index range [first, end) of one of the key's segments (:func:`segment_ids`)."""
    if segment not in (segment_ids(spec) or []):
        raise DasflowError(f"safetab-p: {spec.key} has no segment {segment!r}")
    first, end = segment[1:].split("-")
    return int(first), int(end)


def _domain(prepared: Frames, spec: MeasurementSpec,
            regions: tuple[int, int] | None = None) -> tuple[IntArray, IntArray, int, int]:
    """(two-stage group ids, TotalOnly group ids, first group, end group) over the public domain of the key or of
    a region range [first, end) of it, in group order (group = region · n_iterations + iteration)."""
    d = spec.detail
    total_only = prepared[spec_iterations_key(spec)]["TOTAL_ONLY"].to_numpy(dtype=bool)
    n_it = len(total_only)
    first, end = (0, len(prepared[regions_key(d["universe"], d["region_type"])])) if regions is None else regions
    base = np.arange(first, end, dtype=np.int64)[:, None] * n_it

    def groups(iterations: IntArray) -> IntArray:
        return (base + iterations.astype(np.int64)[None, :]).ravel()  # in group order

    return groups(np.flatnonzero(~total_only)), groups(np.flatnonzero(total_only)), first * n_it, end * n_it


def _sparse(prepared: Frames, spec: MeasurementSpec, low: int, high: int, whole: bool) -> pd.DataFrame:
    """The key's sparse (GROUP, CELL, COUNT) counts with low <= GROUP < high: the whole frame for a key measured
    whole; for a segment only its rows (``rows`` of a partitioned preprocess reads only the partitions holding
    them; a whole frame, sorted by GROUP, is sliced)."""
    d = spec.detail
    name = sparse_key(d["universe"], d["region_type"], d["iteration_level"])
    if whole:
        return prepared[name]
    rows = getattr(prepared, "rows", None)
    if callable(rows):
        part: pd.DataFrame = rows(name, "GROUP", low, high)
        return part
    frame = prepared[name]
    i, j = np.searchsorted(frame["GROUP"].to_numpy(), [low, high])
    return frame.iloc[i:j].reset_index(drop=True)


def _totals(sparse: pd.DataFrame, low: int, high: int) -> IntArray:
    """True total per group of [low, high) (zeros included), indexed by group − low."""
    if low == 0:
        return group_totals(sparse, high)
    index = sparse["GROUP"].to_numpy() - low
    return np.bincount(index, weights=sparse["COUNT"].to_numpy(), minlength=high - low).astype(np.int64)


def measure_stage1(prepared: Frames, spec: MeasurementSpec, rng: Any,
                   regions: tuple[int, int] | None = None) -> NoisyMeasurement:
    """Noisy totals of every non-TotalOnly group (Alg. 2 line 15), budget γρ_i/s each: of the whole key, or of
    the groups of a region range (one segment of the key)."""
    two, _, low, high = _domain(prepared, spec, regions)
    totals = _totals(_sparse(prepared, spec, low, high, regions is None), low, high)
    noisy = totals[two - low] + draw(spec, spec.noise, len(two), rng)
    table = pd.DataFrame({**_labels(prepared, spec, two), NOISY_COLUMN: noisy,
                          VARIANCE_COLUMN: _variance_column(spec.variance, len(two)),
                          MECHANISM_COLUMN: _constant(spec.mechanism, len(two))}, copy=False)
    return NoisyMeasurement(spec, table, getattr(rng, "mode", "unknown"))


def stat_levels(noisy_totals: IntArray, thresholds: tuple[Fraction, Fraction, Fraction]) -> IntArray:
    """numpy.digitize semantics (θ_k ≤ total → at least k), exact: integer totals against ⌈θ_k⌉."""
    edges = np.array([math.ceil(t) for t in thresholds], dtype=np.int64)
    return np.digitize(noisy_totals, edges).astype(np.int64)


def age_ranges(stat: int) -> tuple[IntArray, IntArray]:
    """AGESTART/AGEEND of the bins of stat level 1..3 (bin edges; the last bin ends at 115)."""
    edges = np.array((0, *AGE_BINS[stat]), dtype=np.int64)
    ends = np.append(edges[1:] - 1, MAX_AGE)
    return edges, ends


def measure_stage2(prepared: Frames, spec: MeasurementSpec, rng: Any, regions: tuple[int, int] | None = None,
                   stage1: pd.DataFrame | None = None) -> NoisyMeasurement:
    """Step 2 of Alg. 2 for every group, shapes from the committed stage-1 totals in ``prepared``; or for the
    groups of a region range (one segment), shapes from ``stage1``, the same segment of the stage-1 key."""
    d = spec.detail
    s1_key = stage1_key(spec)
    if stage1 is None:
        if s1_key not in prepared:
            raise DasflowError(f"{spec.key} needs the committed stage-1 measurement {s1_key} in prepared "
                               "(use safetab_p.measure.with_stage1)")
        stage1 = prepared[s1_key]
    two, to, low, high = _domain(prepared, spec, regions)
    if not np.array_equal(stage1["GROUP"].to_numpy(), two):
        raise DasflowError(f"stage-1 table {s1_key} does not cover the public group domain of {spec.key}"
                           + ("" if regions is None else f" in regions {regions[0]}-{regions[1]}"))
    sparse = _sparse(prepared, spec, low, high, regions is None)
    totals = _totals(sparse, low, high)
    two_index, to_index = two - low, to - low
    stat = stat_levels(stage1[NOISY_COLUMN].to_numpy(dtype=np.int64), d["thresholds"])
    names = ("g", "st", "sex", "start", "end", "noisy", "var")
    cols: dict[str, list[npt.NDArray[Any]]] = {k: [] for k in names}

    def part(groups: IntArray, st: int, sex: IntArray | int, start: IntArray | int, end: IntArray | int,
             true: IntArray, noise: Fraction, variance: Fraction | float) -> None:
        n = len(groups)
        cols["g"].append(groups)
        cols["st"].append(np.full(n, st, dtype=np.int8))
        cols["sex"].append(np.broadcast_to(np.asarray(sex, dtype=np.int8), (n,)))
        cols["start"].append(np.broadcast_to(np.asarray(start, dtype=np.int16), (n,)))
        cols["end"].append(np.broadcast_to(np.asarray(end, dtype=np.int16), (n,)))
        cols["noisy"].append(true + draw(spec, noise, n, rng))
        cols["var"].append(np.full(n, float(variance), dtype=np.float64))

    # TotalOnly groups: one count with the group's whole budget ρ_i/s
    part(to, TOTAL_ONLY_STAT, 0, -1, -1, totals[to_index], d["total_only_noise"], d["total_only_variance"])
    g0 = stat == 0
    part(two[g0], 0, 0, -1, -1, totals[two_index[g0]], spec.noise, spec.variance)
    del totals
    for k in (1, 2, 3):
        gk = two[stat == k]
        bins = np.array(AGE_BINS[k], dtype=np.int64)
        nb = len(bins) + 1
        cells = binned_cells(sparse, gk, bins)  # (groups, sex, bin)
        starts, ends = age_ranges(k)
        part(np.repeat(gk, 2 * nb), k, np.tile(np.repeat(np.array([1, 2]), nb), len(gk)),
             np.tile(starts, 2 * len(gk)), np.tile(ends, 2 * len(gk)), cells.reshape(len(gk) * 2 * nb),
             spec.noise, spec.variance)
    groups = np.concatenate(cols["g"])
    columns = _labels(prepared, spec, groups)
    for name, key in (("STAT_LEVEL", "st"), ("SEX", "sex"), ("AGESTART", "start"), ("AGEEND", "end"),
                      (NOISY_COLUMN, "noisy"), (VARIANCE_COLUMN, "var")):
        columns[name] = np.concatenate(cols[key])
        cols[key] = []
    columns[MECHANISM_COLUMN] = _constant(spec.mechanism, len(groups))
    table = pd.DataFrame(columns, copy=False)  # the columns as built: no copy, no consolidation
    return NoisyMeasurement(spec, table, getattr(rng, "mode", "unknown"))
