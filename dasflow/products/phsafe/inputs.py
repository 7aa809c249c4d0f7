"""Reading and validating the PHSafe input files (``persons.csv``, ``units.csv``, ``geo.csv``; phsafe.md
§1.5, §3).

Files have a header row and are comma- or pipe-delimited (detected from the header). Every value is read as
text and checked against the production schema with vectorised regular expressions (pyarrow compute); the
first failing row is reported as ``InputError(file=, row=, column=)`` with ``row`` 1-based and the header
as row 1.

* Phase 1 — schema: the exact column names in the exact order.
* Phase 2 — domains and formats of every value (this is also what makes the integer conversion safe, so it
  always runs before anything is tabulated).
* Phase 3 — cross-file checks (:func:`check_cross_file`): unique MAFIDs in units and geo, every person
MAFID in
  units, geo MAFIDs == unit MAFIDs, every TABBLKST in ``state_filter``, and occupied housing units carry a
  householder race/ethnicity and a tenure. Run by ``validate`` mode and ``--validate``; without it, records
  outside ``state_filter`` and orphans are dropped by the joins, as the reference does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from dasflow.errors import InputError

#: column -> anchored regular expression of its valid text values (phsafe.md §1.5).
_REL = "2[0-9]|3[0-8]"
SCHEMAS: dict[str, dict[str, str]] = {
    "persons": {
        "RTYPE": "[35]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "QAGE": "[0-9]|[1-9][0-9]|10[0-9]|11[0-5]",
        "CENHISP": "[12]",
        "CENRACE": "0[1-9]|[1-5][0-9]|6[0-3]",
        "RELSHIP": _REL,
    },
    "units": {
        "RTYPE": "[24]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "FINAL_POP": "[0-9]{1,5}",
        "NPF": "0|[2-9]|[1-8][0-9]|9[0-7]",
        "HHSPAN": "[012]",
        "HHRACE": "0[0-9]|[1-5][0-9]|6[0-3]",
        "TEN": "[0-4]",
        "HHT": "[0-7]",
        "HHT2": "0[0-9]|1[0-2]",
        "CPLT": "[0-5]",
    },
    "geo": {
        "RTYPE": "[2345]",
        "MAFID": "[1-8][0-9]{8}|900000000",
        "TABBLKST": "[0-9]{2}",
        "TABBLKCOU": "[0-9]{3}",
        "TABTRACTCE": "[0-9]{6}",
        "TABBLK": "[0-9]{4}",
        "TABBLKGRPCE": "[0-9]",
        "REGIONCE": "[0-9]",
        "DIVISIONCE": "[0-9]",
        "PLACEFP": "[0-9]{5}",
        "AIANNHCE": "[0-9]{4}",
    },
}
#: Columns converted to integers after validation (the others stay text or are not needed).
INT_COLUMNS: dict[str, tuple[str, ...]] = {
    "persons": ("RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"),
    "units": ("RTYPE", "MAFID", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"),
    "geo": ("RTYPE", "MAFID", "TABBLKST"),
}


@dataclass(frozen=True)
class Inputs:
    """Validated inputs as integer numpy columns (one dict per file)."""

    persons: Mapping[str, np.ndarray]
    units: Mapping[str, np.ndarray]
    geo: Mapping[str, np.ndarray]
    files: Mapping[str, str]


def _delimiter(path: Path) -> str:
    with path.open("r", encoding="utf-8", newline="") as fh:
        header = fh.readline()
    if "|" in header:
        return "|"
    return ","


def read_table(path: Path, name: str) -> dict[str, np.ndarray]:
    """Read one input file, run phases 1–2 on it, and return its integer columns."""
    if not path.exists():
        raise InputError(f"missing input file {path.name}", file=str(path))
    schema = SCHEMAS[name]
    delim = _delimiter(path)
    try:
        with path.open("rb") as fh:
            header = fh.readline().decode("utf-8").rstrip("\r\n").split(delim)
    except UnicodeDecodeError as exc:
        raise InputError("not UTF-8 text", file=str(path), row=1) from exc
    header = [h.strip() for h in header]
    expected = list(schema)
    if header != expected:
        for i, (got, want) in enumerate(zip(header, expected, strict=False)):
            if got != want:
                raise InputError(f"column {i + 1} is {got!r}, expected {want!r} (columns must be "
                                 f"{'|'.join(expected)} in this order)", file=str(path), row=1, column=want)
        raise InputError(f"expected {len(expected)} columns {'|'.join(expected)}, got {len(header)}",
                         file=str(path), row=1)
    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(column_names=expected, skip_rows=1, block_size=1 << 26),
            parse_options=pacsv.ParseOptions(delimiter=delim),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in expected},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False),
        )
    except (pa.ArrowInvalid, UnicodeDecodeError) as exc:
        raise InputError(f"malformed file: {exc}", file=str(path)) from exc
    out: dict[str, np.ndarray] = {}
    for col, pattern in schema.items():
        arr = table.column(col)
        ok = pc.match_substring_regex(arr, f"^(?:{pattern})$")
        ok = pc.fill_null(ok, False)
        if not pc.all(ok).as_py():
            bad = int(np.flatnonzero(~ok.to_numpy(zero_copy_only=False))[0])
            value = arr[bad].as_py()
            raise InputError(f"invalid value {value!r} (expected /{pattern}/)", file=str(path), row=bad + 2,
                             column=col)
        if col in INT_COLUMNS[name]:
            dtype = np.int64 if col == "MAFID" else np.int16
            out[col] = pc.cast(arr, pa.int64()).to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return out


def read_inputs(data_path: str | Path) -> Inputs:
    """Read ``persons.csv``, ``units.csv`` and ``geo.csv`` from ``data_path`` (phases 1–2)."""
    root = Path(data_path)
    if not root.is_dir():
        raise InputError("DATA_PATH is not a directory", file=str(root))
    files = {n: str(root / f"{n}.csv") for n in ("persons", "units", "geo")}
    tables = {n: read_table(Path(p), n) for n, p in files.items()}
    return Inputs(persons=tables["persons"], units=tables["units"], geo=tables["geo"], files=files)


def _first_dup(values: np.ndarray) -> int | None:
    """Index of the first row whose value also occurs earlier, or None."""
    if values.size == 0:
        return None
    order = np.argsort(values, kind="stable")
    s = values[order]
    dup = np.flatnonzero(s[1:] == s[:-1])
    if dup.size == 0:
        return None
    return int(order[dup + 1].min())


def check_cross_file(inputs: Inputs, state_filter: tuple[str, ...]) -> None:
    """Phase 3: cross-file consistency; raises InputError naming the file, row and column."""
    p, u, g, f = inputs.persons, inputs.units, inputs.geo, inputs.files
    i = _first_dup(u["MAFID"])
    if i is not None:
        raise InputError(f"duplicate MAFID {int(u['MAFID'][i])}", file=f["units"], row=i + 2, column="MAFID")
    i = _first_dup(g["MAFID"])
    if i is not None:
        raise InputError(f"duplicate MAFID {int(g['MAFID'][i])}", file=f["geo"], row=i + 2, column="MAFID")
    missing = ~np.isin(p["MAFID"], u["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError(f"person MAFID {int(p['MAFID'][i])} is not in units", file=f["persons"], row=i + 2,
                         column="MAFID")
    missing = ~np.isin(u["MAFID"], g["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError(f"unit MAFID {int(u['MAFID'][i])} is not in geo", file=f["units"], row=i + 2,
                         column="MAFID")
    missing = ~np.isin(g["MAFID"], u["MAFID"])
    if missing.any():
        i = int(np.flatnonzero(missing)[0])
        raise InputError(f"geo MAFID {int(g['MAFID'][i])} is not in units", file=f["geo"], row=i + 2,
                         column="MAFID")
    allowed = np.array(sorted(int(s) for s in state_filter), dtype=np.int16)
    outside = ~np.isin(g["TABBLKST"], allowed)
    if outside.any():
        i = int(np.flatnonzero(outside)[0])
        raise InputError(f"TABBLKST {int(g['TABBLKST'][i]):02d} is not in state_filter", file=f["geo"],
                         row=i + 2, column="TABBLKST")
    occupied = (u["RTYPE"] == 2) & (u["HHT"] != 0)
    for col in ("HHRACE", "HHSPAN", "TEN", "HHT2"):
        bad = occupied & (u[col] == 0)
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise InputError(f"{col} is NIU (0) for an occupied housing unit", file=f["units"], row=i + 2,
                             column=col)
    gq_person = (p["RTYPE"] == 5) != np.isin(p["RELSHIP"], (37, 38))
    if gq_person.any():
        i = int(np.flatnonzero(gq_person)[0])
        raise InputError("RTYPE and RELSHIP disagree (GQ persons are RTYPE 5 with RELSHIP 37/38)",
                         file=f["persons"], row=i + 2, column="RELSHIP")
