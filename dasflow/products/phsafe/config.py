"""The PHSafe production config (``config.json`` of the Census release), loaded as-is and validated (R1, R2).

Shape::

    {"privacy_budget": {"PH1_num": {"usa_*": 0.002619, "usa_A-G": ..., "usa_H,I": ..., "state_*": ...,
                                    "state_A-G": ..., "state_H,I": ...}, ..., "PH2": {"usa_*": ...,
                                    "state_*": ...}},
     "tau": {"PH1_num": 10, "PH2": 10, "PH3": 6, "PH4": 10, "PH6": 6, "PH7": 10},
     "state_filter": ["01", ...], "reader": "csv" | "cef", "privacy_defn": "zcdp" | "puredp"}

Budgets are ρ (zcdp) or ε (puredp) per (table, level); they are parsed exactly (decimal text -> Fraction) by the
privacy core; ``Infinity`` means an infinite budget (no noise, VARIANCE 0); 0 means the level is not tabulated.
US (state codes from 01–56) and PR (exactly ``["72"]``) are separate executions with separate plans and
ledgers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.products.base import PrivacyDefinition
from dasflow.products.phsafe.tables import JOIN_TABLES, MEASURED, PR_CODE, US_STATE_CODES

REQUIRED_KEYS: tuple[str, ...] = ("privacy_budget", "tau", "state_filter", "reader", "privacy_defn")
READERS: tuple[str, ...] = ("csv", "cef")


@dataclass(frozen=True)
class PHSafeConfig:
    """A validated PHSafe config. ``budgets[table][level]`` is a Fraction, or None for an infinite budget."""

    budgets: Mapping[str, Mapping[str, Fraction | None]]
    tau: Mapping[str, int]
    state_filter: tuple[str, ...]
    reader: str
    privacy_defn: PrivacyDefinition

    @property
    def universe(self) -> str:
        """``"PR"`` for a Puerto Rico execution, ``"US"`` otherwise."""
        return "PR" if self.state_filter == (PR_CODE,) else "US"

    def tabulated(self, table: str, level: str) -> bool:
        """R2: a level with budget 0 is not tabulated (None = infinite budget is tabulated)."""
        b = self.budgets[table][level]
        return b is None or b > 0


def _fail(message: str, file: str | None, column: str | None = None) -> InputError:
    return InputError(message, file=file, column=column)


def parse_config(raw: Mapping[str, Any], file: str | None = None) -> PHSafeConfig:
    """Validate a decoded config (R1). Raises InputError naming the offending key; no defaults are filled
    in."""
    if not isinstance(raw, Mapping):
        raise _fail("config must be a JSON object", file)
    missing = [k for k in REQUIRED_KEYS if k not in raw]
    if missing:
        raise _fail(f"missing required key(s): {', '.join(missing)}", file)
    extra = sorted(set(raw) - set(REQUIRED_KEYS))
    if extra:
        raise _fail(f"unknown key(s): {', '.join(extra)}", file)

    pb = raw["privacy_budget"]
    if not isinstance(pb, Mapping):
        raise _fail("privacy_budget must be an object", file, "privacy_budget")
    unknown_tables = sorted(set(pb) - set(MEASURED))
    if unknown_tables:
        raise _fail(f"unknown table(s) in privacy_budget: {', '.join(unknown_tables)}", file,
                    "privacy_budget")
    budgets: dict[str, dict[str, Fraction | None]] = {}
    for table, tdef in MEASURED.items():
        if table not in pb:
            raise _fail(f"missing table {table}", file, "privacy_budget")
        levels = pb[table]
        if not isinstance(levels, Mapping):
            raise _fail(f"privacy_budget.{table} must be an object", file, f"privacy_budget.{table}")
        for key in levels:
            if key not in tdef.level_keys:
                raise _fail(f"unknown budget key {key!r} for {table} (allowed: {', '.join(tdef.level_keys)})",
                            file, f"privacy_budget.{table}.{key}")
        parsed: dict[str, Fraction | None] = {}
        for key in tdef.level_keys:
            name = f"privacy_budget.{table}.{key}"
            if key not in levels:
                raise _fail(f"missing budget key {key!r}", file, name)
            value = levels[key]
            if isinstance(value, bool):
                raise _fail("budget must be a number", file, name)
            try:
                b = accounting.parse_budget(value, name)
            except (ValueError, TypeError, ArithmeticError) as exc:
                raise _fail(str(exc), file, name) from exc
            if b is not None and b < 0:
                raise _fail(f"budget must be >= 0, got {value}", file, name)
            parsed[key] = b
        budgets[table] = parsed

    tau_raw = raw["tau"]
    if not isinstance(tau_raw, Mapping):
        raise _fail("tau must be an object", file, "tau")
    if set(tau_raw) != set(JOIN_TABLES):
        raise _fail(f"tau keys must be exactly {', '.join(JOIN_TABLES)}; got {', '.join(sorted(tau_raw))}",
                    file, "tau")
    tau: dict[str, int] = {}
    for table in JOIN_TABLES:
        v = tau_raw[table]
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise _fail(f"tau must be an integer > 0, got {v!r}", file, f"tau.{table}")
        tau[table] = int(v)

    sf = raw["state_filter"]
    if not isinstance(sf, list) or not sf or not all(isinstance(s, str) for s in sf):
        raise _fail("state_filter must be a non-empty list of 2-digit FIPS strings", file, "state_filter")
    if len(set(sf)) != len(sf):
        raise _fail("state_filter has duplicates", file, "state_filter")
    if PR_CODE in sf:
        if sf != [PR_CODE]:
            raise _fail("state_filter: Puerto Rico (72) must be alone (US and PR are separate runs)", file,
                        "state_filter")
    else:
        bad = [s for s in sf if s not in US_STATE_CODES]
        if bad:
            raise _fail(f"state_filter has invalid FIPS code(s): {', '.join(bad)}", file, "state_filter")
    if sf == [PR_CODE]:
        for table, levels_b in budgets.items():
            for key, b in levels_b.items():
                if key.startswith("usa_") and b != 0:
                    raise _fail("Puerto Rico has no Nation level: usa_* budgets must be 0", file,
                                f"privacy_budget.{table}.{key}")

    reader = raw["reader"]
    if reader not in READERS:
        raise _fail(f"reader must be one of {', '.join(READERS)}, got {reader!r}", file, "reader")
    defn = raw["privacy_defn"]
    if defn not in ("zcdp", "puredp"):
        raise _fail(f"privacy_defn must be zcdp or puredp, got {defn!r}", file, "privacy_defn")
    return PHSafeConfig(budgets=budgets, tau=tau, state_filter=tuple(sf), reader=str(reader),
                        privacy_defn=defn)


def load_config(path: str | Path) -> PHSafeConfig:
    """Read and validate a production ``config.json`` (decimals kept exact, ``Infinity`` allowed)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read config: {exc}", file=str(p)) from exc
    try:
        raw = accounting.load_json_exact(text)
    except ValueError as exc:
        raise InputError(f"config is not valid JSON: {exc}", file=str(p)) from exc
    return parse_config(raw, file=str(p))
