"""The code-defined expectation suites of every input (versioned with :data:`validation.gx.SUITE_VERSION`).

Each input file has a *domain* suite, validated on its distinct-value frame (:mod:`validation.domain`): phase 1
(exact column set and order, dtypes) and phase 2 (domains and formats). Cross-file rules (phase 3) are
validated on a facts frame by :data:`FACTS_SUITE`. The domains follow the specs: PHSafe phsafe.md §1.5 (the
regular expressions of ``dasflow.products.phsafe.inputs.SCHEMAS``, here as integer sets after the reader's
conversion), SafeTab-P safetab-p.md (person records, GRF-C, the four iteration files), group sizes (occupied
housing units: STATE, COUNTY, SIZE ≥ 1).
"""

from __future__ import annotations

from collections.abc import Sequence

from validation.gx import Check

_US_AND_PR = sorted({1, 2, 4, 5, 6, 8, 9, 10, 11, 12, 13, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                     28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 44, 45, 46, 47, 48, 49, 50,
                     51, 53, 54, 55, 56, 72})
#: FIPS state codes as 2-digit strings (50 states, DC, PR)
STATE_FIPS = [f"{s:02d}" for s in _US_AND_PR]


def _cols(names: list[str], dtype: str | None = None) -> list[Check]:
    checks = [Check("ExpectTableColumnsToMatchOrderedList", {"column_list": names})]
    checks += [Check("ExpectColumnValuesToNotBeNull", {"column": c}) for c in names]
    if dtype is not None:
        checks += [Check("ExpectColumnValuesToBeOfType", {"column": c, "type_": dtype}) for c in names]
    return checks


def _between(col: str, lo: int, hi: int) -> Check:
    return Check("ExpectColumnValuesToBeBetween", {"column": col, "min_value": lo, "max_value": hi})


def _in(col: str, values: Sequence[object]) -> Check:
    return Check("ExpectColumnValuesToBeInSet", {"column": col, "value_set": list(values)})


def _re(col: str, pattern: str) -> Check:
    return Check("ExpectColumnValuesToMatchRegex", {"column": col, "regex": f"^(?:{pattern})$"})


_MAFID = _between("MAFID", 100_000_000, 900_000_000)

#: PHSafe, after ``read_table`` (integer columns of each file; phsafe.md §1.5)
PHSAFE: dict[str, list[Check]] = {
    "persons": [*_cols(["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]),
                _in("RTYPE", [3, 5]), _MAFID, _between("QAGE", 0, 115), _in("CENHISP", [1, 2]),
                _between("CENRACE", 1, 63), _between("RELSHIP", 20, 38)],
    "units": [*_cols(["RTYPE", "MAFID", "FINAL_POP", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"]),
              _in("RTYPE", [2, 4]), _MAFID, _in("HHSPAN", [0, 1, 2]), _between("HHRACE", 0, 63),
              _between("TEN", 0, 4), _between("HHT", 0, 7), _between("HHT2", 0, 12), _between("CPLT", 0, 5),
              _between("FINAL_POP", 0, 99_999)],
    "geo": [*_cols(["RTYPE", "MAFID", "TABBLKST"]), _in("RTYPE", [2, 3, 4, 5]), _MAFID,
            _in("TABBLKST", _US_AND_PR)],
}

_CODE_OR_NULL = r"[0-9]{4}|Null"
#: SafeTab-P person records as read (text columns; safetab-p.md input spec). Code-list membership of QRACEn and
#: QSPAN (against the run's ``race-and-ethnicity-codes.txt``, ~1,800 codes) is a vectorised fact rule instead:
#: GX's in-set expectation with a value set that large costs seconds per column.
SAFETAB_PERSONS: list[Check] = [
    *_cols(["QAGE", "QSEX", "HOUSEHOLDER", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "CENRACE",
            *[f"QRACE{i}" for i in range(1, 9)], "QSPAN"]),
    _re("QAGE", r"0{0,2}[0-9]|0?[1-9][0-9]|10[0-9]|11[0-5]"), _in("QSEX", ["1", "2"]),
    _in("HOUSEHOLDER", ["True", "False"]),
    _in("TABBLKST", STATE_FIPS), _re("TABBLKCOU", "[0-9]{3}"), _re("TABTRACTCE", "[0-9]{6}"),
    _re("TABBLK", "[0-9]{4}"), _re("CENRACE", "0[1-9]|[1-5][0-9]|6[0-3]"),
    _re("QRACE1", "[0-9]{4}"), *[_re(f"QRACE{i}", _CODE_OR_NULL) for i in range(2, 9)], _re("QSPAN", "[0-9]{4}"),
]


#: GRF-C columns SafeTab-P uses (the production file carries more; extra columns are allowed)
GRFC: list[Check] = [
    Check("ExpectTableColumnsToMatchSet", {"column_set": ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK",
                                                          "PLACEFP", "AIANNHCE"], "exact_match": True}),
    _in("TABBLKST", STATE_FIPS), _re("TABBLKCOU", "[0-9]{3}"), _re("TABTRACTCE", "[0-9]{6}"),
    _re("TABBLK", "[0-9]{4}"), _re("PLACEFP", "[0-9]{5}"), _re("AIANNHCE", "[0-9]{4}"),
]

_BOOL = ["True", "False"]
#: the four public iteration files (exact headers, formats)
ITERATION_FILES: dict[str, list[Check]] = {
    "race-and-ethnicity-codes.txt": [*_cols(["RACE_ETH_CODE", "RACE_ETH_NAME"]), _re("RACE_ETH_CODE", "[0-9]{4}")],
    "race-characteristic-iterations.txt": [
        *_cols(["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "ALONE", "DETAILED_ONLY", "COARSE_ONLY"]),
        _re("ITERATION_CODE", "[0-9]+"), _in("LEVEL", ["0", "1", "2"]), _in("ALONE", _BOOL),
        _in("DETAILED_ONLY", [*_BOOL, "Null"]), _in("COARSE_ONLY", [*_BOOL, "Null"])],
    "ethnicity-characteristic-iterations.txt": [
        *_cols(["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "DETAILED_ONLY", "COARSE_ONLY"]),
        _re("ITERATION_CODE", "[0-9]+"), _in("LEVEL", ["0", "1", "2"]),
        _in("DETAILED_ONLY", [*_BOOL, "Null"]), _in("COARSE_ONLY", [*_BOOL, "Null"])],
    "race-and-ethnicity-code-to-iteration.txt": [
        *_cols(["ITERATION_CODE", "RACE_ETH_CODE"]), _re("ITERATION_CODE", "[0-9]+"),
        _re("RACE_ETH_CODE", "[0-9]{4}")],
}

#: group sizes: occupied housing units as the adapter builds them (STATE, COUNTY text; SIZE integer ≥ 1)
GROUPSIZE_HOUSEHOLDS: list[Check] = [
    *_cols(["STATE", "COUNTY", "SIZE"]), _in("STATE", STATE_FIPS), _re("COUNTY", "[0-9]{3}"),
    Check("ExpectColumnValuesToBeBetween", {"column": "SIZE", "min_value": 1}),
]

#: phase 3 and row-level rules: every rule's violation count must be 0
FACTS_SUITE: list[Check] = [
    Check("ExpectTableColumnsToMatchOrderedList",
          {"column_list": ["rule", "file", "column", "violations", "first_row"]}),
    Check("ExpectColumnValuesToBeBetween", {"column": "violations", "min_value": 0, "max_value": 0}),
]
