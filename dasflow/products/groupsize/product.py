"""The ``groupsize`` product: household-size distribution for nation, states and counties (Product interface).

Groups = occupied housing units, size = persons (top-coded: the last bucket k means "k or more"). Released for
every region of the 3-level hierarchy nation > state > county; consistent (parent = sum of children for every
size), non-negative, integral, and faithful (every level sums to the public number of occupied units n).

Privacy argument. ``plan`` fixes, before any data is read, one measurement per level with budget share s_l of
the total (ε under pure DP, ρ under zCDP; equal shares 1/L unless ``level_shares`` is given, which is recorded in
every spec). The regions of a level partition the households, so the per-region queries of a level compose in
parallel; the L levels compose sequentially to the total. Noise: two-sided geometric of scale Δ/ε_l (exact
sampler) or discrete Gaussian with σ² = Δ²/(2ρ_l), Δ (L1; it equals L2² here) from
``mechanisms.query_sensitivity`` under the fixed-group-set neighbour relation documented there: 2 for counts,
1 for per-region cumulative counts, |R_l| for the M_DPC* chain vector. ``postprocess`` receives only noisy
measurements and public facts (tree, n, k), so the release is a post-processing of the plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from dasflow.errors import InputError
from dasflow.postprocess.tree_dp import TreeShape
from dasflow.privacy import accounting, samplers
from dasflow.products.base import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    Estimates,
    MeasurementSpec,
    Mechanism,
    NoisyMeasurement,
    Prepared,
    PrivacyDefinition,
)
from dasflow.products.groupsize.mechanisms import (
    EXACT_MECHANISMS,
    MECHANISM_QUERY,
    postprocess,
    query_sensitivity,
    true_query,
)

IntArray = npt.NDArray[np.int64]
LEVELS = ("nation", "state", "county")

__all__ = ["LEVELS", "GroupSizeConfig", "GroupSizeProduct", "Hierarchy", "build_hierarchy"]


@dataclass(frozen=True)
class GroupSizeConfig:
    """Run parameters. ``budget`` is ε (puredp) or ρ (zcdp), exact."""

    budget: Fraction
    privacy_defn: PrivacyDefinition = "puredp"
    mechanism: str = "M_DPC"
    k: int = 7
    level_shares: tuple[Fraction, ...] | None = None
    window_multiplier: Fraction = Fraction(1)

    def __post_init__(self) -> None:
        if not isinstance(self.budget, Fraction) or self.budget <= 0:
            raise ValueError("budget must be a positive Fraction")
        if self.privacy_defn not in ("puredp", "zcdp"):
            raise ValueError(f"privacy_defn must be 'puredp' or 'zcdp', got {self.privacy_defn!r}")
        if self.mechanism not in EXACT_MECHANISMS:
            raise ValueError(
                f"mechanism {self.mechanism!r} is not a consistent release mechanism; choose one of "
                f"{list(EXACT_MECHANISMS)} (M_H-R / M_HC-R are experiment baselines only)"
            )
        if self.k < 2:
            raise ValueError("k (top-coded size bucket) must be >= 2")
        if self.level_shares is not None:
            if len(self.level_shares) != len(LEVELS) or any(s <= 0 for s in self.level_shares):
                raise ValueError(f"level_shares needs {len(LEVELS)} positive shares")
            if sum(self.level_shares, Fraction(0)) != 1:
                raise ValueError("level_shares must sum to exactly 1")
        if self.window_multiplier <= 0:
            raise ValueError("window_multiplier must be positive")

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> GroupSizeConfig:
        """Parse a JSON-like mapping; budgets through the privacy core's exact parser."""
        budget = accounting.parse_budget(raw["budget"], "budget")
        if budget is None:
            raise ValueError("budget: an infinite budget is not a release configuration")
        shares = raw.get("level_shares")
        return cls(
            budget=budget,
            privacy_defn=raw.get("privacy_defn", "puredp"),
            mechanism=str(raw.get("mechanism", "M_DPC")),
            k=int(raw.get("k", 7)),
            level_shares=None
            if shares is None
            else tuple(Fraction(accounting.parse_budget(s, "level_shares") or 0) for s in shares),
            window_multiplier=Fraction(str(raw.get("window_multiplier", 1))),
        )

    def shares(self) -> tuple[Fraction, ...]:
        return self.level_shares or tuple(Fraction(1, len(LEVELS)) for _ in LEVELS)


@dataclass(frozen=True)
class Hierarchy:
    """Public geography: the tree and the region codes per level (states sorted, counties sorted in states)."""

    shape: TreeShape
    states: tuple[str, ...]
    counties: tuple[tuple[str, str], ...]

    def labels(self, level: int) -> list[tuple[str, ...]]:
        if level == 0:
            return [()]
        if level == 1:
            return [(s,) for s in self.states]
        return list(self.counties)


def build_hierarchy(geography: pd.DataFrame) -> Hierarchy:
    """The public nation > state > county tree from a table of (STATE, COUNTY) codes."""
    for col in ("STATE", "COUNTY"):
        if col not in geography.columns:
            raise InputError(f"public geography lacks column {col}", file="<public geography>", column=col)
    geo = geography[["STATE", "COUNTY"]].astype(str).drop_duplicates().sort_values(["STATE", "COUNTY"])
    if geo.empty:
        raise InputError("public geography is empty", file="<public geography>")
    state_of, county_of = geo["STATE"].tolist(), geo["COUNTY"].tolist()  # whole columns, not per-row access
    states = tuple(pd.unique(geo["STATE"]))
    par = pd.Index(states).get_indexer(state_of).astype(np.int64)
    shape = TreeShape((np.zeros(len(states), dtype=np.int64), par))
    counties = tuple(zip(state_of, county_of, strict=True))
    return Hierarchy(shape, states, counties)


def _noise_variance(mech: Mechanism, noise: Fraction) -> Fraction | float:
    if noise == 0:
        return Fraction(0)
    if mech == "discrete_gaussian":
        return noise
    a = math.exp(-1.0 / float(noise))
    return 2.0 * a / (1.0 - a) ** 2


class GroupSizeProduct:
    """Product implementation (dasflow.products.base.Product)."""

    name = "groupsize"

    def __init__(self, config: GroupSizeConfig) -> None:
        self.config = config

    # -- plan -------------------------------------------------------------------------------------------
    def plan(self, config: GroupSizeConfig | None, public: Mapping[str, Any]) -> list[MeasurementSpec]:
        """One key per level: budget share, sensitivity, noise scale/σ² and variance (data-independent)."""
        cfg: GroupSizeConfig = config if isinstance(config, GroupSizeConfig) else self.config
        hier = build_hierarchy(public["geography"])
        query = MECHANISM_QUERY[cfg.mechanism]
        mech: Mechanism = "discrete_gaussian" if cfg.privacy_defn == "zcdp" else "two_sided_geometric"
        specs: list[MeasurementSpec] = []
        for l, (level, share) in enumerate(zip(LEVELS, cfg.shares(), strict=True)):
            regions = hier.shape.sizes[l]
            sens = query_sensitivity(query, regions, "l2sq" if mech == "discrete_gaussian" else "l1")  # Δ₂² / Δ₁
            budget = cfg.budget * share
            noise = (
                accounting.gaussian_sigma2_sq(budget, sens)
                if mech == "discrete_gaussian"
                else accounting.geometric_scale(budget, sens)
            )
            specs.append(
                MeasurementSpec(
                    product=self.name,
                    key=f"groupsize/{query}/{level}",
                    level=level,
                    privacy_defn=cfg.privacy_defn,
                    mechanism=mech,
                    budget=budget,
                    sensitivity=Fraction(sens),
                    noise=noise,
                    cells=regions * cfg.k,
                    variance=_noise_variance(mech, noise),
                    detail={
                        "level_index": l,
                        "query": query,
                        "post_mechanism": cfg.mechanism,
                        "k": cfg.k,
                        "share": str(share),
                        "shares_explicit": cfg.level_shares is not None,
                        "window_multiplier": str(cfg.window_multiplier),
                        "sensitivity_note": "L1 = L2^2 (every affected entry moves by 1); "
                        "fixed-group-set neighbours, sizes top-coded at k",
                    },
                )
            )
        return specs

    # -- prepare ----------------------------------------------------------------------------------------
    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Validate the households table and tabulate each level's query (stability: the query itself).

        ``inputs["partition"]`` marks one partition of the input (the plugin's ``partition_inputs``): its
        tabulation covers the whole public tree, and the public invariant n is checked on the whole input only
        (validation), since a partition's total is a part of it."""
        hier = build_hierarchy(public["geography"])
        source = str(inputs.get("households_source", "<households>"))
        counts = tabulate_households(inputs["households"], hier, self.config.k, source)
        n_public = int(public["n_groups"])
        if inputs.get("partition") is None and int(counts[0].sum()) != n_public:
            raise InputError(
                f"households table has {int(counts[0].sum())} occupied units but the public invariant n is "
                f"{n_public}",
                file=source,
            )
        query = MECHANISM_QUERY[self.config.mechanism]
        out: Prepared = {}
        for l, level in enumerate(LEVELS):
            q = true_query(counts[l], query)
            arr = q.reshape(self.config.k, -1).T if query == "chain" else q  # store as (regions, k)
            out[f"groupsize/{query}/{level}"] = _long_frame(arr)
        return out

    # -- measure ----------------------------------------------------------------------------------------
    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        """Add exact noise to one planned key (integer answers + integer noise)."""
        table = prepared[spec.key]
        values = table["VALUE"].to_numpy(dtype=np.int64)
        g = rng.spawn(spec.key)
        if spec.mechanism == "discrete_gaussian":
            noise = samplers.discrete_gaussian(spec.noise, values.size, g)
        elif spec.mechanism == "two_sided_geometric":
            noise = samplers.two_sided_geometric(spec.noise, values.size, g)
        else:
            raise ValueError(f"unsupported mechanism {spec.mechanism!r}")
        out = table[["REGION", "SIZE"]].copy()
        out[NOISY_COLUMN] = values + noise
        out[VARIANCE_COLUMN] = float(spec.variance)
        out[MECHANISM_COLUMN] = spec.mechanism
        return NoisyMeasurement(spec=spec, table=out, rng_mode=str(getattr(g, "mode", "unknown")))

    # -- postprocess ------------------------------------------------------------------------------------
    def postprocess(self, measurements: Mapping[str, NoisyMeasurement], public: Mapping[str, Any]) -> Estimates:
        """Consistent integer estimates from the noisy measurements and public facts only (P4)."""
        hier = build_hierarchy(public["geography"])
        n = int(public["n_groups"])
        by_level = sorted(measurements.values(), key=lambda m: int(m.spec.detail["level_index"]))
        if len(by_level) != len(LEVELS):
            raise ValueError(f"need one measurement per level {LEVELS}, got {len(by_level)}")
        mechanism = str(by_level[0].spec.detail["post_mechanism"])
        k = int(by_level[0].spec.detail["k"])
        multiplier = Fraction(str(by_level[0].spec.detail["window_multiplier"]))
        noisy: list[IntArray] = []
        variances: list[float] = []
        for l, m in enumerate(by_level):
            arr = _from_long(m.table, hier.shape.sizes[l], k, NOISY_COLUMN)
            noisy.append(arr.T.ravel() if m.spec.detail["query"] == "chain" else arr)
            variances.append(float(m.spec.variance))
        res = postprocess(mechanism, hier.shape, noisy, n, variances, window_multiplier=float(multiplier))
        out: Estimates = {}
        for l, level in enumerate(LEVELS):
            frame = _long_frame(res.levels[l], "COUNT")
            idx = frame["REGION"].to_numpy()
            if l == 0:
                frame.insert(0, "STATE", "US")
            elif l == 1:
                frame.insert(0, "STATE", np.asarray(hier.states, dtype=object)[idx])
            else:
                frame.insert(0, "STATE", np.asarray([c[0] for c in hier.counties], dtype=object)[idx])
                frame.insert(1, "COUNTY", np.asarray([c[1] for c in hier.counties], dtype=object)[idx])
            out[f"groupsize/{level}"] = frame
        return out

    # -- tables -----------------------------------------------------------------------------------------
    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]:
        """Release tables: one row per (region, household size); SIZE k is labelled "k+" (k or more)."""
        out: dict[str, pd.DataFrame] = {}
        for level in LEVELS:
            est = estimates[f"groupsize/{level}"]
            k = int(est["SIZE"].max())
            label = est["SIZE"].astype(str).where(est["SIZE"] < k, f"{k}+")
            geo = [c for c in ("STATE", "COUNTY") if c in est.columns]
            frame = est[geo].copy()
            frame["HOUSEHOLD_SIZE"] = label
            frame["COUNT"] = est["COUNT"].astype(np.int64)
            out[f"groupsize_{level}"] = frame.reset_index(drop=True)
        return out


def _long_frame(arr: npt.NDArray[np.generic], column: str = "VALUE") -> pd.DataFrame:
    """(regions, k) array -> long frame REGION (index), SIZE (1..k), value; row-major."""
    a = np.asarray(arr)
    r, k = a.shape
    return pd.DataFrame(
        {
            "REGION": np.repeat(np.arange(r, dtype=np.int64), k),
            "SIZE": np.tile(np.arange(1, k + 1, dtype=np.int64), r),
            column: a.ravel().astype(np.int64),
        }
    )


def _from_long(table: pd.DataFrame, regions: int, k: int, column: str) -> IntArray:
    out = np.zeros((regions, k), dtype=np.int64)
    out[table["REGION"].to_numpy(dtype=np.int64), table["SIZE"].to_numpy(dtype=np.int64) - 1] = table[
        column
    ].to_numpy(dtype=np.int64)
    return out


def tabulate_households(
    households: pd.DataFrame, hier: Hierarchy, k: int, source: str = "<households>"
) -> tuple[IntArray, ...]:
    """Validated per-level (regions, k) counts from a households table with STATE, COUNTY, SIZE columns.

    Bad input raises ``InputError`` naming the file, the first bad row (1-based, header = row 1) and the column;
    nothing is noised.
    """
    for col in ("STATE", "COUNTY", "SIZE"):
        if col not in households.columns:
            raise InputError(f"households table lacks column {col}", file=source, column=col)
    size = pd.to_numeric(households["SIZE"], errors="coerce")
    bad = size.isna() | (size != np.floor(size)) | (size < 1)
    if bool(bad.any()):
        row = int(np.flatnonzero(bad.to_numpy())[0])  # 0-based data row
        raise InputError(
            f"SIZE must be an integer >= 1 (occupied unit), got {households['SIZE'].iloc[row]!r}",
            file=source,
            row=row + 2,  # 1-based with the header as row 1
            column="SIZE",
        )
    st_code, st_uniq = pd.factorize(households["STATE"].astype(str))
    co_code, co_uniq = pd.factorize(households["COUNTY"].astype(str))
    width = max(len(co_uniq), 1)
    pair, pair_inv = np.unique(st_code.astype(np.int64) * width + co_code, return_inverse=True)
    lookup = pd.Index([s + "\x00" + c for s, c in hier.counties])  # each distinct (STATE, COUNTY) looked up once
    found = lookup.get_indexer(pd.Index([f"{st_uniq[p // width]}\x00{co_uniq[p % width]}" for p in pair.tolist()]))
    leaf = found[pair_inv.reshape(-1)] if len(pair) else np.zeros(0, dtype=np.int64)
    if np.any(leaf < 0):
        row = int(np.flatnonzero(leaf < 0)[0])
        raise InputError(
            f"(STATE, COUNTY) = ({households['STATE'].iloc[row]!r}, {households['COUNTY'].iloc[row]!r}) "
            "is not in the public geography",
            file=source,
            row=row + 2,
            column="COUNTY",
        )
    s = np.minimum(size.to_numpy(dtype=np.int64), k)
    n_leaf = hier.shape.sizes[-1]
    leaf_counts = np.bincount(leaf * k + (s - 1), minlength=n_leaf * k).astype(np.int64).reshape(n_leaf, k)
    state = np.add.reduceat(leaf_counts, hier.shape.child_starts(1), axis=0).astype(np.int64)
    nation = state.sum(axis=0, keepdims=True).astype(np.int64)
    return nation, state, leaf_counts
