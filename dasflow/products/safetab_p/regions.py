"""SafeTab-P region types: the geography levels of the US and Puerto Rico runs (public facts, no data).

REGION_ID conventions (production): "1" for USA; 2-digit state FIPS; state+county (5); state+county+tract (11);
state+place (7); AIANNHCE (4). Puerto Rico (state 72) is a separate run with its own budget and region types.
"""

from __future__ import annotations

from typing import Literal

Universe = Literal["US", "PR"]

US_REGION_TYPES: tuple[str, ...] = ("USA", "STATE", "COUNTY", "TRACT", "PLACE", "AIANNH")
PR_REGION_TYPES: tuple[str, ...] = ("PR-STATE", "PR-COUNTY", "PR-TRACT", "PR-PLACE")
ALL_REGION_TYPES: tuple[str, ...] = US_REGION_TYPES + PR_REGION_TYPES

#: iteration levels tabulated (LEVEL 0 iterations are ignored)
ITERATION_LEVELS: tuple[int, ...] = (1, 2)

#: region types whose T1 counts are never zero-suppressed
UNSUPPRESSED_REGION_TYPES: frozenset[str] = frozenset({"USA", "STATE", "PR-STATE"})

PR_STATE_FIPS = "72"

#: Census SafeTab-P region granularity (safetab_utils ``REGION_GRANULARITY_MAPPING``, 2020 production): a
#: *detailed* region type tabulates the iterations with COARSE_ONLY = False (DETAILED_ONLY either way); a
#: *coarse* one those with DETAILED_ONLY = False (COARSE_ONLY either way).
REGION_GRANULARITY: dict[str, str] = {
    "USA": "detailed", "STATE": "detailed", "COUNTY": "coarse", "TRACT": "coarse", "PLACE": "coarse",
    "AIANNH": "coarse", "PR-STATE": "detailed", "PR-COUNTY": "coarse", "PR-TRACT": "coarse",
    "PR-PLACE": "coarse",
}

#: the iteration set of a region type when the config turns the granularity rule off (pre-issue-23 behaviour)
ALL_ITERATIONS = "all"


def config_suffix(region_type: str) -> str:
    """The config-key suffix of a region type: ``PR-COUNTY`` → ``pr_county``."""
    return region_type.lower().replace("-", "_")


def region_types(universe: Universe) -> tuple[str, ...]:
    """Region types of one run."""
    return US_REGION_TYPES if universe == "US" else PR_REGION_TYPES


def iteration_set(region_type: str, ignore_granularity: bool = False) -> str:
    """``"detailed"``, ``"coarse"`` (the Census rule), or ``"all"`` when the config opts out of the rule."""
    return ALL_ITERATIONS if ignore_granularity else REGION_GRANULARITY[region_type]


def base_type(region_type: str) -> str:
    """``PR-COUNTY`` → ``COUNTY`` (the geography the region ID is built from)."""
    return region_type[3:] if region_type.startswith("PR-") else region_type
