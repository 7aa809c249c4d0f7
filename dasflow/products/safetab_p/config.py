"""The SafeTab-P production ``config.json``: load, validate, and hold it with exact budgets.

Budget values are ρ (zCDP) or ε (pure DP) per (region type, iteration level); they are parsed with
``accounting.parse_budget`` into exact Fractions (``None`` = infinite budget = no noise, used by the ground-truth
twin); 0 means the (region type, level) is not tabulated. Every tabulated (region type, level) must have a threshold
triple θ1 < θ2 < θ3 in ``thresholds_p`` keyed ``"(REGION_TYPE, LEVEL)"``; a missing key is rejected before any data
is read.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.products.safetab_p.regions import (
    ALL_REGION_TYPES,
    ITERATION_LEVELS,
    PR_REGION_TYPES,
    US_REGION_TYPES,
    Universe,
    config_suffix,
)

CONFIG_FILE = "config.json"
_THRESHOLD_KEY = re.compile(r"^\(\s*([A-Z\-]+)\s*,\s*(\d+)\s*\)$")

PrivacyDefn = Literal["zcdp", "puredp"]


@dataclass(frozen=True)
class SafeTabPConfig:
    """A validated SafeTab-P configuration.

    ``budgets[(region_type, level)]``: the level budget ρ_i (zcdp) or ε_i (puredp); ``None`` = infinite (no noise);
    ``Fraction(0)`` = not tabulated. ``gamma`` is the stage-1 fraction. ``thresholds[(region_type, level)]`` holds
    θ1 < θ2 < θ3 as exact Fractions. ``zero_suppression_chance`` is exact. ``ignore_region_granularity``
    (config key of the same name, default false) turns the Census region-granularity rule off: every level-L
    iteration at every region type (the pre-issue-23 dasflow behaviour; stated in every plan key's level).
    """

    privacy_defn: PrivacyDefn
    max_race_codes: int
    budgets: Mapping[tuple[str, int], Fraction | None]
    gamma: Fraction
    thresholds: Mapping[tuple[str, int], tuple[Fraction, Fraction, Fraction]]
    zero_suppression_chance: Fraction
    allow_negative_counts: bool = True
    run_us: bool = True
    run_pr: bool = False
    reader: str = "csv"
    state_filter_us: tuple[str, ...] = ()
    ignore_region_granularity: bool = False
    source: str = CONFIG_FILE
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def tabulated(self, universe: Universe) -> list[tuple[str, int]]:
        """(region type, level) pairs of a run with a non-zero budget, in a fixed public order."""
        rts = US_REGION_TYPES if universe == "US" else PR_REGION_TYPES
        return [(rt, lv) for lv in ITERATION_LEVELS for rt in rts if self.budgets[(rt, lv)] != 0]

    def total_budget(self, universe: Universe) -> Fraction | None:
        """Σ ρ_i over the run's tabulated (region type, level) pairs (None if any is infinite)."""
        total = Fraction(0)
        for key in self.tabulated(universe):
            b = self.budgets[key]
            if b is None:
                return None
            total += b
        return total


def _fraction(value: Any, name: str, source: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, int | Decimal | str):
        raise InputError(f"{name} must be a number, got {value!r}", file=source, column=name)
    try:
        return Fraction(value)
    except (ValueError, ZeroDivisionError) as exc:
        raise InputError(f"{name} is not a finite number: {value!r}", file=source, column=name) from exc


def _bool(raw: Mapping[str, Any], name: str, default: bool, source: str) -> bool:
    value = raw.get(name, default)
    if not isinstance(value, bool):
        raise InputError(f"{name} must be true or false, got {value!r}", file=source, column=name)
    return value


def parse_config(raw: Mapping[str, Any], source: str = CONFIG_FILE) -> SafeTabPConfig:
    """Validate a decoded config (decimals as ``Decimal``) into a :class:`SafeTabPConfig`."""
    defn = raw.get("privacy_defn", "zcdp")
    if defn not in ("zcdp", "puredp"):
        raise InputError(f"privacy_defn must be 'zcdp' or 'puredp', got {defn!r}", file=source,
                         column="privacy_defn")
    mrc = raw.get("max_race_codes")
    if isinstance(mrc, bool) or not isinstance(mrc, int) or not 1 <= mrc <= 8:
        raise InputError(f"max_race_codes must be an integer in 1..8, got {mrc!r}", file=source,
                         column="max_race_codes")
    run_us = _bool(raw, "run_us", True, source)
    run_pr = _bool(raw, "run_pr", False, source)
    budgets: dict[tuple[str, int], Fraction | None] = {}
    for rt in ALL_REGION_TYPES:
        needed = run_us if rt in US_REGION_TYPES else run_pr
        for lv in ITERATION_LEVELS:
            name = f"privacy_budget_p_level_{lv}_{config_suffix(rt)}"
            if name not in raw:
                if needed:
                    raise InputError(f"missing budget {name}", file=source, column=name)
                budgets[(rt, lv)] = Fraction(0)
                continue
            try:
                b = accounting.parse_budget(raw[name], name)
            except ValueError as exc:
                raise InputError(str(exc), file=source, column=name) from exc
            if b is not None and b < 0:
                raise InputError(f"{name} must be >= 0, got {raw[name]!r}", file=source, column=name)
            budgets[(rt, lv)] = b
    gname = "privacy_budget_p_stage_1_fraction"
    gamma = _fraction(raw.get(gname), gname, source)
    if not 0 < gamma < 1:
        raise InputError(f"{gname} must be strictly between 0 and 1, got {gamma}", file=source, column=gname)
    zname = "zero_suppression_chance"
    zsc = _fraction(raw.get(zname, 0), zname, source)
    if not 0 <= zsc < 1:
        raise InputError(f"{zname} must be in [0, 1), got {zsc}", file=source, column=zname)
    thresholds = _parse_thresholds(raw.get("thresholds_p"), source)
    universes: list[Universe] = []
    if run_us:
        universes.append("US")
    if run_pr:
        universes.append("PR")
    if not universes:
        raise InputError("neither run_us nor run_pr is true: nothing to tabulate", file=source,
                         column="run_us")
    sf = raw.get("state_filter_us", [])
    if not isinstance(sf, list) or not all(isinstance(s, str) and re.fullmatch(r"\d\d", s) for s in sf):
        raise InputError("state_filter_us must be a list of 2-digit FIPS strings", file=source,
                         column="state_filter_us")
    if "72" in sf:
        raise InputError("state_filter_us must not contain Puerto Rico (72): PR is a separate run",
                         file=source, column="state_filter_us")
    cfg = SafeTabPConfig(
        privacy_defn=defn, max_race_codes=mrc, budgets=budgets, gamma=gamma, thresholds=thresholds,
        zero_suppression_chance=zsc, allow_negative_counts=_bool(raw, "allow_negative_counts", True, source),
        run_us=run_us, run_pr=run_pr, reader=str(raw.get("reader", "csv")), state_filter_us=tuple(sf),
        ignore_region_granularity=_bool(raw, "ignore_region_granularity", False, source), source=source, raw=dict(raw))
    for universe in universes:
        for rt, lv in cfg.tabulated(universe):
            if (rt, lv) not in thresholds:
                raise InputError(f'thresholds_p has no key "({rt}, {lv})" for a tabulated level', file=source,
                                 column="thresholds_p")
    return cfg


def _parse_thresholds(value: Any, source: str) -> dict[tuple[str, int], tuple[Fraction, Fraction, Fraction]]:
    if not isinstance(value, Mapping):
        raise InputError("thresholds_p must be an object", file=source, column="thresholds_p")
    out: dict[tuple[str, int], tuple[Fraction, Fraction, Fraction]] = {}
    for key, triple in value.items():
        m = _THRESHOLD_KEY.match(str(key))
        if m is None or m.group(1) not in ALL_REGION_TYPES or int(m.group(2)) not in ITERATION_LEVELS:
            raise InputError(f"thresholds_p key {key!r} is not (REGION_TYPE, LEVEL)", file=source,
                             column="thresholds_p")
        if not isinstance(triple, list) or len(triple) != 3:
            raise InputError(f"thresholds_p[{key!r}] must be three numbers", file=source,
                             column="thresholds_p")
        t = tuple(_fraction(x, f"thresholds_p[{key}]", source) for x in triple)
        if not t[0] < t[1] < t[2]:
            raise InputError(f"thresholds_p[{key!r}] must be strictly increasing", file=source,
                             column="thresholds_p")
        out[(m.group(1), int(m.group(2)))] = (t[0], t[1], t[2])
    return out


def load_config(parameters_dir: str | Path) -> SafeTabPConfig:
    """Read and validate ``PARAMETERS_DIR/config.json`` (or a config file path given directly); decimals
    exact, via ``accounting.load_json_exact``."""
    path = Path(parameters_dir)
    if not path.is_file():
        path = path / CONFIG_FILE
    if not path.is_file():
        raise InputError("config file not found", file=str(path))
    try:
        raw = accounting.load_json_exact(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", file=str(path)) from exc
    if not isinstance(raw, Mapping):
        raise InputError("config must be a JSON object", file=str(path))
    return parse_config(raw, source=str(path))
