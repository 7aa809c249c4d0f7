"""PHSafe's validation: the GX domain suites of its three input files (phsafe.md §1.5), the vectorised
cross-file facts, the phase-0 file pre-checks, and the release-file rules (headers, the R16 output validator).

Fail-closed argument: everything here runs in the validate stage (inputs) or the release stage (outputs) and
draws no noise; an input failure stops the release before preprocessing, so nothing is measured for data that
failed. The summary holds counts only (rows per file, persons per state), never a confidential value.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dasflow.errors import DasflowError, InputError
from dasflow.io.files import cache_dir, input_prefix, local_file
from dasflow.io.store import ObjectStore
from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.inputs import SCHEMAS, Inputs, check_cross_file, read_table
from dasflow.products.phsafe.outputs import columns, validate_output
from dasflow.products.phsafe.tables import OUTPUT_TABLES
from dasflow.products.plugin import InputChecks
from dasflow.validation.gx import Check
from dasflow.validation.preflight import check_delimited
from dasflow.validation.products import InputSuite, fact, first_dup_mask, not_in, per_state
from dasflow.validation.stream import Chunk, KeySet, RowFact, StreamedSuite, line_chunks, row_chunks
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


#: check_cross_file's message for each fact rule (the facts replicate it rule for rule, in its order)
_MESSAGES: dict[str, str] = {
    "unique MAFID": "duplicate MAFID", "person MAFID in units": "person MAFID is not in units",
    "unit MAFID in geo": "unit MAFID is not in geo", "geo MAFID in units": "geo MAFID is not in units",
    **{f"{c} set for occupied units": f"{c} is NIU (0) for an occupied housing unit"
       for c in ("HHRACE", "HHSPAN", "TEN", "HHT2")},
    "GQ persons are RTYPE 5 with RELSHIP 37/38":
        "RTYPE and RELSHIP disagree (GQ persons are RTYPE 5 with RELSHIP 37/38)",
}


def _file_chunks(path: Path, label: str, name: str, chunk_rows: int) -> Iterator[Chunk]:
    """One confidential file read in runs of at most ``chunk_rows`` lines, each through the product's exact
    reader (``read_table``: phases 1–2, same acceptance and messages) — a file that fits in one run directly, a
    longer one through a copy of each run in this process's private cache (``io.files.cache_dir``: mode 0700,
    where copies of confidential inputs already live; removed after the file, at exit, or by the next process
    if this one is killed). Reader errors name the file and its own row; the chunks are labelled ``label`` (the
    suites' and facts' name of the file)."""
    runs = line_chunks(path, chunk_rows)
    first = next(runs)
    second = next(runs, None)
    if second is None:  # the whole file is one run
        yield from row_chunks(label, read_table(path, name), chunk_rows)
        return
    with tempfile.TemporaryDirectory(prefix="validate-", dir=cache_dir()) as tmp:
        part = Path(tmp, path.name)
        for offset, header, data in itertools.chain([first, second], runs):  # one run in memory at a time
            part.write_bytes(header + data)
            cols = _relabel(lambda: read_table(part, name), part, path, offset)
            yield from row_chunks(label, cols, chunk_rows, offset)


def _relabel(read: Callable[[], dict[str, np.ndarray]], path: Path, source: Path,
             offset: int) -> dict[str, np.ndarray]:
    """``read()`` of a run copied to ``path``, with a reader error moved to the ``source`` file and its own row
    (``offset`` data rows before the run)."""
    try:
        return read()
    except InputError as exc:
        row = exc.row + offset if exc.row is not None and exc.row > 1 else exc.row
        text = str(exc)
        message = text.split(": ", 1)[1] if exc.file is not None and ": " in text else text
        raise InputError(message.replace(str(path), str(source)), file=str(source), row=row,
                         column=exc.column) from None


def stream_checks(store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any], config: PHSafeConfig,
                  chunk_rows: int) -> InputChecks:
    """:func:`input_checks` in one pass over the confidential files in chunks (every state folder's, or the
    national pair's, at most ``chunk_rows`` rows at a time): units first (their MAFIDs kept as a
    :class:`KeySet`, 8 bytes per unit, for the uniqueness and person → unit rules), then persons. The public
    ``geo.csv`` is held whole (public, 12 bytes per row) with one stable sort of its MAFIDs (16 bytes per row),
    which serves every rule on it: unit → geo membership, each person's state, and geo's own duplicates (no
    hash table, no second key set: at national size these were ≈ 2 GB of a 3.6 GB peak at 100 M persons).
    Same suites, facts (rule for rule and in order, first rows global in each file, which is named), summary
    and, on a failed fact, ``check_cross_file``'s message."""
    prefix = input_prefix(inputs, "phsafe", "confidential/phsafe/")
    folders = state_folders(store, prefix)
    g = public["geo"]

    def files(name: str) -> list[tuple[str, Path]]:
        if folders is None:
            return [(FILES[name], local_file(store, prefix + FILES[name]))]
        return [(f"{f}/{FILES[name]}", local_file(store, f"{prefix}{f}/{FILES[name]}")) for f in folders]

    def source(name: str) -> Callable[[], Iterator[Chunk]]:
        def chunks() -> Iterator[Chunk]:
            for label, path in files(name):
                yield from _file_chunks(path, label, name, chunk_rows)
        return chunks

    streamed = {n: StreamedSuite(f"phsafe.{n}", SUITES[n]) for n in ("persons", "units")}
    parts = {n: streamed[n].part(FILES[n], source(n)) for n in ("persons", "units")}
    order = np.argsort(g["MAFID"], kind="stable")  # equal MAFIDs stay in file order
    sorted_geo = np.asarray(g["MAFID"], dtype=np.int64)[order]

    def in_geo(keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """Whether each key is a geo MAFID, and the position in ``sorted_geo`` of its first row if so."""
        pos = np.minimum(np.searchsorted(sorted_geo, keys), max(sorted_geo.size - 1, 0))
        found = sorted_geo[pos] == np.asarray(keys) if sorted_geo.size else np.zeros(len(keys), bool)
        return found, pos

    units_keys = KeySet()
    unit_dup = RowFact("unique MAFID", FILES["units"], "MAFID")
    unit_geo = RowFact("unit MAFID in geo", FILES["units"], "MAFID")
    occupied_facts = {c: RowFact(f"{c} set for occupied units", FILES["units"], c)
                      for c in ("HHRACE", "HHSPAN", "TEN", "HHT2")}
    rows = {n: 0 for n in FILES}
    for chunk in source("units")():
        u = chunk.columns
        parts["units"].add(chunk)
        unit_dup.add(units_keys.first_seen(u["MAFID"]), chunk)
        unit_geo.add(~in_geo(u["MAFID"])[0], chunk)
        occupied = (u["RTYPE"] == 2) & (u["HHT"] != 0)
        for c, f in occupied_facts.items():
            f.add(occupied & (u[c] == 0), chunk)
        rows["units"] += chunk.rows
    person_unit = RowFact("person MAFID in units", FILES["persons"], "MAFID")
    gq = RowFact("GQ persons are RTYPE 5 with RELSHIP 37/38", FILES["persons"], "RELSHIP")
    states = np.zeros(101, dtype=np.int64)  # index: state code + 1 (0: no geography)
    for chunk in source("persons")():
        p = chunk.columns
        parts["persons"].add(chunk)
        person_unit.add(~units_keys.contains(p["MAFID"]), chunk)
        gq.add((p["RTYPE"] == 5) != np.isin(p["RELSHIP"], (37, 38)), chunk)
        found, pos = in_geo(p["MAFID"])
        state = np.where(found, g["TABBLKST"][order[pos]] if len(order) else 0, -1).astype(np.int64)
        states += np.bincount(state + 1, minlength=101)[:101]
        rows["persons"] += chunk.rows
    rows["geo"] = len(g["MAFID"])
    geo_dup = np.zeros(sorted_geo.size, dtype=bool)  # = first_dup_mask: all but the first row of equal MAFIDs
    geo_dup[order[1:][sorted_geo[1:] == sorted_geo[:-1]]] = True
    allowed = np.array(sorted(int(s) for s in config.state_filter), dtype=np.int64)
    facts = [
        unit_dup.record(),
        fact("unique MAFID", FILES["geo"], "MAFID", geo_dup),
        person_unit.record(),
        unit_geo.record(),
        fact("geo MAFID in units", FILES["geo"], "MAFID", ~units_keys.contains(g["MAFID"])),
        fact("TABBLKST in state_filter", FILES["geo"], "TABBLKST", not_in(g["TABBLKST"], allowed)),
        *[f.record() for f in occupied_facts.values()],
        gq.record(),
    ]
    suites = [streamed["persons"], streamed["units"], InputSuite("phsafe.geo", FILES["geo"], g, SUITES["geo"])]
    summary = {"rows": {FILES[n]: rows[n] for n in ("persons", "units", "geo")}, "universe": config.universe,
               "persons_per_state": {(f"{s - 1:02d}" if s else "??"): int(states[s])
                                     for s in np.flatnonzero(states).tolist()}}

    def own() -> None:
        # check_cross_file's error, worded from the first failed fact (its rule-for-rule replica): the same file,
        # row, column and message, without holding the inputs whole
        bad = next((f for f in facts if int(str(f["violations"]))), None)
        if bad is None:
            return
        rule, row = str(bad["rule"]), int(str(bad["first_row"]))
        message = _MESSAGES.get(rule)
        if rule == "TABBLKST in state_filter":
            message = f"TABBLKST {int(g['TABBLKST'][row - 2]):02d} is not in state_filter"
        raise InputError(message or f"{rule} violated", file=str(bad["file"]), row=row, column=str(bad["column"]))

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
