"""Race and Hispanic origin: CENRACE combinations, detailed QRACE1..8 codes and QSPAN from the real 2020
code list.

A person's major-race combination (CENRACE 01-63) is drawn first, from a county table conditional on Hispanic
origin; then one detailed code per major race in the combination (a head of common checkbox codes plus a Zipf tail
over every other 2020 code of that race), occasionally a second code of the same race. CENRACE is therefore
consistent with the detailed codes by construction: the set of major races of QRACE1..8 is exactly CENRACE's.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np
import numpy.typing as npt

from dasflow.synth import params as prm
from dasflow.synth.reference import NOT_HISPANIC_QSPAN, cenrace_table, race_codes
from dasflow.synth.sampling import Bits, draw, lookup_table, lookup_tables

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class CodeTable:
    """Codes and their probabilities, sampled through a 2**20-entry lookup table."""

    codes: npt.NDArray[np.int16]
    probs: F64
    table: npt.NDArray[np.int16]

    def draw(self, bits: Bits, n: int) -> npt.NDArray[np.int16]:
        return self.codes[draw(self.table, bits, n)]


def _head_tail(pool: npt.NDArray[np.int16], head: dict[int, float]) -> CodeTable:
    codes = np.asarray(pool, dtype=np.int16)
    p = np.zeros(codes.size)
    pos = {int(c): i for i, c in enumerate(codes)}
    for c, w in head.items():
        p[pos[c]] = w
    tail = np.flatnonzero(p == 0)
    mass = 1.0 - sum(head.values())
    if tail.size and mass > 0:
        z = 1.0 / np.arange(1, tail.size + 1) ** prm.ZIPF_EXPONENT
        p[tail] = mass * z / z.sum()
    p = p / p.sum()
    return CodeTable(codes, p, lookup_table(p, 20))


@cache
def race_code_tables() -> tuple[CodeTable, ...]:
    """One table of detailed codes per major race (MAJOR_RACES order)."""
    rc = race_codes()
    return tuple(_head_tail(rc.by_major[i], prm.RACE_HEAD_CODES[i]) for i in range(6))


@cache
def stacked_code_table() -> npt.NDArray[np.int16]:
    """The six races' 2**20-entry tables stacked and mapped to codes: ``table[race << 20 | u20]`` is a detailed
    code of ``race`` drawn with that race's probabilities (one gather per person, no grouping)."""
    return np.concatenate([t.codes[t.table] for t in race_code_tables()])


def _codes_by_race(bits: Bits, race: npt.NDArray[np.int8]) -> npt.NDArray[np.int16]:
    """One detailed code per person from the table of ``race`` (0..5)."""
    idx = (race.astype(np.int32) << 20) | (bits.u32(race.size) >> np.uint32(12)).astype(np.int32)
    out: npt.NDArray[np.int16] = stacked_code_table()[idx]
    return out


@cache
def hispanic_origin_table(puerto_rico: bool) -> CodeTable:
    """QSPAN codes of Hispanic persons (Puerto Rico has its own head: mostly Puerto Rican)."""
    head = prm.PR_HISPANIC_ORIGIN_HEAD if puerto_rico else prm.HISPANIC_ORIGIN_HEAD
    return _head_tail(race_codes().hispanic_origin, head)


@cache
def _first_race() -> npt.NDArray[np.int8]:
    out = np.zeros(64, dtype=np.int8)
    for m in range(1, 64):
        out[m] = (m & -m).bit_length() - 1
    return out


def state_race_probs(state: str) -> F64:
    """(2, 63) P(CENRACE = j+1 | not Hispanic / Hispanic) for the state, before county variation."""
    _, code_to_mask = cenrace_table()
    masks = code_to_mask[1:].astype(np.int64)
    sizes = np.array([bin(int(m)).count("1") for m in masks])
    bits = (masks[:, None] >> np.arange(6)[None, :]) & 1
    aff = np.prod(np.where(bits == 1, prm.MULTI_RACE_AFFINITY[None, :], 1.0), axis=1)
    mult = np.ones(6)
    for r, f in prm.STATE_RACE_MULTIPLIER.get(state, {}).items():
        mult[r] = f
    smult = np.prod(np.where(bits == 1, mult[None, :], 1.0), axis=1)
    out = np.zeros((2, 63))
    for h, (alone, two) in enumerate(
        ((prm.ALONE_SHARES_NONHISP, prm.TWO_PLUS_NONHISP), (prm.ALONE_SHARES_HISP, prm.TWO_PLUS_HISP))
    ):
        p = np.zeros(63)
        p[:6] = alone
        for k in range(2, 7):
            sel = sizes == k
            p[sel] = two * prm.MULTI_SIZE_SHARES[k - 2] * aff[sel] / aff[sel].sum()
        p = p * smult
        out[h] = p / p.sum()
    return out


#: county race-class tables have 2**14 entries: each class probability to within 6e-5 (3,221 counties x 2 tables)
CLASS_LUT_BITS = 14
CLASS_LUT_SIZE = 1 << CLASS_LUT_BITS


@dataclass(frozen=True)
class RaceTables:
    """Per-state race sampling tables: per (county, Hispanic) a lookup table over 7 classes (the six races alone,
    then "two or more"), and per Hispanic status a table over the 57 multiracial CENRACE codes (07..63)."""

    county_class: npt.NDArray[np.int8]  # (K*2*CLASS_LUT_SIZE,) row = 2*county + hispanic
    multi: tuple[npt.NDArray[np.int16], npt.NDArray[np.int16]]
    county_probs: F64  # (K, 2, 7) for reporting and tests


def race_tables(g: np.random.Generator, state: str, n_counties: int) -> RaceTables:
    """County tables vary around the state table by a Dirichlet draw (concentration
    COUNTY_RACE_CONCENTRATION)."""
    base = state_race_probs(state)
    seven = np.concatenate((base[:, :6], base[:, 6:].sum(axis=1, keepdims=True)), axis=1)
    alpha = np.broadcast_to(seven[None, :, :] * prm.COUNTY_RACE_CONCENTRATION, (n_counties, 2, 7))
    x = g.gamma(alpha) + 1e-300
    x /= x.sum(axis=2, keepdims=True)
    luts = lookup_tables(x.reshape(n_counties * 2, 7), CLASS_LUT_BITS)
    multi = (lookup_table(base[0, 6:], 16), lookup_table(base[1, 6:], 16))
    return RaceTables(luts, multi, x)


def draw_cenrace(bits: Bits, tables: RaceTables, county: I64, hisp: npt.NDArray[np.bool_]) -> npt.NDArray[np.int8]:
    """CENRACE (1..63) given the county index and Hispanic origin of each person."""
    n = county.size
    row = county * 2 + hisp
    cls = tables.county_class[row * CLASS_LUT_SIZE + (bits.u16(n) >> np.uint16(16 - CLASS_LUT_BITS))]
    out: npt.NDArray[np.int8] = (cls + 1).astype(np.int8)
    multi = np.flatnonzero(cls == 6)
    if multi.size:
        u = bits.u16(multi.size)
        h = hisp[multi]
        combo = np.where(h, tables.multi[1][u], tables.multi[0][u])
        out[multi] = (combo + 7).astype(np.int8)
    return out


def county_hispanic_rates(g: np.random.Generator, share: float, n_counties: int) -> F64:
    """County Hispanic shares: the state share perturbed on the logit scale."""
    s = min(max(share, 1e-4), 1 - 1e-4)
    z = np.log(s / (1 - s)) + g.normal(0.0, prm.COUNTY_HISP_LOGIT_SD, n_counties)
    out: F64 = 1.0 / (1.0 + np.exp(-z))
    return out


def draw_qspan(bits: Bits, hispanic: npt.NDArray[np.bool_], puerto_rico: bool) -> npt.NDArray[np.int16]:
    """QSPAN: a detailed Hispanic-origin code (2xxx) for Hispanic persons, 9950 "Not Hispanic" otherwise."""
    out = np.full(hispanic.size, NOT_HISPANIC_QSPAN, dtype=np.int16)
    idx = np.flatnonzero(hispanic)
    out[idx] = hispanic_origin_table(puerto_rico).draw(bits, idx.size)
    return out


@cache
def _popcount() -> npt.NDArray[np.int8]:
    return np.array([bin(m).count("1") for m in range(64)], dtype=np.int8)


def draw_detailed(
    bits: Bits, cenrace: npt.NDArray[np.int8], hispanic: npt.NDArray[np.bool_], qspan: npt.NDArray[np.int16]
) -> npt.NDArray[np.int16]:
    """(8, n) QRACE1..QRACE8 (row j = QRACE{j+1}; 0 = Null): one code per major race of CENRACE, in
    MAJOR_RACES order, plus with a small probability a second code of the first race. A Hispanic person
    reporting Some Other Race often gives the origin write-in (a 2xxx code, which is SOR) as the race code."""
    _, code_to_mask = cenrace_table()
    mask = code_to_mask[cenrace]
    n = cenrace.size
    out = np.zeros((8, n), dtype=np.int16)
    first = _first_race()[mask]
    out[0] = _codes_by_race(bits, first)
    k = _popcount()[mask]
    pos = np.ones(n, dtype=np.int8)
    multi = np.flatnonzero(k > 1)
    mm = mask[multi]
    for r in range(1, 6):
        idx = multi[((mm >> r) & 1 == 1) & (first[multi] < r)]
        codes = race_code_tables()[r].draw(bits, idx.size)
        out[pos[idx], idx] = codes
        pos[idx] += 1
    # Hispanic SOR persons: the SOR code is the last one (SOR is the last major race)
    sor = np.flatnonzero((mask >> 5) & hispanic)
    use = sor[bits.unif(sor.size) < prm.HISP_SOR_USES_ORIGIN_CODE]
    out[pos[use] - 1, use] = qspan[use]
    extra = np.flatnonzero(bits.bernoulli(prm.EXTRA_CODE_SAME_RACE, n))
    if extra.size:
        codes = _codes_by_race(bits, first[extra])
        keep = (codes != out[0, extra]) & (codes != out[1, extra]) & (pos[extra] < 8)
        e = extra[keep]
        out[pos[e], e] = codes[keep]
    return out
