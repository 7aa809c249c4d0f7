"""PHSafe's validation: the GX domain suites of its three input files (phsafe.md §1.5), the vectorised
cross-file facts, the phase-0 file pre-checks, and the release-file rules (headers, the R16 output validator).

Fail-closed argument: everything here runs in the validate stage (inputs) or the release stage (outputs) and
draws no noise; an input failure stops the release before preprocessing, so nothing is measured for data that
failed. The summary holds counts only (rows per file, persons per state), never a confidential value.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dasflow.errors import DasflowError, InputError
from dasflow.io.files import input_prefix, local_file
from dasflow.io.store import ObjectStore
from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.inputs import SCHEMAS, Inputs, check_cross_file
from dasflow.products.phsafe.outputs import columns, validate_output
from dasflow.products.phsafe.tables import OUTPUT_TABLES
from dasflow.products.plugin import InputChecks
from dasflow.validation.gx import Check
from dasflow.validation.preflight import check_delimited
from dasflow.validation.products import InputSuite, fact, first_dup_mask, not_in, per_state
from dasflow.validation.suites import US_AND_PR, between, cols, in_set

_MAFID = between("MAFID", 100_000_000, 900_000_000)

#: PHSafe, after ``read_table`` (integer columns of each file; phsafe.md §1.5)
SUITES: dict[str, list[Check]] = {
    "persons": [*cols(["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]),
                in_set("RTYPE", [3, 5]), _MAFID, between("QAGE", 0, 115), in_set("CENHISP", [1, 2]),
                between("CENRACE", 1, 63), between("RELSHIP", 20, 38)],
    "units": [*cols(["RTYPE", "MAFID", "FINAL_POP", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"]),
              in_set("RTYPE", [2, 4]), _MAFID, in_set("HHSPAN", [0, 1, 2]), between("HHRACE", 0, 63),
              between("TEN", 0, 4), between("HHT", 0, 7), between("HHT2", 0, 12), between("CPLT", 0, 5),
              between("FINAL_POP", 0, 99_999)],
    "geo": [*cols(["RTYPE", "MAFID", "TABBLKST"]), in_set("RTYPE", [2, 3, 4, 5]), _MAFID,
            in_set("TABBLKST", US_AND_PR)],
}

FILES = {"persons": "persons.csv", "units": "units.csv", "geo": "geo.csv"}


def state_folders(store: ObjectStore, prefix: str) -> list[str] | None:
    """The state folders of a confidential input partitioned by state (``{prefix}{SS}/persons.csv`` and
    ``units.csv``, as the synthetic census's ``phsafe_states`` format writes them), sorted; None when the
    input is one ``persons.csv`` / ``units.csv`` pair (or has neither). ``InputError`` on a mix of the two
    layouts or a folder missing one of its files."""
    rel = [k[len(prefix):] for k in store.list(prefix)]
    files = {"persons.csv", "units.csv"}
    nested = {tuple(r.split("/")) for r in rel if r.count("/") == 1 and r.split("/")[1] in files}
    if not nested:
        return None
    if files & set(rel):
        raise InputError("both national persons.csv/units.csv and state folders: one layout only", file=prefix)
    folders = sorted({folder for folder, _ in nested})
    for folder in folders:
        for name in sorted(files):
            if (folder, name) not in nested:
                raise InputError(f"state folder {folder} has no {name}", file=f"{prefix}{folder}/{name}")
    return folders


def preflight(store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
    """Phase 0 on ``geo.csv`` (public) or ``persons.csv`` and ``units.csv`` (confidential; of every state folder
    when the input is partitioned by state): "|" or ","."""
    if public:
        key = input_prefix(inputs, "phsafe_geo", "public/phsafe/") + "geo.csv"
        check_delimited(local_file(store, key), list(SCHEMAS["geo"]), None)
    else:
        prefix = input_prefix(inputs, "phsafe", "confidential/phsafe/")
        folders = state_folders(store, prefix)
        for folder in [""] if folders is None else [f"{f}/" for f in folders]:
            for name in ("persons", "units"):
                check_delimited(local_file(store, f"{prefix}{folder}{name}.csv"), list(SCHEMAS[name]), None)


def input_checks(confidential: Mapping[str, Any], public: Mapping[str, Any], config: PHSafeConfig) -> InputChecks:
    """The three files' suites, the cross-file facts (a rule-for-rule replica of ``check_cross_file``), persons
    per state through their unit's geography (orphans under "??"), and ``check_cross_file`` as the own check."""
    p, u, g = confidential["persons"], confidential["units"], public["geo"]
    suites = [InputSuite(f"phsafe.{n}", FILES[n], c, SUITES[n]) for n, c in (("persons", p), ("units", u), ("geo", g))]
    allowed = np.array(sorted(int(s) for s in config.state_filter), dtype=np.int64)
    occupied = (u["RTYPE"] == 2) & (u["HHT"] != 0)
    facts = [
        fact("unique MAFID", FILES["units"], "MAFID", first_dup_mask(u["MAFID"])),
        fact("unique MAFID", FILES["geo"], "MAFID", first_dup_mask(g["MAFID"])),
        fact("person MAFID in units", FILES["persons"], "MAFID", not_in(p["MAFID"], u["MAFID"])),
        fact("unit MAFID in geo", FILES["units"], "MAFID", not_in(u["MAFID"], g["MAFID"])),
        fact("geo MAFID in units", FILES["geo"], "MAFID", not_in(g["MAFID"], u["MAFID"])),
        fact("TABBLKST in state_filter", FILES["geo"], "TABBLKST", not_in(g["TABBLKST"], allowed)),
        *[fact(f"{c} set for occupied units", FILES["units"], c, occupied & (u[c] == 0))
          for c in ("HHRACE", "HHSPAN", "TEN", "HHT2")],
        fact("GQ persons are RTYPE 5 with RELSHIP 37/38", FILES["persons"], "RELSHIP",
             (p["RTYPE"] == 5) != np.isin(p["RELSHIP"], (37, 38))),
    ]
    order = np.argsort(g["MAFID"], kind="stable")
    pos = np.searchsorted(g["MAFID"], p["MAFID"], sorter=order)
    pos = np.minimum(pos, max(len(order) - 1, 0))
    found = g["MAFID"][order[pos]] == p["MAFID"] if len(order) else np.zeros(len(p["MAFID"]), bool)
    state = np.where(found, g["TABBLKST"][order[pos]] if len(order) else 0, -1)
    summary = {"rows": {FILES[n]: len(c["MAFID"]) for n, c in (("persons", p), ("units", u), ("geo", g))},
               "universe": config.universe,
               "persons_per_state": per_state(state.astype(np.int64), fmt=lambda s: f"{s:02d}" if s >= 0 else "??")}

    def own() -> None:
        # The facts above replicate check_cross_file rule for rule (tested on the corpus), so its cost (numpy
        # isin/argsort over every MAFID, ~25 s CPU at 10 M persons) is paid only to word the error when a
        # fact has failed; its InputError is then the authoritative one.
        if any(int(str(f["violations"])) for f in facts):
            check_cross_file(Inputs(persons=p, units=u, geo=g, files=FILES), config.state_filter)

    return InputChecks(suites=suites, facts=facts, summary=summary, own=own)


def output_header(file: str) -> list[str] | None:
    """``PH1_num.csv`` …: the spec header; derived files in sub-folders (``estimates/`` with MOEs): None."""
    stem = Path(file).name.removesuffix(".csv")
    if "/" in file or stem not in OUTPUT_TABLES:
        return None
    return columns(stem)


def check_release_files(files: Mapping[str, bytes], config: PHSafeConfig) -> None:
    """R16 (``outputs.validate_output``) on the release files, written to a private temporary directory (the
    validator reads a directory); a failure names the file as ``phsafe/<file>``."""
    with tempfile.TemporaryDirectory(prefix="dasflow-phsafe-out-") as tmp:
        for name, data in files.items():
            path = Path(tmp, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        try:
            validate_output(tmp, config)
        except DasflowError as exc:
            raise DasflowError(str(exc).replace(tmp, "phsafe")) from None
