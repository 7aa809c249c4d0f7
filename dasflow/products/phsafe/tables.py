"""The public domain of PHSafe: tables, basis cells, population-group levels and iterations (phsafe.md §1–§2).

Everything here is public and fixed before any data is read: the output domain of every measurement comes from
these constants and the config's ``state_filter`` only (R4), never from the confidential records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TableKind = Literal["join", "unit"]

#: The level keys of the production config: geography level x iteration level (phsafe.md §1.3).
GEO_LEVELS: tuple[str, ...] = ("usa", "state")
ITERATION_LEVELS: tuple[str, ...] = ("*", "A-G", "H,I")
LEVEL_KEYS: tuple[str, ...] = tuple(f"{g}_{i}" for g in GEO_LEVELS for i in ITERATION_LEVELS)
UNATTRIBUTED_KEYS: tuple[str, ...] = ("usa_*", "state_*")

#: Iteration codes of each iteration level, in output order.
ITERATIONS: dict[str, tuple[str, ...]] = {
    "*": ("*",),
    "A-G": ("A", "B", "C", "D", "E", "F", "G"),
    "H,I": ("H", "I"),
}


@dataclass(frozen=True)
class TableDef:
    """One measured table: its kind (Algorithm 1 join table or Algorithm 2 unit table), basis and levels.

    ``by_person`` says whether the iteration comes from the person's race/ethnicity (PH3 only) rather than the
    householder's (phsafe.md §2, R5).
    """

    name: str
    kind: TableKind
    cells: tuple[int, ...]
    level_keys: tuple[str, ...]
    by_person: bool = False

    @property
    def iterated(self) -> bool:
        return self.level_keys != UNATTRIBUTED_KEYS


#: The 9 measured runs (phsafe.md §2), in the order the Census lists them.
MEASURED: dict[str, TableDef] = {
    t.name: t
    for t in (
        TableDef("PH1_num", "join", (2, 3), LEVEL_KEYS),
        TableDef("PH1_denom", "unit", (1,), LEVEL_KEYS),
        TableDef("PH2", "join", (3, 4, 6, 7, 9, 10, 12, 13), UNATTRIBUTED_KEYS),
        TableDef("PH3", "join", (2, 4, 5, 6, 7, 9, 10), LEVEL_KEYS, by_person=True),
        TableDef("PH4", "join", (2, 3), LEVEL_KEYS),
        TableDef("PH5_denom", "unit", (1,), LEVEL_KEYS),
        TableDef("PH6", "join", (3, 4, 5, 6, 8, 9, 10, 11, 13, 14, 15, 16, 18, 19, 20, 21),
                 UNATTRIBUTED_KEYS),
        TableDef("PH7", "join", (2, 3, 4), LEVEL_KEYS),
        TableDef("PH8_denom", "unit", (2, 3), LEVEL_KEYS),
    )
}

JOIN_TABLES: tuple[str, ...] = tuple(n for n, t in MEASURED.items() if t.kind == "join")
UNIT_TABLES: tuple[str, ...] = tuple(n for n, t in MEASURED.items() if t.kind == "unit")

#: Derived (post-processed, zero-budget) tables: name -> (source table, {derived cell: source cells}).
DERIVED: dict[str, tuple[str, dict[int, tuple[int, ...]]]] = {
    "PH5_num": ("PH4", {2: (2,), 3: (3,)}),
    "PH8_num": ("PH7", {2: (2, 3), 3: (4,)}),
}

#: All output tables in file order.
OUTPUT_TABLES: tuple[str, ...] = (
    "PH1_num", "PH1_denom", "PH2", "PH3", "PH4", "PH5_num", "PH5_denom", "PH6", "PH7", "PH8_num", "PH8_denom",
)

#: Valid state FIPS codes for ``state_filter``: 01–56 minus the unused {03, 07, 14, 43, 52}; PR is 72 alone.
US_STATE_CODES: frozenset[str] = frozenset(
    f"{i:02d}" for i in range(1, 57) if i not in (3, 7, 14, 43, 52)
)
PR_CODE = "72"


def level_parts(level_key: str) -> tuple[str, str]:
    """Split ``"state_A-G"`` into ``("state", "A-G")``."""
    geo, _, it = level_key.partition("_")
    return geo, it


def regions(geo_level: str, state_filter: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The public regions (REGION_ID, REGION_TYPE) of a geography level, from the config only.

    Decision: the state domain is the config's ``state_filter`` (sorted), so a state with no records still gets
    its rows (zero counts plus noise) and the row count never depends on the data.
    """
    if geo_level == "usa":
        return (("1", "USA"),)
    return tuple((s, "STATE") for s in sorted(state_filter))


def data_cell_column(table: str) -> str:
    """The output column of the basis cell, e.g. ``PH1_NUM_DATA_CELL``."""
    return f"{table.upper()}_DATA_CELL"
