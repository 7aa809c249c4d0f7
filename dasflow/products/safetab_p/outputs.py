"""Post-processing of the stage-2 measurements into the t1/t2 release files (pure post-processing).

- T1 (``REGION_ID|REGION_TYPE|ITERATION_CODE|COUNT``): the TotalOnly count, the stat-0 total, or for stat ≥
  1 the sum
  of the group's released Sex × Age cells (free post-processing; the paper leaves T1 of such groups open).
- T2 (``…|AGESTART|AGEEND|SEX|COUNT``): the Sex × Age cells of groups with stat level ≥ 1, plus per sex a
  row with
  AGESTART = AGEEND = ``*`` holding the sum of that sex's cells.
- Zero suppression (production): for region types other than USA, STATE, PR-STATE a T1 count ≤ t is dropped, t
  the smallest integer with P(noise ≤ t) ≥ ``zero_suppression_chance`` for THAT count's noise distribution (a single
  draw for TotalOnly/stat-0 totals, the sum of 2·n_bins i.i.d. draws for a summed T1); no thresholding when the
  chance is 0 (t = −∞) or noise is off. Suppression uses the noisy value before any clamping.
- ``allow_negative_counts = false`` clamps every released count at 0 (after sums and suppression).
Nothing here reads private data: inputs are NoisyMeasurements and the public config.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from fractions import Fraction

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from pandas.api.types import union_categoricals

from dasflow.products.base import NOISY_COLUMN, Estimates, Mechanism, NoisyMeasurement
from dasflow.products.partition import CombinedEstimates, TableStream
from dasflow.products.safetab_p.config import SafeTabPConfig
from dasflow.products.safetab_p.plan import AGE_BINS
from dasflow.products.safetab_p.regions import UNSUPPRESSED_REGION_TYPES

T1_COLUMNS = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "COUNT"]
T2_COLUMNS = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "AGESTART", "AGEEND", "SEX", "COUNT"]


def noise_pmf(mechanism: Mechanism, noise: Fraction,
              n_terms: int = 1) -> tuple[int, npt.NDArray[np.float64]]:
    """pmf of the sum of ``n_terms`` i.i.d. noises on the integers −m..m: returns (m, pmf).

    Single term: discrete Gaussian ∝ exp(−x²/2σ²); two-sided geometric ∝ exp(−|x|/b). The support is cut where
    the tail mass is below 1e-17 and the n-fold convolution is done once in the Fourier domain.
    """
    v = float(noise)
    if mechanism == "discrete_gaussian":
        m1 = math.ceil(10.0 * math.sqrt(v)) + 2
        x = np.arange(-m1, m1 + 1, dtype=np.float64)
        p = np.exp(-(x * x) / (2.0 * v))
    else:
        m1 = math.ceil(40.0 * v) + 2
        x = np.arange(-m1, m1 + 1, dtype=np.float64)
        p = np.exp(-np.abs(x) / v)
    p /= p.sum()
    if n_terms == 1:
        return m1, p
    m = m1 * n_terms
    size = 2 * m + 1
    f = np.fft.rfft(p, size)
    out = np.fft.irfft(f ** n_terms, size)
    out = np.clip(out, 0.0, None)
    return m, out / out.sum()


def suppression_threshold(mechanism: Mechanism, noise: Fraction, n_terms: int, chance: Fraction) -> float:
    """The smallest integer t with P(noise ≤ t) ≥ chance (−inf for chance 0 or no noise)."""
    if chance == 0 or mechanism == "none" or noise == 0:
        return -math.inf
    m, pmf = noise_pmf(mechanism, noise, n_terms)
    cdf = np.cumsum(pmf)
    i = int(np.searchsorted(cdf, float(chance) - 1e-12, side="left"))
    return float(i - m)


def _thresholds(m: NoisyMeasurement, cfg: SafeTabPConfig) -> npt.NDArray[np.float64]:
    """Suppression threshold per STAT_LEVEL + 1 (index 0 = TotalOnly); −inf where nothing is suppressed."""
    d = m.spec.detail
    out = np.full(5, -math.inf)
    if d["region_type"] in UNSUPPRESSED_REGION_TYPES:
        return out
    chance = cfg.zero_suppression_chance
    out[0] = suppression_threshold(m.spec.mechanism, d["total_only_noise"], 1, chance)
    out[1] = suppression_threshold(m.spec.mechanism, m.spec.noise, 1, chance)
    for k, bins in AGE_BINS.items():
        out[k + 1] = suppression_threshold(m.spec.mechanism, m.spec.noise, 2 * (len(bins) + 1), chance)
    return out


def _text(values: pd.Series) -> pd.Categorical:
    """A key column as a categorical of its values' text (``str`` of each value, as ``astype(str)`` gives it):
    the category list is converted, not every row."""
    cat = values.array if isinstance(values.dtype, pd.CategoricalDtype) else pd.Categorical(values)
    assert isinstance(cat, pd.Categorical)
    text = pd.Index(np.asarray(cat.categories.astype(str), dtype=object), dtype=object)
    if (cat.codes < 0).any() or not text.is_unique:  # missing values or colliding texts: convert row by row
        return pd.Categorical(values.astype(str).to_numpy(dtype=object))
    return pd.Categorical.from_codes(cat.codes, categories=text, validate=False)


#: T1 of one key: its key columns as categoricals of their text, and COUNT
T1Part = tuple[dict[str, "pd.Categorical"], npt.NDArray[np.int64]]


def _t1_t2(m: NoisyMeasurement, cfg: SafeTabPConfig) -> tuple[T1Part, pd.DataFrame]:
    """T1 of one key (:data:`T1Part`) and its T2 (text key columns)."""
    tab = m.table
    stat = tab["STAT_LEVEL"].to_numpy()
    noisy = tab[NOISY_COLUMN].to_numpy(dtype=np.int64)
    keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
    thr = _thresholds(m, cfg)
    single = stat <= 0
    keep = np.flatnonzero(single & (noisy > thr[stat.astype(np.int64) + 1]))  # suppression before any frame
    text = {c: _text(tab[c]) for c in keys}
    cells = tab.loc[~single, ["GROUP", *keys, "STAT_LEVEL", "SEX", "AGESTART", "AGEEND", NOISY_COLUMN]]
    summed = cells.groupby("GROUP", sort=False, observed=True).agg(
        REGION_ID=("REGION_ID", "first"), REGION_TYPE=("REGION_TYPE", "first"),
        ITERATION_CODE=("ITERATION_CODE", "first"), COUNT=(NOISY_COLUMN, "sum"),
        _STAT=("STAT_LEVEL", "first"))
    summed = summed[summed["COUNT"].to_numpy() > thr[summed["_STAT"].to_numpy().astype(np.int64) + 1]]
    t1 = {c: _union([text[c][keep], _text(summed[c])]) for c in keys}
    count = np.concatenate([noisy[keep], summed["COUNT"].to_numpy(dtype=np.int64)])
    marg = cells.groupby(["GROUP", "SEX"], sort=False, observed=True).agg(
        REGION_ID=("REGION_ID", "first"), REGION_TYPE=("REGION_TYPE", "first"),
        ITERATION_CODE=("ITERATION_CODE", "first"), COUNT=(NOISY_COLUMN, "sum")).reset_index()
    marg["AGESTART"] = "*"
    marg["AGEEND"] = "*"
    t2c = cells.rename(columns={NOISY_COLUMN: "COUNT"}).copy()
    t2c["AGESTART"] = t2c["AGESTART"].astype(str)
    t2c["AGEEND"] = t2c["AGEEND"].astype(str)
    t2 = pd.concat([t2c[["GROUP", *T2_COLUMNS]], marg[["GROUP", *T2_COLUMNS]]], ignore_index=True)
    return (t1, count), t2[T2_COLUMNS]


def _union(cats: list[pd.Categorical]) -> pd.Categorical:
    """The concatenation of categoricals (categories united, codes remapped; no value is converted)."""
    out: pd.Categorical = union_categoricals(cats)
    return out


def _as_text(cat: pd.Categorical) -> pd.Series:
    """The values of a categorical of strings as a ``str`` column (what ``astype(str)`` gives), gathered from
    the category list by Arrow instead of converting every row."""
    categories = pa.array(np.asarray(cat.categories, dtype=object), pa.large_string())
    return pd.Series(pd.array(pc.take(categories, pa.array(cat.codes)), dtype="str"), copy=False)


def _t1_frame(parts: list[T1Part]) -> pd.DataFrame:
    """T1 of every key, in ``tables``' order (REGION_TYPE, REGION_ID, ITERATION_CODE; a stable sort of the keys'
    rows in key order): the sort runs on the ranks of each column's category text, the text is materialised
    once, after the sort."""
    keys = ["REGION_TYPE", "REGION_ID", "ITERATION_CODE"]
    cols = {c: _union([p[0][c] for p in parts]) for c in keys}
    count = np.concatenate([p[1] for p in parts])
    sort_key = np.zeros(len(count), dtype=np.int64)
    span = 1
    for c in keys:  # mixed radix: (type rank, region rank, iteration rank)
        cat = cols[c]
        n = max(len(cat.categories), 1)
        span *= n
        if span >= 1 << 62:
            raise OverflowError("T1 sort key does not fit in 64 bits")
        rank = np.empty(len(cat.categories), dtype=np.int64)
        rank[np.argsort(np.asarray(cat.categories, dtype=object), kind="stable")] = np.arange(len(cat.categories))
        sort_key = sort_key * n + rank[cat.codes]
    order = np.argsort(sort_key, kind="stable")
    out = pd.DataFrame({c: _as_text(cols[c][order]) for c in T1_COLUMNS[:-1]})
    out["COUNT"] = count[order]
    return out


def _final_t1(parts: list[T1Part], cfg: SafeTabPConfig) -> pd.DataFrame:
    """T1 of every key from the keys' parts: integer counts, clamped at 0 unless negative counts are allowed."""
    t1 = _t1_frame(parts) if parts else pd.DataFrame(columns=T1_COLUMNS)
    t1["COUNT"] = t1["COUNT"].astype(np.int64)
    if not cfg.allow_negative_counts:
        t1["COUNT"] = t1["COUNT"].clip(lower=0)
    return t1.reset_index(drop=True)


def _final_t2(t2: pd.DataFrame, cfg: SafeTabPConfig) -> pd.DataFrame:
    """T2 rows of one key (or all): text key columns, integer counts clamped as in :func:`_final_t1`."""
    t2 = t2.astype({"COUNT": np.int64})
    for c in ("REGION_ID", "REGION_TYPE", "ITERATION_CODE"):
        column = t2[c]
        if isinstance(column.dtype, pd.CategoricalDtype) and not (column.cat.codes.to_numpy() < 0).any():
            t2[c] = pd.Series(_as_text(column.array).array, index=t2.index)  # gathered from the category text
        else:
            t2[c] = column.astype(str)
    if not cfg.allow_negative_counts:
        t2["COUNT"] = t2["COUNT"].clip(lower=0)
    return t2


def _stage2_keys(measurements: Mapping[str, NoisyMeasurement]) -> list[str]:
    """The stage-2 keys in the tables' key order (stage-1 totals are never published)."""
    return [key for key in sorted(measurements) if key.endswith("/stage2")]


def _parts(measurements: Mapping[str, NoisyMeasurement], cfg: SafeTabPConfig) -> tuple[list[T1Part], pd.DataFrame]:
    """Every stage-2 key's T1 part, and T2 of every key (in key order; stage-1 totals are never published)."""
    t1s: list[T1Part] = []
    t2s: list[pd.DataFrame] = []
    for key in _stage2_keys(measurements):
        part, t2 = _t1_t2(measurements[key], cfg)
        t1s.append(part)
        t2s.append(_final_t2(t2, cfg))
    t2 = pd.concat(t2s, ignore_index=True) if t2s else _final_t2(pd.DataFrame(columns=T2_COLUMNS), cfg)
    return t1s, t2.reset_index(drop=True)


def postprocess(measurements: Mapping[str, NoisyMeasurement], cfg: SafeTabPConfig) -> Estimates:
    """T1 and T2 of a run from its stage-2 measurements. T1's rows come in the release file's order
    (``tables`` then finds them sorted); T2's in key order."""
    t1s, t2 = _parts(measurements, cfg)
    return {"t1": _final_t1(t1s, cfg), "t2": t2}


def truth_tables(measurements: Mapping[str, NoisyMeasurement], cfg: SafeTabPConfig) -> dict[str, pd.DataFrame]:
    """The t1 and t2 files of the ground-truth twin's measurements (noise off): the rows and values of
    ``tables(postprocess(...))``, but T1's rows stay in key order and its key columns stay categoricals of their
    text. A truth is joined on its keys, never published; with noise off its T1 holds every cell of the public
    domain (≈ 18 M rows on the demo, against ≈ 160 K released), where sorting the rows and turning every key
    into text was half of the twin's cost."""
    t1s, t2 = _parts(measurements, cfg)
    if not t1s:
        return {"t1": _final_t1(t1s, cfg)[T1_COLUMNS], "t2": t2[T2_COLUMNS]}
    t1 = pd.DataFrame({c: _union([p[0][c] for p in t1s]) for c in T1_COLUMNS[:-1]})
    count = np.concatenate([p[1] for p in t1s]).astype(np.int64)
    t1["COUNT"] = count if cfg.allow_negative_counts else np.maximum(count, 0)
    return {"t1": t1, "t2": t2[T2_COLUMNS]}


#: T2 as stored by the streamed post-processing (one row group per stage-2 key)
T2_SCHEMA = pa.schema([("REGION_ID", pa.string()), ("REGION_TYPE", pa.string()), ("ITERATION_CODE", pa.string()),
                       ("AGESTART", pa.string()), ("AGEEND", pa.string()), ("SEX", pa.int8()),
                       ("COUNT", pa.int64())])


def postprocess_stream(measurements: Mapping[str, NoisyMeasurement], cfg: SafeTabPConfig) -> CombinedEstimates:
    """:func:`postprocess` with T2 streamed one stage-2 key at a time (``TableStream``: one measurement, its T1
    part and its T2 rows in memory at a time) and T1 built after it from the keys' T1 parts (a callable reached
    after the stream). The rows and values are :func:`postprocess`'s."""
    keys = _stage2_keys(measurements)
    t1s: list[T1Part] = []
    split = getattr(measurements, "segment_loaders", None)

    def pieces(key: str) -> Iterator[NoisyMeasurement]:
        """A key's measurement, or its segments one at a time (disjoint region ranges: a group's rows are all in
        one segment, so T1 sums and T2 margins per segment are those of the key)."""
        loaders = split(key) if callable(split) else None
        if loaders is None:
            yield measurements[key]
        else:
            for load in loaders.values():
                yield load()

    def t2_chunks() -> Iterator[pa.Table]:
        t1s.clear()  # a stream read again (a retried write) starts T1 afresh
        for key in keys:
            for m in pieces(key):
                part, t2 = _t1_t2(m, cfg)
                t1s.append(part)
                yield pa.Table.from_pandas(_final_t2(t2, cfg), schema=T2_SCHEMA, preserve_index=False)

    def t1() -> pd.DataFrame:
        if len(t1s) < len(keys):
            raise RuntimeError("SafeTab-P T1 read before its T2 stream was written")
        return _final_t1(t1s, cfg)

    return {"t2": TableStream(T2_SCHEMA, t2_chunks), "t1": t1}


def _is_sorted(frame: pd.DataFrame, columns: list[str]) -> bool:
    """Whether the text columns are already in lexicographic row order (ties allowed), checked with Arrow's
    vectorised comparisons of consecutive rows; False when a column is not Arrow-backed text."""
    if len(frame) < 2:
        return True
    arrays = []
    for c in columns:
        if not isinstance(frame[c].array, pd.arrays.ArrowStringArray):
            return False
        values = pa.array(frame[c])  # the column's Arrow data
        arrays.append(values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values)
    n = len(frame)
    ok: pa.Array | None = None
    for a in reversed(arrays):  # rows i, i+1 in order: a < b, or a == b and the later columns in order
        prev, nxt = a.slice(0, n - 1), a.slice(1)
        here = pc.less(prev, nxt) if ok is not None else pc.less_equal(prev, nxt)
        ok = here if ok is None else pc.or_(here, pc.and_(pc.equal(prev, nxt), ok))
    assert ok is not None
    return bool(pc.all(pc.fill_null(ok, False)).as_py())


def release_t1(t1: pd.DataFrame) -> pd.DataFrame:
    """The t1 file's rows: production columns, stably sorted by REGION_TYPE, REGION_ID, ITERATION_CODE (skipped
    when already in that order — a stable sort of sorted rows leaves them as they are)."""
    order = ["REGION_TYPE", "REGION_ID", "ITERATION_CODE"]
    t1 = t1[T1_COLUMNS]
    if not _is_sorted(t1, order):
        t1 = t1.sort_values(order, kind="stable")
    return t1.reset_index(drop=True)


def tables(estimates: Estimates) -> dict[str, pd.DataFrame]:
    """The release files: t1 (:func:`release_t1`) and t2 with the production columns, in key order."""
    t2 = estimates["t2"][T2_COLUMNS]
    return {"t1": release_t1(estimates["t1"]), "t2": t2.reset_index(drop=True)}
