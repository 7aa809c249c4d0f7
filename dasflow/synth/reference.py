"""Public reference data shipped with the generator (see ``data/PROVENANCE.md``).

* ``states_2020.csv``: the 50 states, DC and Puerto Rico with their FIPS codes, 2020 census resident
  population
  (used only as population *shares*), Census region/division codes and an approximate 2020 Hispanic share.
* ``counties_2020.csv``: the 2020 county-equivalent FIPS codes (3,143 in the 50 states + DC, 78 in PR).
* ``race_eth_codes_2020.csv``: the 2020 detailed race/ethnicity codes with the major race each one belongs to
  (derived from the production "alone or in combination" iterations).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import cache
from importlib import resources

import numpy as np
import numpy.typing as npt

#: Major races in CENRACE order (bit i of a race mask = MAJOR_RACES[i]).
MAJOR_RACES: tuple[str, ...] = ("White", "Black", "AIAN", "Asian", "NHPI", "SOR")

#: QSPAN code used for every non-Hispanic person ("Not Hispanic (checkbox)").
NOT_HISPANIC_QSPAN = 9950


@dataclass(frozen=True)
class State:
    """One state or state equivalent."""

    fips: str
    usps: str
    name: str
    pop2020: int
    region: int
    division: int
    hispanic_share: float
    index: int  # position in FIPS order among the 52 (used for the MAFID ranges)


def _read_csv(name: str) -> list[dict[str, str]]:
    text = resources.files("dasflow.synth").joinpath("data", name).read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines()))


@cache
def states() -> dict[str, State]:
    """All 52 state equivalents keyed by 2-digit FIPS, in FIPS order."""
    out: dict[str, State] = {}
    for i, r in enumerate(_read_csv("states_2020.csv")):
        out[r["STATEFP"]] = State(
            r["STATEFP"],
            r["USPS"],
            r["NAME"],
            int(r["POP2020"]),
            int(r["REGIONCE"]),
            int(r["DIVISIONCE"]),
            float(r["HISP_SHARE"]),
            i,
        )
    return out


@cache
def counties() -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    """State FIPS -> (county FIPS codes as ints, county names), sorted by code."""
    acc: dict[str, tuple[list[int], list[str]]] = {}
    for r in _read_csv("counties_2020.csv"):
        codes, names = acc.setdefault(r["STATEFP"], ([], []))
        codes.append(int(r["COUNTYFP"]))
        names.append(r["NAME"])
    return {st: (tuple(c), tuple(n)) for st, (c, n) in sorted(acc.items())}


@dataclass(frozen=True)
class RaceCodes:
    """Detailed 2020 race/ethnicity codes split by major race (index 0..5 = MAJOR_RACES) and Hispanic
    origin."""

    by_major: tuple[npt.NDArray[np.int16], ...]
    hispanic_origin: npt.NDArray[np.int16]
    names: dict[int, str]


@cache
def race_codes() -> RaceCodes:
    """Race codes of each major race (Hispanic-origin 2xxx codes are excluded from the race pools; they are
    SOR when reported as a race and are drawn from the Hispanic-origin pool)."""
    pools: list[list[int]] = [[] for _ in MAJOR_RACES]
    hisp: list[int] = []
    names: dict[int, str] = {}
    for r in _read_csv("race_eth_codes_2020.csv"):
        code, major = int(r["CODE"]), int(r["MAJOR_RACE"])
        names[code] = r["NAME"]
        if 2000 <= code <= 2999:
            hisp.append(code)
        elif major > 0:
            pools[major - 1].append(code)
    return RaceCodes(
        tuple(np.array(sorted(p), dtype=np.int16) for p in pools),
        np.array(sorted(hisp), dtype=np.int16),
        names,
    )


@cache
def cenrace_table() -> tuple[npt.NDArray[np.int8], npt.NDArray[np.uint8]]:
    """(mask -> CENRACE code, CENRACE code -> mask) for the 63 non-empty major-race combinations.

    CENRACE orders combinations by the number of races, then lexicographically in MAJOR_RACES order:
    01-06 alone, 07-21 two races, 22-41 three, 42-56 four, 57-62 five, 63 all six (the PL 94-171 order)."""
    from itertools import combinations

    mask_to_code = np.zeros(64, dtype=np.int8)
    code_to_mask = np.zeros(64, dtype=np.uint8)
    code = 0
    for k in range(1, 7):
        for combo in combinations(range(6), k):
            code += 1
            mask = sum(1 << i for i in combo)
            mask_to_code[mask] = code
            code_to_mask[code] = mask
    return mask_to_code, code_to_mask
