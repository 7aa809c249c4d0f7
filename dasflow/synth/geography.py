"""Synthetic tabulation geography of one state: real counties, synthetic tracts / block groups / blocks, places,
county subdivisions and AIANNH areas (the public GRF-C of the synthetic census).

Sizes follow the persons to generate, so fan-outs stay realistic at every scale: about one tract per 3,940
persons, one block group per 1,380 and one block per 41 (about 84 K tracts, 240 K block groups and 8 M blocks at
full US scale). County sizes are lognormal (heavy-tailed), tracts moderately even, blocks heavy-tailed with about
30 % empty blocks. Every county has at least one tract, every tract at least one block with positive weight.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from dasflow.io.arrays import unique
from dasflow.synth import params as prm
from dasflow.synth.reference import counties, states
from dasflow.synth.seeding import stream

I64 = npt.NDArray[np.int64]
I32 = npt.NDArray[np.int32]
F64 = npt.NDArray[np.float64]

NO_PLACE = 99999
NO_AIANNH = 9999


@dataclass(frozen=True)
class StateGeography:
    """The public geography of one state plus the per-tract person totals the generator allocates."""

    state: str
    persons: int
    county_fips: I32  # (K,) county FIPS codes
    county_persons: I64  # (K,)
    county_vacancy: F64  # (K,) vacancy rate of the county's housing units
    tract_county: I32  # (T,) index into the counties
    tract_code: I32  # (T,) 6-digit TABTRACTCE as an int (e.g. 100 = "000100")
    tract_hh_persons: I64  # (T,) persons in households
    tract_gq_persons: I64  # (T,) persons in group quarters
    tract_block_start: I64  # (T+1,) offsets of each tract's blocks
    block_tract: I32  # (B,) index into the tracts
    block_group: npt.NDArray[np.int8]  # (B,) TABBLKGRPCE 1..9
    block_code: npt.NDArray[np.int16]  # (B,) TABBLK 4 digits (first digit = block group)
    block_key: F64  # (B,) tract index + within-tract cumulative weight (for sampling blocks)
    block_place: I32  # (B,) PLACEFP, 99999 = none
    block_cousub: I32  # (B,) COUSUBFP
    block_aiannh: npt.NDArray[np.int16]  # (B,) AIANNHCE, 9999 = none

    @property
    def n_blocks(self) -> int:
        return int(self.block_tract.size)

    def counts(self) -> dict[str, int]:
        """Number of geographic entities per geolevel."""
        bg = unique(self.block_tract.astype(np.int64) * 10 + self.block_group).size
        return {
            "counties": int(self.county_fips.size),
            "tracts": int(self.tract_code.size),
            "block_groups": int(bg),
            "blocks": self.n_blocks,
            "places": int(unique(self.block_place[self.block_place != NO_PLACE]).size),
            "county_subdivisions": int(
                unique(
                    self.county_fips[self.tract_county][self.block_tract].astype(np.int64) * 100000 + self.block_cousub
                ).size
            ),
            "aiannh_areas": int(unique(self.block_aiannh[self.block_aiannh != NO_AIANNH]).size),
        }


@cache
def aiannh_areas(seed: int) -> dict[str, tuple[int, ...]]:
    """The national AIANNH table: state -> AIANNHCE codes. Drawn from the seed alone (never from the selection
    of states), so an area crossing state lines carries the same code in every state it covers."""
    g = stream(seed, "aiannh")
    st = [s for s in states() if s not in prm.NO_AIANNH_STATES]
    n_single = [prm.AIANNH_AREAS.get(s, prm.DEFAULT_AIANNH_AREAS) for s in st]
    total = sum(n_single) + len(prm.MULTISTATE_AIANNH)
    codes = np.sort(g.choice(np.arange(1, 9999), size=total, replace=False))
    codes = codes[g.permutation(total)]
    out: dict[str, list[int]] = {s: [] for s in st}
    i = 0
    for s, n in zip(st, n_single, strict=True):
        out[s].extend(int(c) for c in codes[i : i + n])
        i += n
    for group in prm.MULTISTATE_AIANNH:
        for s in group:
            out[s].append(int(codes[i]))
        i += 1
    return {s: tuple(sorted(v)) for s, v in out.items()}


def _unique_codes(g: np.random.Generator, n: int, lo: int, hi: int, step: int) -> I64:
    pool = np.arange(lo, hi, step, dtype=np.int64)
    n = min(n, pool.size)
    return np.sort(g.choice(pool, size=n, replace=False))


def build_state_geography(state: str, persons: int, seed: int) -> StateGeography:
    """The geography of ``state`` sized for ``persons`` persons; deterministic in (seed, state, persons)."""
    g = stream(seed, state, "geography")
    cfips_t, _ = counties()[state]
    cfips = np.array(cfips_t, dtype=np.int32)
    K = cfips.size
    # counties: heavy-tailed sizes
    w = g.lognormal(0.0, prm.COUNTY_LOGNORMAL_SIGMA, K)
    cpop = g.multinomial(persons, w / w.sum()).astype(np.int64)
    a, b = prm.VACANCY_BETA
    cvac = g.beta(a, b, K)
    # tracts
    nt = np.maximum(1, np.rint(cpop / prm.PERSONS_PER_TRACT)).astype(np.int64)
    nt = np.minimum(nt, 999_999)
    T = int(nt.sum())
    tract_county = np.repeat(np.arange(K, dtype=np.int32), nt)
    tract_start = np.concatenate(([0], np.cumsum(nt)))
    tw = g.lognormal(0.0, prm.TRACT_LOGNORMAL_SIGMA, T)
    tpop = np.zeros(T, dtype=np.int64)
    for k in np.flatnonzero(cpop > 0):  # loop over counties (not records)
        s, e = tract_start[k], tract_start[k + 1]
        tw_k = tw[s:e]
        tpop[s:e] = g.multinomial(int(cpop[k]), tw_k / tw_k.sum())
    local = np.arange(T, dtype=np.int64) - tract_start[tract_county]
    stride = np.where(nt[tract_county] <= 9999, 100, 1)
    tract_code = ((local + 1) * stride).astype(np.int32)
    # group quarters persons per tract: most tracts almost none, a few with large facilities
    gq_tract = g.random(T) < prm.GQ_TRACT_SHARE
    rate = np.where(gq_tract, g.beta(*prm.GQ_RATE_BETA, T), prm.GQ_RATE_BASE)
    tgq = g.binomial(tpop, rate).astype(np.int64)
    thh = tpop - tgq
    # block groups and blocks
    nbg = np.clip(1 + g.poisson(np.maximum(tpop / prm.PERSONS_PER_BLOCK_GROUP - 1.0, 0.0)), 1, 9)
    bg_tract = np.repeat(np.arange(T, dtype=np.int32), nbg)
    bg_start = np.concatenate(([0], np.cumsum(nbg)))
    bg_digit = (np.arange(bg_tract.size) - bg_start[bg_tract] + 1).astype(np.int8)
    bg_pop = tpop[bg_tract] / nbg[bg_tract]
    nblk = np.clip(1 + g.poisson(np.maximum(bg_pop / prm.PERSONS_PER_BLOCK - 1.0, 0.0)), 1, 999)
    B = int(nblk.sum())
    blk_bg = np.repeat(np.arange(bg_tract.size, dtype=np.int64), nblk)
    blk_start_bg = np.concatenate(([0], np.cumsum(nblk)))
    block_tract = bg_tract[blk_bg]
    block_group = bg_digit[blk_bg]
    block_code = (block_group.astype(np.int16) * 1000 + (np.arange(B) - blk_start_bg[blk_bg] + 1)).astype(np.int16)
    bgw = g.lognormal(0.0, prm.BLOCK_GROUP_LOGNORMAL_SIGMA, bg_tract.size)
    bw = g.lognormal(0.0, prm.BLOCK_LOGNORMAL_SIGMA, B) * bgw[blk_bg] * (g.random(B) >= prm.EMPTY_BLOCK_SHARE)
    tract_block_start = np.concatenate(([0], np.cumsum(np.bincount(block_tract, minlength=T)))).astype(np.int64)
    tsum = np.add.reduceat(bw, tract_block_start[:-1])
    bw[tract_block_start[:-1][tsum == 0]] = 1.0
    tsum = np.add.reduceat(bw, tract_block_start[:-1])
    cum = np.cumsum(bw)
    before = np.concatenate(([0.0], cum[tract_block_start[1:-1] - 1]))
    frac = (cum - before[block_tract]) / tsum[block_tract]
    frac[tract_block_start[1:] - 1] = 1.0
    block_key = block_tract.astype(np.float64) + np.minimum(frac, 1.0)
    # places: ~1 per 12,000 persons of the county, >= 1 per county; codes unique in the state
    npl = 1 + g.poisson(cpop / prm.PERSONS_PER_PLACE)
    pl_codes = _unique_codes(g, int(npl.sum()), 100, 98_000, 5)
    npl = np.minimum(npl, pl_codes.size)  # only bites beyond ~4x the US population
    pl_start = np.concatenate(([0], np.cumsum(npl)))
    pl_start = np.minimum(pl_start, pl_codes.size - 1)
    in_place = g.random(T) < prm.PLACE_TRACT_SHARE
    pick = np.floor(g.random(T) ** 1.5 * npl[tract_county]).astype(np.int64)
    tplace = np.where(in_place, pl_codes[np.minimum(pl_start[tract_county] + pick, pl_codes.size - 1)], NO_PLACE)
    block_place = np.where(g.random(B) < prm.PLACE_EDGE_BLOCK_SHARE, NO_PLACE, tplace[block_tract]).astype(np.int32)
    # county subdivisions: contiguous runs of tracts
    ncs = np.minimum(np.clip(1 + g.poisson(cpop / prm.PERSONS_PER_COUSUB), 1, None), nt)
    cs_codes = _unique_codes(g, int(ncs.sum()), 100, 99_000, 3)
    cs_start = np.concatenate(([0], np.cumsum(ncs)))
    cs_local = local * ncs[tract_county] // nt[tract_county]
    tcousub = cs_codes[np.minimum(cs_start[tract_county] + cs_local, cs_codes.size - 1)]
    block_cousub = tcousub[block_tract].astype(np.int32)
    # AIANNH areas
    areas = np.array(aiannh_areas(seed).get(state, ()), dtype=np.int16)
    if areas.size:
        share = prm.AIANNH_TRACT_SHARE.get(state, prm.DEFAULT_AIANNH_TRACT_SHARE)
        t_in = g.random(T) < share
        t_area = areas[np.floor(g.random(T) ** 2 * areas.size).astype(np.int64)]
        in_blk = t_in[block_tract] & (g.random(B) < prm.AIANNH_BLOCK_SHARE_IN_TRACT)
        block_aiannh = np.where(in_blk, t_area[block_tract], NO_AIANNH).astype(np.int16)
    else:
        block_aiannh = np.full(B, NO_AIANNH, dtype=np.int16)
    return StateGeography(
        state=state,
        persons=persons,
        county_fips=cfips,
        county_persons=cpop,
        county_vacancy=cvac,
        tract_county=tract_county,
        tract_code=tract_code,
        tract_hh_persons=thh,
        tract_gq_persons=tgq,
        tract_block_start=tract_block_start,
        block_tract=block_tract.astype(np.int32),
        block_group=block_group,
        block_code=block_code,
        block_key=block_key,
        block_place=block_place,
        block_cousub=block_cousub,
        block_aiannh=block_aiannh,
    )


def chunk_tract_ranges(geo: StateGeography, chunk_persons: int = prm.CHUNK_PERSONS) -> list[tuple[int, int]]:
    """Split the tracts into consecutive runs of at most ``chunk_persons`` persons (a tract is never split; one
    tract holds at most a few tens of thousands of persons at any realistic scale)."""
    tp = geo.tract_hh_persons + geo.tract_gq_persons
    T = tp.size
    out: list[tuple[int, int]] = []
    start = 0
    cum = np.cumsum(tp)
    while start < T:
        base = cum[start - 1] if start > 0 else 0
        end = int(np.searchsorted(cum, base + chunk_persons, side="right"))
        end = max(end, start + 1)
        out.append((start, end))
        start = end
    return out
