"""Seeded synthetic group-size datasets of spec 3.5 (Census-like, Taxi-like), with manifests (requirement E2).

Both return a ``GroupSizeData``: the region tree (``TreeShape`` + region labels per level), the true count
arrays per level (regions, k) with the top bucket meaning "k or more", and a manifest (n, N, k, |R_l|, every
parameter and the seed). The randomness is a numpy PCG64 seeded generator: these are synthetic *inputs*, not
privacy noise.

Census-like (spec 3.5; Kuo et al.'s construction): 1 nation, 52 states, 3,144 counties split among the states
by a Dirichlet-multinomial (each state >= 1 county); county household totals lognormal(0, ``county_sigma``)
rescaled by largest remainder to sum to n; size shares 1..6 and 7+ from 2010 SF1 table H13
(26.7/33.6/15.8/13.2/6.1/2.5/2.1 %, rounded from the published national counts), perturbed per county by a
Dirichlet of concentration 1,000; the 7+ households spread over 7..k by a geometric tail of ratio rho =
share(7+)/share(6) (multinomial per county); then ``gq_fraction`` of the households are replaced by group-quarters
outliers with sizes uniform in [``gq_low``, ``gq_high``] (paper's bounds stripped; our choice [50, 1000], recorded).

Taxi-like: 1 city, 6 boroughs, 263 zones (TLC zone lookup counts: EWR 1, Staten Island 20, Bronx 43, Brooklyn
61, Queens 69, Manhattan 69); 13,282 taxis; pickups per taxi lognormal with mean 24,489,743/13,282 ~ 1,844 and
log-sd ``pickup_sigma``, at least 1 and capped at k = 13,282; each taxi in one zone drawn by a Zipf(1.1)
popularity over zones with Manhattan zones weighted x``manhattan_boost`` (the paper is silent on assignment).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.postprocess.tree_dp import TreeShape
from dasflow.postprocess.twolevel_topdown import largest_remainder

IntArray = npt.NDArray[np.int64]

__all__ = ["H13_SHARES", "GroupSizeData", "census_like", "counts_from_groups", "taxi_like"]

#: 2010 SF1 H13 national household-size shares, sizes 1..6 and 7-or-more (rounded percentages).
H13_SHARES = (0.267, 0.336, 0.158, 0.132, 0.061, 0.025, 0.021)
TLC_BOROUGH_ZONES = (("EWR", 1), ("Staten Island", 20), ("Bronx", 43), ("Brooklyn", 61), ("Queens", 69),
                     ("Manhattan", 69))


@dataclass(frozen=True)
class GroupSizeData:
    """A hierarchy with true group-size counts per level (level 0 = root)."""

    shape: TreeShape
    labels: tuple[tuple[str, ...], ...]
    counts: tuple[IntArray, ...]
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def k(self) -> int:
        return int(self.counts[0].shape[1])

    @property
    def n(self) -> int:
        return int(self.counts[0].sum())


def counts_from_groups(shape: TreeShape, leaf: IntArray, size: IntArray, k: int) -> tuple[IntArray, ...]:
    """Per-level (regions, k) counts from one row per group: its leaf region index and its size (>= 1).

    Sizes above k go to the top bucket k ("k or more"). Vectorised (bincount), no loop over groups.
    """
    leaf = np.asarray(leaf, dtype=np.int64)
    s = np.minimum(np.asarray(size, dtype=np.int64), k)
    n_leaf = shape.sizes[-1]
    flat = np.bincount(leaf * k + (s - 1), minlength=n_leaf * k).astype(np.int64)
    levels = [flat.reshape(n_leaf, k)]
    for l in range(shape.levels - 1, 0, -1):
        levels.insert(0, np.add.reduceat(levels[0], shape.child_starts(l - 1), axis=0).astype(np.int64))
    return tuple(levels)


def _split_counts(rng: np.random.Generator, total: int, parts: int, conc: float) -> IntArray:
    """``total`` items over ``parts`` bins, each >= 1, Dirichlet-multinomial."""
    w = rng.dirichlet(np.full(parts, conc))
    out: IntArray = 1 + rng.multinomial(total - parts, w).astype(np.int64)
    return out


def census_like(
    seed: int,
    *,
    n: int = 117_630,
    k: int = 1000,
    states: int = 52,
    counties: int = 3144,
    county_sigma: float = 1.5,
    concentration: float = 1000.0,
    gq_fraction: float = 1e-4,
    gq_low: int = 50,
    gq_high: int = 1000,
) -> GroupSizeData:
    """Census-like dataset (module docstring). Default n is the paper's 117,630,445 at CI scale 1/1000."""
    if n < counties or k < 8 or states < 1 or counties < states:
        raise ValueError("census_like needs n >= counties >= states >= 1 and k >= 8")
    rng = np.random.default_rng(seed)
    per_state = _split_counts(rng, counties, states, 2.0)
    par2 = np.repeat(np.arange(states, dtype=np.int64), per_state)
    shape = TreeShape((np.zeros(states, dtype=np.int64), par2))
    w = rng.lognormal(0.0, county_sigma, size=counties)
    hh = largest_remainder((n - counties) * w / w.sum(), np.zeros(counties, dtype=np.int64),
                           np.array([n - counties])) + 1
    shares = np.asarray(H13_SHARES)
    p = rng.dirichlet(concentration * shares, size=counties)
    base = rng.multinomial(hh, p).astype(np.int64)  # (counties, 7)
    rho = shares[6] / shares[5]
    tail_p = rho ** np.arange(k - 6, dtype=np.float64)
    tail_p /= tail_p.sum()
    tail = rng.multinomial(base[:, 6], tail_p).astype(np.int64)  # sizes 7..k
    leaf_counts = np.concatenate([base[:, :6], tail], axis=1)
    n_gq = round(gq_fraction * n)
    if n_gq:
        # replace n_gq households (chosen proportionally to the county cell counts) by outlier groups
        cell_p = leaf_counts.ravel() / leaf_counts.sum()
        take = rng.multinomial(n_gq, cell_p).reshape(leaf_counts.shape)
        take = np.minimum(take, leaf_counts)
        leaf_counts = leaf_counts - take
        gq_county = np.repeat(np.arange(counties, dtype=np.int64), take.sum(axis=1))
        gq_size = rng.integers(gq_low, gq_high + 1, size=gq_county.size)
        np.add.at(leaf_counts, (gq_county, np.minimum(gq_size, k) - 1), 1)
    counts = [leaf_counts]
    counts.insert(0, np.add.reduceat(leaf_counts, shape.child_starts(1), axis=0))
    counts.insert(0, counts[0].sum(axis=0, keepdims=True))
    persons = int((leaf_counts * np.arange(1, k + 1)).sum())
    labels = (("US",), tuple(f"S{s:02d}" for s in range(states)), tuple(f"C{c:04d}" for c in range(counties)))
    manifest = {
        "generator": "census_like",
        "seed": seed,
        "n_groups": int(leaf_counts.sum()),
        "N_individuals": persons,
        "k": k, "regions_per_level": list(shape.sizes), "county_sigma": county_sigma,
        "dirichlet_concentration": concentration, "h13_shares": list(H13_SHARES), "tail_rho": float(rho),
        "gq_fraction": gq_fraction, "gq_size_range": [gq_low, gq_high], "gq_groups": n_gq,
        "note": "N counts the top bucket as size k (k-or-more)",
    }
    return GroupSizeData(shape, labels, tuple(np.asarray(c, dtype=np.int64) for c in counts), manifest)


def taxi_like(
    seed: int,
    *,
    taxis: int = 13_282,
    k: int = 13_282,
    mean_pickups: float = 24_489_743 / 13_282,
    pickup_sigma: float = 0.8,
    zipf_s: float = 1.1,
    manhattan_boost: float = 5.0,
) -> GroupSizeData:
    """Taxi-like dataset (module docstring)."""
    rng = np.random.default_rng(seed)
    per_borough = np.array([z for _, z in TLC_BOROUGH_ZONES], dtype=np.int64)
    par2 = np.repeat(np.arange(per_borough.size, dtype=np.int64), per_borough)
    shape = TreeShape((np.zeros(per_borough.size, dtype=np.int64), par2))
    zones = int(per_borough.sum())
    rank = rng.permutation(zones) + 1
    pop = rank.astype(np.float64) ** (-zipf_s)
    pop[par2 == per_borough.size - 1] *= manhattan_boost
    pop /= pop.sum()
    zone = rng.choice(zones, size=taxis, p=pop)
    mu = np.log(mean_pickups) - pickup_sigma**2 / 2
    pickups = np.clip(np.rint(rng.lognormal(mu, pickup_sigma, size=taxis)), 1, k).astype(np.int64)
    counts = counts_from_groups(shape, zone.astype(np.int64), pickups, k)
    labels = (("NYC",), tuple(b for b, _ in TLC_BOROUGH_ZONES), tuple(f"Z{z:03d}" for z in range(zones)))
    manifest = {
        "generator": "taxi_like",
        "seed": seed,
        "n_groups": taxis,
        "N_individuals": int(pickups.sum()),
        "k": k,
        "regions_per_level": list(shape.sizes), "mean_pickups": mean_pickups, "pickup_sigma": pickup_sigma,
        "zipf_s": zipf_s, "manhattan_boost": manhattan_boost,
    }
    return GroupSizeData(shape, labels, counts, manifest)
