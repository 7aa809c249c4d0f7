"""Building blocks of the code-defined expectation suites (versioned with :data:`dasflow.validation.gx.SUITE_VERSION`).

Each input file has a *domain* suite, validated on its distinct-value frame (:mod:`dasflow.validation.domain`): phase 1
(exact column set and order, dtypes) and phase 2 (domains and formats). The suites themselves belong to the
products (``dasflow.products.<p>.checks``, following each product's input spec) and are built from the helpers
here; cross-file rules (phase 3) of every product are validated on a facts frame by :data:`FACTS_SUITE`.
"""

from __future__ import annotations

from collections.abc import Sequence

from dasflow.validation.gx import Check

#: FIPS state codes of the 50 states, DC and PR (integers)
US_AND_PR = sorted({1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                    28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 44, 45, 46, 47, 48, 49, 50,
                    51, 53, 54, 55, 56, 72})
#: FIPS state codes as 2-digit strings (50 states, DC, PR)
STATE_FIPS = [f"{s:02d}" for s in US_AND_PR]


def cols(names: list[str], dtype: str | None = None) -> list[Check]:
    """Exact column list (order included), no nulls in any column, and optionally one dtype for all."""
    checks = [Check("ExpectTableColumnsToMatchOrderedList", {"column_list": names})]
    checks += [Check("ExpectColumnValuesToNotBeNull", {"column": c}) for c in names]
    if dtype is not None:
        checks += [Check("ExpectColumnValuesToBeOfType", {"column": c, "type_": dtype}) for c in names]
    return checks


def between(col: str, lo: int, hi: int) -> Check:
    """Every value of ``col`` in [lo, hi]."""
    return Check("ExpectColumnValuesToBeBetween", {"column": col, "min_value": lo, "max_value": hi})


def in_set(col: str, values: Sequence[object]) -> Check:
    """Every value of ``col`` one of ``values``."""
    return Check("ExpectColumnValuesToBeInSet", {"column": col, "value_set": list(values)})


def regex(col: str, pattern: str) -> Check:
    """Every value of ``col`` matches ``pattern`` in full."""
    return Check("ExpectColumnValuesToMatchRegex", {"column": col, "regex": f"^(?:{pattern})$"})


#: phase 3 and row-level rules: every rule's violation count must be 0
FACTS_SUITE: list[Check] = [
    Check("ExpectTableColumnsToMatchOrderedList",
          {"column_list": ["rule", "file", "column", "violations", "first_row"]}),
    Check("ExpectColumnValuesToBeBetween", {"column": "violations", "min_value": 0, "max_value": 0}),
]
