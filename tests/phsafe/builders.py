"""Hand-built PHSafe fixtures: households as plain tuples, turned into integer columns or production CSV
files."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(__file__).parent / "data"
US_CONFIG = DATA / "us_config.json"
PR_CONFIG = DATA / "pr_config.json"

PERSON_COLS = ["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]
UNIT_COLS = ["RTYPE", "MAFID", "FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"]
GEO_COLS = ["RTYPE", "MAFID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "TABBLKGRPCE", "REGIONCE",
            "DIVISIONCE", "PLACEFP", "AIANNHCE"]


@dataclass
class Person:
    age: int
    race: int = 1
    hisp: int = 1
    rel: int = 20
    rtype: int = 3


@dataclass
class Unit:
    """An occupied housing unit by default; ``persons`` are its members."""

    persons: list[Person] = field(default_factory=list)
    state: str = "01"
    ten: int = 1
    hht: int = 1
    hht2: int = 1
    cplt: int = 1
    hhrace: int | None = None
    hhspan: int | None = None
    rtype: int = 2


def columns(units: Sequence[Unit], first_mafid: int = 100000001,
            mafids: Sequence[int] | None = None) -> tuple[dict[str, np.ndarray], ...]:
    """persons, units, geo as dicts of integer columns (the householder's race defaults to the first
    person's).

    MAFIDs are ``first_mafid + position`` unless given explicitly in ``mafids``.
    """
    p: dict[str, list[int]] = {c: [] for c in PERSON_COLS}
    u: dict[str, list[int]] = {c: [] for c in UNIT_COLS}
    g: dict[str, list[int]] = {c: [] for c in ("RTYPE", "MAFID", "TABBLKST")}
    for i, unit in enumerate(units):
        mafid = first_mafid + i if mafids is None else mafids[i]
        for per in unit.persons:
            rec = (per.rtype, mafid, per.age, per.hisp, per.race, per.rel)
            for c, v in zip(PERSON_COLS, rec, strict=True):
                p[c].append(v)
        head = unit.persons[0] if unit.persons else Person(0)
        occupied = unit.rtype == 2 and unit.hht != 0
        hhrace = unit.hhrace if unit.hhrace is not None else (head.race if occupied else 0)
        hhspan = unit.hhspan if unit.hhspan is not None else (head.hisp if occupied else 0)
        vals = (unit.rtype, mafid, len(unit.persons), 0, hhspan, hhrace, unit.ten, unit.hht, unit.hht2,
                unit.cplt)
        for c, v in zip(UNIT_COLS, vals, strict=True):
            u[c].append(v)
        g["RTYPE"].append(unit.rtype)
        g["MAFID"].append(mafid)
        g["TABBLKST"].append(int(unit.state))
    to = {"MAFID": np.int64}
    return tuple({c: np.array(v, dtype=to.get(c, np.int16)) for c, v in d.items()} for d in (p, u, g))


def write_csv(units: Sequence[Unit], root: Path, delimiter: str = "|") -> Path:
    """Write persons.csv, units.csv, geo.csv in the production layout."""
    root.mkdir(parents=True, exist_ok=True)
    p, u, g = columns(units)
    widths = {"CENRACE": 2, "RELSHIP": 2, "HHRACE": 2, "HHT2": 2, "TABBLKST": 2}

    def fmt(c: str, v: int) -> str:
        return f"{int(v):0{widths[c]}d}" if c in widths else str(int(v))

    with (root / "persons.csv").open("w") as fh:
        fh.write(delimiter.join(PERSON_COLS) + "\n")
        for row in zip(*(p[c] for c in PERSON_COLS), strict=True):
            fh.write(delimiter.join(fmt(c, v) for c, v in zip(PERSON_COLS, row, strict=True)) + "\n")
    with (root / "units.csv").open("w") as fh:
        fh.write(delimiter.join(UNIT_COLS) + "\n")
        for row in zip(*(u[c] for c in UNIT_COLS), strict=True):
            fh.write(delimiter.join(fmt(c, v) for c, v in zip(UNIT_COLS, row, strict=True)) + "\n")
    with (root / "geo.csv").open("w") as fh:
        fh.write(delimiter.join(GEO_COLS) + "\n")
        for rt, m, st in zip(g["RTYPE"], g["MAFID"], g["TABBLKST"], strict=True):
            fh.write(delimiter.join([str(rt), str(m), f"{st:02d}", "001", "000100", "1001", "1", "3", "6",
                                     "99999", "9999"]) + "\n")
    return root


def raw_config(path: Path = US_CONFIG) -> dict[str, Any]:
    """The production config as plain JSON values (floats), for mutation in tests."""
    return dict(json.loads(path.read_text()))


def config_with(budget: Any = None, states: list[str] | None = None, tau: dict[str, int] | None = None,
                defn: str = "zcdp", base: Path = US_CONFIG) -> dict[str, Any]:
    """A copy of the US config with every budget replaced by ``budget`` (if given) and other overrides."""
    raw = copy.deepcopy(raw_config(base))
    if budget is not None:
        for levels in raw["privacy_budget"].values():
            for k in levels:
                levels[k] = budget
    if states is not None:
        raw["state_filter"] = states
    if tau is not None:
        raw["tau"] = tau
    raw["privacy_defn"] = defn
    return raw
