"""Housing units, group-quarters facilities and persons for a run of tracts (one streaming chunk).

Everything is vectorised over the chunk's units and persons; the only Python loops run over races, GQ types and
fill rounds. Per household the generator draws a size (2020-like shares, geometric tail to 40), a kind (alone,
married couple, cohabiting couple, other family, nonfamily), the householder's sex and age, and each member's
relationship, sex, age, Hispanic origin and race; the unit's FINAL_POP, NPF, HHT, HHT2, CPLT, TEN, HHRACE and
HHSPAN are then *derived* from its persons, so they are consistent by construction:

* HHT 1 iff a spouse (RELSHIP 21/23) is present; 2/3 (family) iff a relative (21, 23, 25-33) is present;
  4/6 alone; 5/7 otherwise (an unmarried partner is not a relative, as in the Census definitions).
* HHT2 from spouse / unmarried partner (22/24) / own children under 18 (RELSHIP 25-27, age < 18) / relatives.
* CPLT 1-4 from the partner's RELSHIP (21, 23, 22, 24), 5 otherwise; NPF = 1 + relatives in family households.
* Vacant units and GQ facilities carry the NIU codes (0 / "00"); GQ persons are RELSHIP 37 (institutional GQ
  types 1-4) or 38 (non-institutional 5-7) and live only in GQ units (RTYPE 4).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dasflow.synth import params as prm
from dasflow.synth.geography import StateGeography
from dasflow.synth.race import RaceTables, draw_cenrace, draw_detailed, draw_qspan
from dasflow.synth.sampling import Bits, draw, lookup_table
from dasflow.synth.seeding import stream

I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]
I16 = npt.NDArray[np.int16]
F64 = npt.NDArray[np.float64]
B = npt.NDArray[np.bool_]


@dataclass
class Chunk:
    """Units and persons of a run of tracts. Unit arrays have one entry per unit (HU occupied, HU vacant, GQ);
    person arrays one per person; ``person_unit`` indexes the chunk's units."""

    state: str
    unit_mafid: I64
    unit_rtype: I8  # 2 = housing unit, 4 = group quarters
    unit_block: I64  # index into the state's blocks
    unit_gqtype: I16  # 3-digit GQ type, 0 for housing units
    unit_hhgq: I8  # 0 = housing unit, 1..7 = GQ major type
    unit_final_pop: npt.NDArray[np.int32]
    unit_npf: I16
    unit_hhspan: I8
    unit_hhrace: I8
    unit_ten: I8
    unit_hht: I8
    unit_hht2: I8
    unit_cplt: I8
    person_unit: I64
    rtype: I8  # 3 = person in a housing unit, 5 = person in GQ
    qage: I16
    qsex: I8  # 1 male, 2 female
    relship: I8  # 20..38
    cenhisp: I8  # 1 not Hispanic, 2 Hispanic
    qspan: I16
    cenrace: I8  # 1..63
    qrace: I16  # (8, n): row j = QRACE{j+1}, 0 = Null
    householder: B

    @property
    def n_units(self) -> int:
        return int(self.unit_mafid.size)

    @property
    def n_persons(self) -> int:
        return int(self.person_unit.size)


@dataclass(frozen=True)
class StateContext:
    """Per-state, per-county tables shared by the state's chunks."""

    geo: StateGeography
    race: RaceTables
    county_hisp: F64  # (K,) county Hispanic shares
    mafid_base: int


def _household_size_probs() -> F64:
    s = prm.HOUSEHOLD_SIZE_SHARES
    tail = prm.HOUSEHOLD_TAIL_RATIO ** np.arange(prm.MAX_HOUSEHOLD_SIZE - 6)
    return np.concatenate((s[:6], s[6] * tail / tail.sum()))


HOUSEHOLD_SIZE_PROBS = _household_size_probs()
_HH_SIZE_LUT = lookup_table(HOUSEHOLD_SIZE_PROBS, 20)
_KIND_LUT = lookup_table(prm.KIND_SHARES)
_FAM_LUT = lookup_table(prm.FAMILY_MEMBER_WEIGHTS)
_NONFAM_LUT = lookup_table(prm.NONFAMILY_MEMBER_WEIGHTS)
_REL_ONLY = np.array([c in prm.RELATIVE_CODES for c in prm.FAMILY_MEMBER_RELSHIP])
_REL_ONLY_CODES = prm.FAMILY_MEMBER_RELSHIP[_REL_ONLY].astype(np.int8)
_FAM_CODES = prm.FAMILY_MEMBER_RELSHIP.astype(np.int8)
_NONFAM_CODES = prm.NONFAMILY_MEMBER_RELSHIP.astype(np.int8)
_REL_ONLY_LUT = lookup_table(prm.FAMILY_MEMBER_WEIGHTS[_REL_ONLY])
_IS_RELATIVE = np.zeros(64, dtype=bool)
_IS_RELATIVE[list(prm.RELATIVE_CODES)] = True
_IS_OWN_CHILD = np.zeros(64, dtype=bool)
_IS_OWN_CHILD[list(prm.OWN_CHILD_CODES)] = True
_HH_AGE_LUT = lookup_table(prm.HH_AGE_SHARES)
_ALONE_AGE_LUT = lookup_table(prm.ALONE_AGE_SHARES)
_GQ_TYPE_CODES_FLAT = np.array([c for t in prm.GQ_TYPE_CODES for c in t], dtype=np.int16)
_GQ_TYPE_CODE_START = np.cumsum([0] + [len(t) for t in prm.GQ_TYPE_CODES])


def fill_groups(g: np.random.Generator, totals: I64, mean: float, sampler: Callable[[I64], I64]) -> tuple[I64, I64]:
    """Split each ``totals[i]`` into positive sizes drawn by ``sampler(group ids)``; the last size of a group is
    trimmed so the sizes sum to the total exactly. Returns (group id, size) sorted by group."""
    totals = np.asarray(totals, dtype=np.int64)
    remaining = totals.copy()
    groups: list[I64] = []
    sizes: list[I64] = []
    while True:
        active = np.flatnonzero(remaining > 0)
        if active.size == 0:
            break
        ndraw = (np.ceil(remaining[active] / mean * 1.15) + 2).astype(np.int64)
        grp = np.repeat(active, ndraw)
        s = sampler(grp)
        cs = np.cumsum(s)
        first = np.cumsum(ndraw) - ndraw
        offset = cs[first] - s[first]
        prev = cs - np.repeat(offset, ndraw) - s
        rem = remaining[grp]
        keep = prev < rem
        s = np.minimum(s, rem - prev)[keep]
        grp = grp[keep]
        remaining -= np.bincount(grp, weights=s, minlength=totals.size).astype(np.int64)
        groups.append(grp)
        sizes.append(s)
    if not groups:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if len(groups) == 1:
        return groups[0], sizes[0]
    gg, ss = np.concatenate(groups), np.concatenate(sizes)
    order = np.argsort(gg, kind="stable")
    return gg[order], ss[order]


def _householder_ages(bits: Bits, alone: B) -> I64:
    """Householder ages: an age bracket (one-person households are older), then uniform within it."""
    n = alone.size
    u = bits.u16(n)
    b = np.where(alone, _ALONE_AGE_LUT[u], _HH_AGE_LUT[u])
    lo, hi = prm.HH_AGE_EDGES[b], prm.HH_AGE_EDGES[b + 1]
    out: I64 = (lo + (bits.unif(n) * (hi - lo)).astype(np.int64)).astype(np.int64)
    return out


def _within_tract_keys(bits: Bits, tract: I64) -> F64:
    """Sorted sampling keys tract + u for units listed in tract order: sorting keeps each unit in its tract and
    puts the units of a tract in block order (so MAFIDs follow the geography)."""
    return np.sort(tract + bits.g.random(tract.size))


def generate_chunk(ctx: StateContext, t0: int, t1: int, seed: int, unit_offset: int) -> Chunk:
    """Units and persons of tracts ``t0 .. t1-1`` of the state; MAFIDs start at base + unit_offset + 1."""
    geo = ctx.geo
    g = stream(seed, geo.state, "chunk", t0)
    bits = Bits(g)
    tr = np.arange(t0, t1, dtype=np.int64)
    hh_tot = geo.tract_hh_persons[t0:t1]
    gq_tot = geo.tract_gq_persons[t0:t1]
    tcounty = geo.tract_county[t0:t1].astype(np.int64)

    # --- households (occupied housing units)
    def hh_sampler(grp: I64) -> I64:
        return draw(_HH_SIZE_LUT, bits, grp.size).astype(np.int64) + 1

    hh_local, hh_size = fill_groups(g, hh_tot, 2.5, hh_sampler)
    H = hh_size.size
    n_hh_t = np.bincount(hh_local, minlength=tr.size)
    # --- vacant housing units
    v = geo.county_vacancy[tcounty]
    n_vac_t = g.poisson(n_hh_t * v / (1.0 - v))
    vac_local = np.repeat(np.arange(tr.size, dtype=np.int64), n_vac_t)
    # --- group quarters facilities
    gq_types = g.multinomial(gq_tot, prm.GQ_TYPE_SHARES) if tr.size else np.zeros((0, 7), dtype=np.int64)
    mu = np.log(prm.GQ_SIZE_MEDIAN)

    def gq_sampler(grp: I64) -> I64:
        t = grp % 7
        sz = np.ceil(g.lognormal(mu[t], prm.GQ_SIZE_SIGMA[t]))
        return np.clip(sz, 1, prm.GQ_MAX_SIZE).astype(np.int64)

    fac_grp, fac_size = fill_groups(g, gq_types.ravel().astype(np.int64), 60.0, gq_sampler)
    fac_local, fac_type = fac_grp // 7, (fac_grp % 7).astype(np.int64)
    F = fac_size.size
    ncodes = np.diff(_GQ_TYPE_CODE_START)[fac_type]
    pick = (g.random(F) * ncodes).astype(np.int64)
    fac_gqtype = _GQ_TYPE_CODES_FLAT[_GQ_TYPE_CODE_START[fac_type] + pick]

    # --- units: [households, vacant, GQ]; block within tract by the tract's block weights
    V = vac_local.size
    U = H + V + F
    keys = np.concatenate([_within_tract_keys(bits, tr[x]) for x in (hh_local, vac_local, fac_local)])
    unit_block = np.searchsorted(geo.block_key, keys, side="right").astype(np.int64)
    unit_local = np.concatenate((hh_local, vac_local, fac_local))
    unit_mafid = ctx.mafid_base + unit_offset + 1 + np.arange(U, dtype=np.int64)
    unit_rtype = np.concatenate((np.full(H + V, 2, np.int8), np.full(F, 4, np.int8)))
    unit_county = tcounty[unit_local]

    p_hh = _households(bits, ctx, hh_size, unit_county[:H])
    p_gq = _gq_persons(bits, ctx, fac_size, fac_type, unit_county[H + V :], H + V)

    nu = np.zeros(V + F, dtype=np.int8)
    return Chunk(
        state=geo.state,
        unit_mafid=unit_mafid,
        unit_rtype=unit_rtype,
        unit_block=unit_block,
        unit_gqtype=np.concatenate((np.zeros(H + V, np.int16), fac_gqtype)),
        unit_hhgq=np.concatenate((np.zeros(H + V, np.int8), (fac_type + 1).astype(np.int8))),
        unit_final_pop=np.concatenate((hh_size, np.zeros(V, np.int64), fac_size)).astype(np.int32),
        unit_npf=np.concatenate((p_hh["npf"], nu)).astype(np.int16),
        unit_hhspan=np.concatenate((p_hh["hhspan"], nu)).astype(np.int8),
        unit_hhrace=np.concatenate((p_hh["hhrace"], nu)).astype(np.int8),
        unit_ten=np.concatenate((p_hh["ten"], nu)).astype(np.int8),
        unit_hht=np.concatenate((p_hh["hht"], nu)).astype(np.int8),
        unit_hht2=np.concatenate((p_hh["hht2"], nu)).astype(np.int8),
        unit_cplt=np.concatenate((p_hh["cplt"], nu)).astype(np.int8),
        person_unit=np.concatenate((p_hh["unit"], p_gq["unit"])),
        rtype=np.concatenate((np.full(p_hh["unit"].size, 3, np.int8), np.full(p_gq["unit"].size, 5, np.int8))),
        qage=np.concatenate((p_hh["age"], p_gq["age"])).astype(np.int16),
        qsex=np.concatenate((p_hh["sex"], p_gq["sex"])).astype(np.int8),
        relship=np.concatenate((p_hh["rel"], p_gq["rel"])).astype(np.int8),
        cenhisp=np.concatenate((p_hh["cenhisp"], p_gq["cenhisp"])).astype(np.int8),
        qspan=np.concatenate((p_hh["qspan"], p_gq["qspan"])).astype(np.int16),
        cenrace=np.concatenate((p_hh["cenrace"], p_gq["cenrace"])).astype(np.int8),
        qrace=np.concatenate((p_hh["qrace"], p_gq["qrace"]), axis=1),
        householder=np.concatenate((p_hh["rel"] == 20, np.zeros(p_gq["unit"].size, dtype=bool))),
    )


Arrays = dict[str, npt.NDArray[Any]]


def _race_eth(bits: Bits, ctx: StateContext, county: I64) -> Arrays:
    thr = np.minimum(np.rint(ctx.county_hisp * 65536), 65535).astype(np.uint16)  # P(Hispanic) to 2**-16
    hisp = bits.u16(county.size) < thr[county]
    cenrace = draw_cenrace(bits, ctx.race, county, hisp)
    qspan = draw_qspan(bits, hisp, ctx.geo.state == "72")
    qrace = draw_detailed(bits, cenrace, hisp, qspan)
    return {
        "cenhisp": np.where(hisp, 2, 1).astype(np.int8),
        "cenrace": cenrace,
        "qspan": qspan,
        "qrace": qrace,
    }


def _derived_tables() -> tuple[npt.NDArray[np.int8], npt.NDArray[np.int8]]:
    """HHT and HHT2 for every combination of the household flags (index bits: 1 alone, 2 spouse present,
    4 unmarried partner present, 8 a relative present, 16 own child under 18, 32 male householder)."""
    k = np.arange(64)
    alone, spouse, cohab, fam, kid, male = ((k >> i) & 1 == 1 for i in range(6))
    hht = np.select([alone & male, alone, spouse, fam & male, fam, male], [4, 6, 1, 2, 3, 5], 7)
    hht2 = np.select(
        [
            spouse & kid,
            spouse,
            cohab & kid,
            cohab,
            ~male & alone,
            ~male & kid,
            ~male & fam,
            ~male,
            alone,
            kid,
            fam,
        ],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        12,
    )
    return hht.astype(np.int8), hht2.astype(np.int8)


_HHT_TABLE, _HHT2_TABLE = _derived_tables()
_CPLT_TABLE = np.full(64, 5, dtype=np.int8)
_CPLT_TABLE[[21, 23, 22, 24]] = [1, 2, 3, 4]
_SAME_SEX = np.zeros(64, dtype=bool)
_SAME_SEX[[23, 24]] = True
_AGE_CHILD = np.zeros(64, dtype=bool)
_AGE_CHILD[[25, 26, 27, 35]] = True


def _group_sum(flag: B, starts: npt.NDArray[np.int32], n: int) -> npt.NDArray[np.int32]:
    """Per-household count of a person flag (households are contiguous runs starting at ``starts``)."""
    c = np.concatenate((np.zeros(1, np.int32), np.cumsum(flag, dtype=np.int32)))
    ends = np.concatenate((starts[1:], np.array([n], dtype=np.int32)))
    out: npt.NDArray[np.int32] = c[ends] - c[starts]
    return out


def _spread_codes(
    q: I16,
    ri: npt.NDArray[np.int32],
    own: B,
    starts: npt.NDArray[np.int32],
    size: npt.NDArray[np.int32],
    hh: npt.NDArray[np.int32],
) -> I16:
    """QRACE rows for all persons from the rows drawn for the ``own`` persons (``ri`` = source row index).
    Rows 1-2 are gathered; the sparse rows 3-8 are filled only where a source code exists: at its own person
    and, when that person is a householder, at the household members who copy the householder."""
    n = ri.size
    out = np.zeros((8, n), dtype=np.int16)
    out[0] = q[0][ri]
    out[1] = q[1][ri]
    own_idx = np.flatnonzero(own)
    for j in range(2, 8):
        nz = np.flatnonzero(q[j])
        if nz.size == 0:
            break
        p = own_idx[nz]
        out[j, p] = q[j, nz]
        heads = p[starts[hh[p]] == p]
        h = hh[heads]
        m = size[h] - 1
        if m.sum() == 0:
            continue
        members = np.repeat(starts[h] + 1 - np.cumsum(m) + m, m) + np.arange(int(m.sum()), dtype=np.int32)
        members = members[~own[members]]
        out[j, members] = out[j, starts[hh[members]]]
    return out


def _households(bits: Bits, ctx: StateContext, size: I64, county: I64) -> Arrays:
    H = size.size
    n = int(size.sum())
    size32 = size.astype(np.int32)
    starts = (np.cumsum(size32) - size32).astype(np.int32)
    hh = np.repeat(np.arange(H, dtype=np.int32), size32)
    kind = np.where(size == 1, 0, 1 + draw(_KIND_LUT, bits, H)).astype(np.int8)
    male_hh = bits.unif(H) < prm.HOUSEHOLDER_MALE[kind]
    # relationship: family-member codes for everybody, then the householder, partners, the first relative of
    # an "other family" household and the members of nonfamily households (all located by household, not by a
    # scan of the persons)
    u16 = bits.u16(n)
    rel = _FAM_CODES[_FAM_LUT[u16]]
    nonfam = np.flatnonzero(kind == 4)
    if nonfam.size:
        m = size32[nonfam] - 1
        idx = np.repeat(starts[nonfam] + 1 - np.cumsum(m) + m, m) + np.arange(int(m.sum()), dtype=np.int32)
        rel[idx] = _NONFAM_CODES[_NONFAM_LUT[u16[idx]]]
    first_rel = starts[kind == 3] + 1
    rel[first_rel] = _REL_ONLY_CODES[_REL_ONLY_LUT[u16[first_rel]]]
    couple = np.flatnonzero((kind == 1) | (kind == 2))
    partner_idx = starts[couple] + 1
    up = bits.unif(partner_idx.size)
    rel[partner_idx] = np.where(
        kind[couple] == 1,
        np.where(up < prm.SAME_SEX_MARRIED, 23, 21),
        np.where(up < prm.SAME_SEX_UNMARRIED, 24, 22),
    )
    rel[starts] = 20
    # sex: householder by kind, partner by same/opposite sex, others 51 % male
    male = bits.bernoulli(0.51, n)
    male[starts] = male_hh
    male[partner_idx] = male_hh[couple] == _SAME_SEX[rel[partner_idx]]
    # ages (computed per relationship group)
    hh_age = _householder_ages(bits, size == 1)
    hh_age16 = hh_age.astype(np.int16)
    age = np.empty(n, dtype=np.int16)
    child = np.flatnonzero(_AGE_CHILD[rel])
    uc = bits.unif(child.size)
    age[child] = uc * np.sqrt(uc) * (np.clip(hh_age16[hh[child]] - 17, 0, 60) + 1)
    other = np.flatnonzero((rel > 20) & ~_AGE_CHILD[rel])
    ro = rel[other]
    Ao = hh_age16[hh[other]].astype(np.float32)
    uo = bits.unif(other.size)
    zo = bits.g.standard_normal(other.size, dtype=np.float32)
    vals = np.select(
        [ro <= 24, ro == 30, (ro == 29) | (ro == 31), ro == 28, ro == 32, ro == 33],
        [
            np.clip(Ao + np.rint(zo * 5), 16, 100),
            uo * np.sqrt(uo) * 26,
            np.clip(Ao + 18 + uo * 18, 0, 110),
            np.clip(Ao + np.rint(zo * 8), 0, 100),
            np.clip(Ao - 20 - uo * 15, 16, 100),
            uo * 90,
        ],
        np.clip(Ao + np.rint(zo * 8), 16, 95),
    )
    age[other] = vals
    age[starts] = hh_age16
    # Hispanic origin and race: a member shares the householder's (all of it) w.p. HOUSEHOLD_RACE_COPY
    own = ~bits.bernoulli(prm.HOUSEHOLD_RACE_COPY, n)
    own[starts] = True
    rank = np.cumsum(own, dtype=np.int32) - 1
    ri = np.where(own, rank, rank[starts][hh])
    re = _race_eth(bits, ctx, county[hh[own]])
    cenhisp = re["cenhisp"][ri]
    cenrace = re["cenrace"][ri]
    qspan = re["qspan"][ri]
    qrace = _spread_codes(re["qrace"], ri, own, starts, size32, hh)
    # unit attributes derived from the persons
    n_rel = _group_sum(_IS_RELATIVE[rel], starts, n)
    own_kid = _group_sum(_IS_OWN_CHILD[rel] & (age < 18), starts, n) > 0
    pcode = np.zeros(H, dtype=np.int8)
    pcode[couple] = rel[partner_idx]
    fam = n_rel > 0
    key = (
        (size == 1)
        | ((pcode == 21) | (pcode == 23)) << 1
        | ((pcode == 22) | (pcode == 24)) << 2
        | fam << 3
        | own_kid << 4
        | male_hh << 5
    )
    a, b, lo, hi = prm.OWNER_LOGIT
    p_own = np.clip(a + b * (hh_age16 - 25), lo, hi)
    own_t = bits.unif(H) < p_own
    mort = bits.unif(H) < np.where(hh_age16 < 60, prm.MORTGAGE_SHARE_UNDER_60, prm.MORTGAGE_SHARE_60_PLUS)
    ten = np.where(own_t, np.where(mort, 1, 2), np.where(bits.unif(H) < prm.NO_RENT_SHARE, 4, 3))
    return {
        "unit": hh,
        "age": age,
        "sex": 2 - male.view(np.int8),
        "rel": rel,
        "cenhisp": cenhisp,
        "qspan": qspan,
        "cenrace": cenrace,
        "qrace": qrace,
        "npf": np.where(fam, n_rel.astype(np.int16) + 1, 0),
        "hhspan": cenhisp[starts],
        "hhrace": cenrace[starts],
        "ten": ten,
        "hht": _HHT_TABLE[key],
        "hht2": _HHT2_TABLE[key],
        "cplt": _CPLT_TABLE[pcode],
    }


def _gq_persons(bits: Bits, ctx: StateContext, fac_size: I64, fac_type: I64, county: I64, unit_base: int) -> Arrays:
    F = fac_size.size
    fac = np.repeat(np.arange(F, dtype=np.int64), fac_size)
    n = fac.size
    t = fac_type[fac]
    lo, hi = prm.GQ_AGE_RANGE[t, 0], prm.GQ_AGE_RANGE[t, 1]
    age = np.minimum(lo + (bits.unif(n) * (hi - lo + 1)).astype(np.int64), 115)
    male = bits.unif(n) < prm.GQ_MALE[t]
    rel = np.where(prm.GQ_INSTITUTIONAL[t], 37, 38).astype(np.int8)
    re = _race_eth(bits, ctx, county[fac])
    return {"unit": unit_base + fac, "age": age, "sex": np.where(male, 1, 2), "rel": rel, **re}
