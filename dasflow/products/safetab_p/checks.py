"""SafeTab-P's validation: the GX domain suites of the person records, the GRF-C and the four iteration files
(safetab-p.md input spec), the vectorised cross-file facts, the phase-0 file pre-checks and the release-file
headers.

Fail-closed argument: everything here runs in the validate stage and draws no noise; a failure stops the release
before preprocessing, so nothing is measured for data that failed. A split input (``person-records/*.txt``) is
checked one file at a time (one file's persons in memory). The summary holds counts only.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, local_dir, local_file
from dasflow.io.store import ObjectStore
from dasflow.products.plugin import InputChecks
from dasflow.products.safetab_p.config import SafeTabPConfig
from dasflow.products.safetab_p.iterations import (
    CODE_TO_ITER_FILE,
    CODES_FILE,
    ETH_ITER_FILE,
    ITERATION_FILES,
    RACE_ITER_FILE,
)
from dasflow.products.safetab_p.outputs import T1_COLUMNS, T2_COLUMNS
from dasflow.products.safetab_p.product import PERSON_DIR, person_files
from dasflow.products.safetab_p.records import (
    GRFC_COLUMNS,
    GRFC_FILE,
    PERSON_COLUMNS,
    PERSON_FILE,
    encode_persons,
    pipe_chunks,
    read_pipe_file,
)
from dasflow.validation.domain import Column
from dasflow.validation.gx import Check
from dasflow.validation.lookup import GeoidIndex
from dasflow.validation.preflight import check_delimited
from dasflow.validation.products import InputSuite, fact, fact_not_in, first_dup_mask, table_columns
from dasflow.validation.stream import RowFact, StreamedSuite
from dasflow.validation.suites import STATE_FIPS, cols, in_set, regex

_CODE_OR_NULL = r"[0-9]{4}|Null"
#: person records as read (text columns). Code-list membership of QRACEn and QSPAN (against the run's
#: ``race-and-ethnicity-codes.txt``, ~1,800 codes) is a vectorised fact rule instead: GX's in-set expectation
#: with a value set that large costs seconds per column.
PERSONS_SUITE: list[Check] = [
    *cols(["QAGE", "QSEX", "HOUSEHOLDER", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "CENRACE",
           *[f"QRACE{i}" for i in range(1, 9)], "QSPAN"]),
    regex("QAGE", r"0{0,2}[0-9]|0?[1-9][0-9]|10[0-9]|11[0-5]"), in_set("QSEX", ["1", "2"]),
    in_set("HOUSEHOLDER", ["True", "False"]),
    in_set("TABBLKST", STATE_FIPS), regex("TABBLKCOU", "[0-9]{3}"), regex("TABTRACTCE", "[0-9]{6}"),
    regex("TABBLK", "[0-9]{4}"), regex("CENRACE", "0[1-9]|[1-5][0-9]|6[0-3]"),
    regex("QRACE1", "[0-9]{4}"), *[regex(f"QRACE{i}", _CODE_OR_NULL) for i in range(2, 9)],
    regex("QSPAN", "[0-9]{4}"),
]

#: GRF-C columns SafeTab-P uses (the production file carries more; extra columns are allowed)
GRFC_SUITE: list[Check] = [
    Check("ExpectTableColumnsToMatchSet", {"column_set": ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK",
                                                          "PLACEFP", "AIANNHCE"], "exact_match": True}),
    in_set("TABBLKST", STATE_FIPS), regex("TABBLKCOU", "[0-9]{3}"), regex("TABTRACTCE", "[0-9]{6}"),
    regex("TABBLK", "[0-9]{4}"), regex("PLACEFP", "[0-9]{5}"), regex("AIANNHCE", "[0-9]{4}"),
]

_BOOL = ["True", "False"]
#: the four public iteration files (exact headers, formats)
ITERATION_SUITES: dict[str, list[Check]] = {
    CODES_FILE: [*cols(["RACE_ETH_CODE", "RACE_ETH_NAME"]), regex("RACE_ETH_CODE", "[0-9]{4}")],
    RACE_ITER_FILE: [
        *cols(["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "ALONE", "DETAILED_ONLY", "COARSE_ONLY"]),
        regex("ITERATION_CODE", "[0-9]+"), in_set("LEVEL", ["0", "1", "2"]), in_set("ALONE", _BOOL),
        in_set("DETAILED_ONLY", [*_BOOL, "Null"]), in_set("COARSE_ONLY", [*_BOOL, "Null"])],
    ETH_ITER_FILE: [
        *cols(["ITERATION_CODE", "ITERATION_NAME", "LEVEL", "DETAILED_ONLY", "COARSE_ONLY"]),
        regex("ITERATION_CODE", "[0-9]+"), in_set("LEVEL", ["0", "1", "2"]),
        in_set("DETAILED_ONLY", [*_BOOL, "Null"]), in_set("COARSE_ONLY", [*_BOOL, "Null"])],
    CODE_TO_ITER_FILE: [
        *cols(["ITERATION_CODE", "RACE_ETH_CODE"]), regex("ITERATION_CODE", "[0-9]+"),
        regex("RACE_ETH_CODE", "[0-9]{4}")],
}
assert tuple(ITERATION_SUITES) == ITERATION_FILES


def preflight(store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
    """Phase 0: the GRF-C and the iteration files present under the public prefix; ``person-records.txt`` or
    every file of a split ``person-records/*.txt``."""
    if public:
        folder = local_dir(store, input_prefix(inputs, "safetab-p_public", "public/safetab-p/"))
        if (folder / GRFC_FILE).is_file():
            check_delimited(folder / GRFC_FILE, GRFC_COLUMNS, "|", extra_columns=True)
        for name in ITERATION_FILES:
            if (folder / name).is_file():
                check_delimited(folder / name, None, "|")
    else:
        prefix = input_prefix(inputs, "safetab-p", "confidential/safetab-p/")
        split = [k for k in store.list(f"{prefix}{PERSON_DIR}/") if k.endswith(".txt")]
        for key in split or [prefix + PERSON_FILE]:
            check_delimited(local_file(store, key), PERSON_COLUMNS, "|")


def output_header(file: str) -> list[str] | None:
    """``t1/t1_US.csv``, ``t2/t2_PR.csv``: the spec headers."""
    return {"t1": T1_COLUMNS, "t2": T2_COLUMNS}.get(Path(file).name.removesuffix(".csv").split("_")[0])


def _read_text_table(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False, na_filter=False)
    df.columns = [c.strip() for c in df.columns]
    out: pd.DataFrame = df.apply(lambda s: s.str.strip())
    return out


def _public_checks(public: Mapping[str, Any]) -> tuple[list[InputSuite], list[dict[str, object]], pa.Array,
                                                       pa.Array, dict[str, int]]:
    """The GRF-C's and the iteration files' suites, their facts, the GRF-C block keys, the code list (with
    "Null") and their row counts (public inputs, held whole)."""
    geo, index = public["geography"], public["iterations"]
    it_dir = Path(index.source)
    its = {name: _read_text_table(it_dir / name) for name in ITERATION_FILES}
    codes = [str(c) for c in index.codes]
    grfc = read_pipe_file(geo.source, GRFC_COLUMNS, extra_columns=True)
    inputs = [InputSuite("safetab_p.grfc", Path(geo.source).name, {c: grfc.column(c) for c in grfc.column_names},
                         GRFC_SUITE)]
    for name, frame in its.items():
        inputs.append(InputSuite(f"safetab_p.{name.removesuffix('.txt')}", name,
                                 {c: frame[c] for c in frame.columns}, ITERATION_SUITES[name]))
    grfc_key = pc.binary_join_element_wise(grfc.column("TABBLKST"), grfc.column("TABBLKCOU"),
                                           grfc.column("TABTRACTCE"), grfc.column("TABBLK"), "")
    race, eth, cmap = (its[RACE_ITER_FILE], its[ETH_ITER_FILE], its[CODE_TO_ITER_FILE])
    static = [
        fact("unique block", Path(geo.source).name, "TABBLK",
             first_dup_mask(grfc_key.to_numpy(zero_copy_only=False))),
        fact("unique code", CODES_FILE, "RACE_ETH_CODE", its[CODES_FILE].RACE_ETH_CODE.duplicated().to_numpy()),
        fact("unique iteration code", RACE_ITER_FILE, "ITERATION_CODE", race.ITERATION_CODE.duplicated().to_numpy()),
        fact("unique iteration code", ETH_ITER_FILE, "ITERATION_CODE", eth.ITERATION_CODE.duplicated().to_numpy()),
        fact("race and ethnicity iteration codes distinct", ETH_ITER_FILE, "ITERATION_CODE",
             eth.ITERATION_CODE.isin(race.ITERATION_CODE).to_numpy()),
        fact("mapped iteration is known", CODE_TO_ITER_FILE, "ITERATION_CODE",
             (~cmap.ITERATION_CODE.isin(pd.concat([race.ITERATION_CODE, eth.ITERATION_CODE]))).to_numpy()),
        fact("mapped code is known", CODE_TO_ITER_FILE, "RACE_ETH_CODE",
             (~cmap.RACE_ETH_CODE.isin(its[CODES_FILE].RACE_ETH_CODE)).to_numpy()),
        fact("unique mapping row", CODE_TO_ITER_FILE, "RACE_ETH_CODE", cmap.duplicated().to_numpy()),
    ]
    rows = {Path(geo.source).name: int(grfc.num_rows), **{n: len(f) for n, f in its.items()}}
    return inputs, static, grfc_key, pa.array([*codes, "Null"]), rows


def input_checks(confidential: Mapping[str, Any], public: Mapping[str, Any],
                 config: SafeTabPConfig) -> InputChecks:
    """Suites of the person file(s), the GRF-C and the iteration files; the cross-file facts (blocks in the
    GRF-C, codes in the code list, the release universe, iteration-file consistency); persons per state; and
    ``encode_persons`` (the product's own reader check) as the own check, its first error authoritative."""
    geo, index = public["geography"], public["iterations"]
    inputs, static, grfc_key, code_set, public_rows = _public_checks(public)
    grfc_index = GeoidIndex(grfc_key)  # built once: the persons' blocks are looked up in it file after file
    # the person file, or a split input file by file (one file's persons in memory at a time): per file the
    # cross-file facts and the product's own checks in one read, the GX suite in a second (lazy) read
    files: list[tuple[str, Path | None]] = [(PERSON_FILE, None)]
    if "person_files" in confidential:
        files = [(f"{PERSON_DIR}/{Path(f).name}", Path(f)) for f in confidential["person_files"]]
    per_state: dict[str, int] = {}
    row_counts: dict[str, int] = {}
    own_error: list[InputError] = []
    person_suites: list[InputSuite] = []
    block_facts: list[dict[str, object]] = []
    code_facts: list[dict[str, object]] = []
    for name, path in files:
        persons: pa.Table = confidential["persons"] if path is None else read_pipe_file(path, PERSON_COLUMNS)
        block_fact, codes_of_file = _person_facts(persons, name, grfc_index, code_set, public["universe"],
                                                  config)
        block_facts.append(block_fact)
        code_facts += codes_of_file
        for v in pc.value_counts(persons.column("TABBLKST")).to_pylist():
            per_state[str(v["values"])] = per_state.get(str(v["values"]), 0) + int(v["counts"])
        row_counts[name] = int(persons.num_rows)
        if not own_error:
            try:
                encode_persons(persons, geo, index, config.max_race_codes, config.state_filter_us, name)
            except InputError as exc:
                own_error.append(exc)
        person_suites.append(InputSuite("safetab_p.persons", name, table_columns(persons) if path is None
                                        else functools.partial(_read_columns, path), PERSONS_SUITE))
        del persons
    inputs = person_suites + inputs
    facts = block_facts + static + code_facts
    summary = {"rows": {**row_counts, **public_rows},
               "universe": public["universe"], "persons_per_state": dict(sorted(per_state.items()))}

    def own() -> None:
        if own_error:
            raise own_error[0]

    return InputChecks(suites=inputs, facts=facts, summary=summary, own=own)


def person_paths(store: ObjectStore, inputs: Mapping[str, str]) -> list[tuple[str, Path]]:
    """The person-records files as (name in messages, local path): ``person-records.txt``, or every file of a
    split ``person-records/*.txt`` (both present is refused, as the plugin's reader refuses it)."""
    prefix = input_prefix(inputs, "safetab-p", "confidential/safetab-p/")
    split = [k for k in store.list(prefix + PERSON_DIR + "/") if k.endswith(".txt")]
    if not split:
        return [(PERSON_FILE, local_file(store, prefix + PERSON_FILE))]
    if store.exists(prefix + PERSON_FILE):
        raise InputError(f"both {PERSON_FILE} and {PERSON_DIR}/ are present: give one person-records input",
                         file=prefix + PERSON_FILE)
    return [(f"{PERSON_DIR}/{f.name}", f) for f in person_files(local_dir(store, prefix + PERSON_DIR + "/"))]


def stream_checks(store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                  config: SafeTabPConfig, chunk_rows: int) -> InputChecks:
    """:func:`input_checks` in one pass over the person records in chunks (the national file, or each file of a
    split input, at most ``chunk_rows`` rows at a time): per chunk the facts (rows global in the file), the
    per-state counts, ``encode_persons`` (the product's own check, with the chunk's row offset) and the suite's
    domain. The persons suite is validated once on the union of the files' domains (per file only if that
    fails, :class:`StreamedSuite`), which gives the report of one suite per file at the cost of one GX run.
    Own check: the first error of the first file and chunk holding one (chunks in file order; within a chunk
    ``encode_persons``' check order, as the product's sliced ``prepare`` reports it)."""
    geo, index = public["geography"], public["iterations"]
    public_suites, static, grfc_key, code_set, public_rows = _public_checks(public)
    grfc_index = GeoidIndex(grfc_key)  # built once: the persons' blocks are looked up in it chunk after chunk
    persons_suite = StreamedSuite("safetab_p.persons", PERSONS_SUITE)
    per_state: dict[str, int] = {}
    row_counts: dict[str, int] = {}
    own_error: list[InputError] = []
    block_facts: list[dict[str, object]] = []
    code_facts: list[dict[str, object]] = []
    for name, path in person_paths(store, inputs):
        part = persons_suite.part(name, functools.partial(pipe_chunks, path, name, chunk_rows))
        block: RowFact | None = None
        codes: list[RowFact] = []
        rows = 0
        for chunk in part.source():
            persons = pa.table(dict(chunk.columns))
            block_fact, codes_of_chunk = _person_facts(persons, name, grfc_index, code_set, public["universe"],
                                                       config)
            if block is None:
                block = RowFact(str(block_fact["rule"]), name, str(block_fact["column"]))
                codes = [RowFact(str(f["rule"]), name, str(f["column"])) for f in codes_of_chunk]
            for acc, f in zip([block, *codes], [block_fact, *codes_of_chunk], strict=True):
                acc.add_count(int(str(f["violations"])), int(str(f["first_row"])) + chunk.offset, name)
            for v in pc.value_counts(persons.column("TABBLKST")).to_pylist():
                per_state[str(v["values"])] = per_state.get(str(v["values"]), 0) + int(v["counts"])
            rows += persons.num_rows
            if not own_error:
                try:
                    encode_persons(persons, geo, index, config.max_race_codes, config.state_filter_us, name,
                                   row_offset=chunk.offset)
                except InputError as exc:
                    own_error.append(exc)
            part.add(chunk)
            del persons
        row_counts[name] = rows
        assert block is not None  # a file yields at least one chunk
        block_facts.append(block.record())
        code_facts += [c.record() for c in codes]
    summary = {"rows": {**row_counts, **public_rows},
               "universe": public["universe"], "persons_per_state": dict(sorted(per_state.items()))}

    def own() -> None:
        if own_error:
            raise own_error[0]

    return InputChecks(suites=[persons_suite, *public_suites], facts=block_facts + static + code_facts,
                       summary=summary, own=own)


def _read_columns(path: Path) -> dict[str, Column]:
    return table_columns(read_pipe_file(path, PERSON_COLUMNS))


def _person_facts(persons: pa.Table, name: str, grfc: GeoidIndex, code_set: pa.Array, universe: str,
                  config: SafeTabPConfig) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The person file's cross-file facts: blocks in the GRF-C (persons of the run's states), codes listed."""
    block = pc.binary_join_element_wise(persons.column("TABBLKST"), persons.column("TABBLKCOU"),
                                        persons.column("TABTRACTCE"), persons.column("TABBLK"), "")
    st = persons.column("TABBLKST")
    if universe == "PR":
        in_run = pc.equal(st, "72")
    elif config.state_filter_us:
        in_run = pc.is_in(st, value_set=pa.array(list(config.state_filter_us)))
    else:
        in_run = pc.not_equal(st, "72")
    codes = [fact_not_in(f"{col} in {CODES_FILE}", name, col, persons.column(col), code_set)
             for col in [*(f"QRACE{i}" for i in range(1, 9)), "QSPAN"]]
    # one universe per release (US or PR, separate ledgers): a record of the other universe in the release's
    # input is refused, not silently dropped (a mixed-up export would otherwise pass unnoticed)
    pr = pc.equal(st, "72").to_numpy(zero_copy_only=False)
    codes.append(fact(f"person in the release universe {universe}", name, "TABBLKST",
                      ~pr if universe == "PR" else pr))
    return fact_not_in("person block in GRF-C", name, "TABBLK", block, grfc, where=in_run), codes


