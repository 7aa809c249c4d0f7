"""Distribution targets of the synthetic census (2020-like shapes; see ``docs/synth.md``).

These are the numbers the marginal-distribution tests check against. They are rounded public 2020 Census
figures or plausible stand-ins where no public figure was to hand (marked "approx."); synthetic data only needs
realistic *shapes*, never the real values.
"""

from __future__ import annotations

import numpy as np

GENERATOR_VERSION = "1.0.0"

# ---- geography fan-outs (full scale ~331 M persons: ~84 K tracts, ~240 K block groups, ~8 M blocks)
PERSONS_PER_TRACT = 3940.0
PERSONS_PER_BLOCK_GROUP = 1380.0
PERSONS_PER_BLOCK = 41.0
COUNTY_LOGNORMAL_SIGMA = 1.6  # county sizes within a state: median ~1/5 of mean, like real counties
TRACT_LOGNORMAL_SIGMA = 0.35  # tracts are drawn to ~1,200-8,000 persons
BLOCK_LOGNORMAL_SIGMA = 1.1  # heavy-tailed block sizes
BLOCK_GROUP_LOGNORMAL_SIGMA = 0.3
EMPTY_BLOCK_SHARE = 0.30  # blocks with no housing unit and no GQ (approx.)
PLACE_TRACT_SHARE = 0.72  # tracts inside an incorporated place or CDP (approx.)
PLACE_EDGE_BLOCK_SHARE = 0.10  # blocks of a place tract that fall outside the place
PERSONS_PER_PLACE = 12_000.0
PERSONS_PER_COUSUB = 50_000.0
AIANNH_BLOCK_SHARE_IN_TRACT = 0.85

#: share of a state's tracts inside an AIANNH area and number of areas (approx. shapes, not real figures)
AIANNH_TRACT_SHARE: dict[str, float] = {
    "02": 0.35,
    "40": 0.45,
    "04": 0.12,
    "35": 0.12,
    "46": 0.10,
    "30": 0.10,
    "38": 0.06,
    "53": 0.05,
    "41": 0.03,
    "32": 0.04,
    "49": 0.03,
    "56": 0.04,
    "16": 0.04,
    "27": 0.03,
    "55": 0.03,
    "31": 0.02,
    "06": 0.02,
    "08": 0.01,
    "15": 0.10,
    "36": 0.01,
    "26": 0.01,
    "37": 0.01,
}
DEFAULT_AIANNH_TRACT_SHARE = 0.004
AIANNH_AREAS: dict[str, int] = {
    "02": 200,
    "06": 100,
    "40": 25,
    "04": 22,
    "35": 24,
    "53": 30,
    "32": 28,
    "15": 40,
    "27": 12,
    "55": 11,
    "46": 9,
    "30": 8,
}
DEFAULT_AIANNH_AREAS = 3
NO_AIANNH_STATES = frozenset({"11", "72"})
#: multi-state AIANNH areas, as in reality (e.g. Navajo Nation AZ/NM/UT, Standing Rock ND/SD)
MULTISTATE_AIANNH: tuple[tuple[str, ...], ...] = (
    ("04", "35", "49"),
    ("32", "49"),
    ("16", "32"),
    ("32", "41"),
    ("38", "46"),
    ("08", "35", "49"),
    ("04", "06", "32"),
    ("04", "06"),
    ("06", "32"),
    ("30", "38"),
    ("31", "46"),
    ("19", "31"),
)

# ---- persons / units
GQ_SHARE_TARGET = 0.0241  # the tract model's expectation; 2020: ~8.2 M of 331 M persons (2.45 %) in GQ
GQ_TRACT_SHARE = 0.25  # tracts with a sizeable GQ population
GQ_RATE_BASE = 0.005
GQ_RATE_BETA = (1.5, 17.0)  # mean ~0.081 in GQ tracts: overall ~0.0241
VACANCY_BETA = (2.2, 20.0)  # county vacancy rates, mean ~0.099 (2020: 9.7 %)

#: household size shares 1..6 and "7 or more" (2020-like); the 7+ mass follows a geometric tail up to 40
HOUSEHOLD_SIZE_SHARES = np.array([0.276, 0.340, 0.156, 0.129, 0.060, 0.024, 0.015])
HOUSEHOLD_TAIL_RATIO = 0.55
MAX_HOUSEHOLD_SIZE = 40

#: household kinds for size >= 2: married couple, cohabiting couple, other family, nonfamily (roommates)
KIND_SHARES = np.array([0.62, 0.11, 0.21, 0.06])
SAME_SEX_MARRIED = 0.011
SAME_SEX_UNMARRIED = 0.06
#: P(householder is male) by kind: alone, married, cohabiting, other family, nonfamily
HOUSEHOLDER_MALE = np.array([0.47, 0.60, 0.55, 0.30, 0.55])

#: relationship of non-partner members of family/couple households (RELSHIP code, weight)
FAMILY_MEMBER_RELSHIP = np.array([25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36])
FAMILY_MEMBER_WEIGHTS = np.array([0.72, 0.02, 0.04, 0.03, 0.03, 0.06, 0.01, 0.01, 0.03, 0.015, 0.005, 0.025])
NONFAMILY_MEMBER_RELSHIP = np.array([34, 36])
NONFAMILY_MEMBER_WEIGHTS = np.array([0.55, 0.45])
RELATIVE_CODES = frozenset({21, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33})
OWN_CHILD_CODES = frozenset({25, 26, 27})

#: householder age brackets (lower bounds, upper bound exclusive) and shares: general and one-person
#: households
HH_AGE_EDGES = np.array([15, 25, 35, 45, 55, 65, 75, 85, 101])
HH_AGE_SHARES = np.array([0.05, 0.17, 0.19, 0.19, 0.19, 0.13, 0.06, 0.02])
ALONE_AGE_SHARES = np.array([0.05, 0.14, 0.11, 0.13, 0.19, 0.18, 0.13, 0.07])

#: tenure: P(owner) = clip(a + b * (age - 25), lo, hi); owners with a mortgage; renters occupying without rent
OWNER_LOGIT = (0.38, 0.011, 0.15, 0.88)
MORTGAGE_SHARE_UNDER_60 = 0.78
MORTGAGE_SHARE_60_PLUS = 0.42
NO_RENT_SHARE = 0.03

#: GQ major types (TopDown HHGQ 1..7): shares of the GQ population, facility size lognormal (median, sigma),
#: P(male), age range, 3-digit GQ type codes, institutional flag
GQ_TYPE_SHARES = np.array([0.239, 0.004, 0.153, 0.016, 0.277, 0.040, 0.271])
GQ_SIZE_MEDIAN = np.array([300.0, 30.0, 80.0, 25.0, 150.0, 200.0, 12.0])
GQ_SIZE_SIGMA = np.array([1.2, 0.8, 0.6, 1.0, 1.2, 1.2, 1.0])
GQ_MAX_SIZE = 20_000
GQ_MALE = np.array([0.92, 0.85, 0.33, 0.55, 0.45, 0.85, 0.60])
GQ_AGE_RANGE = np.array([[18, 70], [10, 20], [60, 106], [18, 90], [17, 25], [18, 40], [16, 90]])
GQ_TYPE_CODES: tuple[tuple[int, ...], ...] = (
    (101, 102, 103, 104, 105, 106),
    (201, 202, 203),
    (301,),
    (401, 402, 403, 404, 405),
    (501, 502),
    (601, 602),
    (701, 702, 704, 706, 801, 802, 900, 901, 903, 904),
)
GQ_INSTITUTIONAL = np.array([True, True, True, True, False, False, False])

# ---- race and ethnicity
#: P(race mask) as: alone shares in MAJOR_RACES order, then the "two or more races" share (2020-like)
ALONE_SHARES_NONHISP = np.array([0.712, 0.148, 0.0085, 0.074, 0.0025, 0.006])
TWO_PLUS_NONHISP = 0.049
ALONE_SHARES_HISP = np.array([0.204, 0.019, 0.020, 0.004, 0.001, 0.421])
TWO_PLUS_HISP = 0.331
#: among multiracial persons: number of races 2, 3, 4, 5, 6 and race affinities for the combination
MULTI_SIZE_SHARES = np.array([0.85, 0.12, 0.025, 0.004, 0.001])
MULTI_RACE_AFFINITY = np.array([1.0, 0.35, 0.25, 0.20, 0.05, 0.60])
#: state multipliers for races (applied to every combination containing the race), approx. 2020 shapes
STATE_RACE_MULTIPLIER: dict[str, dict[int, float]] = {
    "15": {3: 6.0, 4: 40.0, 0: 0.35},
    "02": {2: 13.0},
    "11": {1: 3.0},
    "28": {1: 2.6},
    "22": {1: 2.1},
    "13": {1: 2.1},
    "24": {1: 2.0},
    "01": {1: 1.8},
    "45": {1: 1.7},
    "40": {2: 8.0},
    "35": {2: 9.0},
    "46": {2: 8.0},
    "30": {2: 6.0},
    "04": {2: 4.0},
    "38": {2: 5.0},
    "06": {3: 2.2},
    "53": {3: 1.5},
    "72": {5: 3.0, 1: 0.5},
}
COUNTY_RACE_CONCENTRATION = 150.0  # Dirichlet concentration of county race tables around the state table
COUNTY_HISP_LOGIT_SD = 0.6
HOUSEHOLD_RACE_COPY = 0.85  # a member shares the householder's Hispanic origin, CENRACE and detailed codes

#: detailed race codes: explicit "head" codes per major race (weights of all draws) and a Zipf tail
RACE_HEAD_CODES: tuple[dict[int, float], ...] = (
    {1000: 0.55},
    {3000: 0.60},
    {5000: 0.35},
    {4020: 0.20, 4220: 0.19, 4450: 0.17, 4520: 0.10, 4050: 0.08, 4040: 0.04, 4000: 0.07},
    {7530: 0.30, 7550: 0.15, 7615: 0.10, 7500: 0.15},
    {8000: 0.50},
)
ZIPF_EXPONENT = 1.2
EXTRA_CODE_SAME_RACE = 0.04  # a second detailed code of the first race (e.g. White + German)
HISP_SOR_USES_ORIGIN_CODE = 0.60  # a Hispanic SOR person's race code repeats the origin write-in

HISPANIC_ORIGIN_HEAD: dict[int, float] = {
    2010: 0.59,
    2330: 0.09,
    2310: 0.04,
    2151: 0.04,
    2321: 0.04,
    2110: 0.03,
    2231: 0.02,
    2120: 0.02,
    2240: 0.012,
    2260: 0.01,
    2275: 0.01,
    2400: 0.02,
    2000: 0.03,
}
PR_HISPANIC_ORIGIN_HEAD: dict[int, float] = {2330: 0.94, 2321: 0.02, 2310: 0.005, 2010: 0.005, 2000: 0.01}

# ---- output sizing (bytes per person written, with headroom; measured, see benchmarks/results/synth.md)
BYTES_PER_PERSON = {"parquet": 20.0, "phsafe": 60.0, "phsafe_states": 60.0, "safetab_p": 80.0,
                    "safetab_p_states": 80.0, "topdown": 5.0, "groupsize": 5.0}
#: margin over the per-person figures, which are close to measured: the four national formats wrote 145 bytes
#: per person at 100 M persons (confidential and public files, 14.52 GB; BENCHMARKS.md, session 15) against 150
#: listed. 1.5 asked for 74.5 GB free at 331 M for ≈ 48 GB written; 1.25 asks for 62 GB (≈ 30 % margin)
DISK_HEADROOM = 1.25

# ---- streaming
CHUNK_PERSONS = 2_000_000  # a chunk (a run of whole tracts) holds at most about this many persons
