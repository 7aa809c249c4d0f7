"""Per-product input validation: the product's own fail-closed checks, the vectorised cross-file facts, and the
GX suites, combined into one :class:`ValidationResult` (phases 1–3 of the specs).

Order and fail-closed argument: every check here reads only validated-or-rejected data and draws no noise; a
failure is returned as ``result.error`` (an ``InputError`` naming file, row and column) and the caller raises it
before preprocessing, so nothing is measured and no ledger entry is written for data that failed.
Per-state partitions: row counts and rule violations are reported per state (TABBLKST) from one vectorised
pass, and GX validates the distinct-value domain of every column (exactly equivalent for membership rules,
see :mod:`validation.domain`), which keeps 10 M persons well inside a minute.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import InputError
from validation import gx, suites
from validation.domain import Column, domain_frame, facts_frame
from validation.report import render_html
from validation.result import ExpectationRow, ValidationResult


@dataclass(frozen=True)
class InputSuite:
    """One input file's suite: its name in messages, its (full) columns — or a loader of them, called when the
    suite runs, so a split input is held one file at a time — and its checks."""

    suite: str
    file: str
    columns: Mapping[str, Column] | Callable[[], Mapping[str, Column]]
    checks: Sequence[Check]

    def load(self) -> Mapping[str, Column]:
        return self.columns() if callable(self.columns) else self.columns


Check = gx.Check


def _fact(rule: str, file: str, column: str, bad: np.ndarray) -> dict[str, object]:
    """A rule's violation count and first offending row (1-based, header = row 1; 0 when none)."""
    idx = np.flatnonzero(bad)
    return {"rule": rule, "file": file, "column": column, "violations": int(idx.size),
            "first_row": int(idx[0]) + 2 if idx.size else 0}


def _scalar_fact(rule: str, file: str, column: str, holds: bool) -> dict[str, object]:
    """A whole-file rule (no row): one violation when it does not hold."""
    return {"rule": rule, "file": file, "column": column, "violations": int(not holds), "first_row": 0}


def _not_in(values: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``~np.isin(values, allowed)`` by hashing (numpy sorts when the value range is wide, as MAFIDs are: 7x
    slower at 10 M rows)."""
    return ~np.asarray(pd.Series(values).isin(pd.unique(np.asarray(allowed))).to_numpy(), dtype=bool)


def _fact_not_in(rule: str, file: str, column: str, values: pa.ChunkedArray, allowed: pa.Array | pa.ChunkedArray,
                 where: pa.ChunkedArray | None = None) -> dict[str, object]:
    """A membership rule decided on the distinct values (cheap at 10 M rows); rows are scanned only to count
    and locate violations once a bad value is known to exist."""
    candidates = values if where is None else pc.filter(values, where)
    uniq = pc.unique(candidates)
    bad_values = pc.filter(uniq, pc.invert(pc.is_in(uniq, value_set=allowed)))
    if len(bad_values) == 0:
        return {"rule": rule, "file": file, "column": column, "violations": 0, "first_row": 0}
    mask = pc.is_in(values, value_set=bad_values)
    if where is not None:
        mask = pc.and_(mask, where)
    return _fact(rule, file, column, mask.to_numpy(zero_copy_only=False))


def _first_dup_mask(values: np.ndarray) -> np.ndarray:
    """True on every row whose value occurred on an earlier row."""
    return np.asarray(pd.Series(values).duplicated(keep="first").to_numpy(), dtype=bool)


def _first_row_of(col: Column, value: Any) -> int | None:
    """1-based row (header = 1) of the first occurrence of ``value`` in a column (vectorised)."""
    arr = col.to_numpy(zero_copy_only=False) if isinstance(col, pa.ChunkedArray | pa.Array) else np.asarray(col)
    try:
        hit = np.flatnonzero(pd.isna(arr) if value is None else arr == value)
    except (TypeError, ValueError):
        return None
    return int(hit[0]) + 2 if hit.size else None


# -- PHSafe -------------------------------------------------------------------------------------------------

def _phsafe(confidential: Mapping[str, Any], public: Mapping[str, Any],
            config: Any) -> tuple[list[InputSuite], list[dict[str, object]], dict[str, Any], Callable[[], None]]:
    from dasflow.products.phsafe.inputs import Inputs, check_cross_file

    p, u, g = confidential["persons"], confidential["units"], public["geo"]
    files = {"persons": "persons.csv", "units": "units.csv", "geo": "geo.csv"}
    inputs = [InputSuite(f"phsafe.{n}", files[n], cols, suites.PHSAFE[n])
              for n, cols in (("persons", p), ("units", u), ("geo", g))]
    allowed = np.array(sorted(int(s) for s in config.state_filter), dtype=np.int64)
    occupied = (u["RTYPE"] == 2) & (u["HHT"] != 0)
    facts = [
        _fact("unique MAFID", files["units"], "MAFID", _first_dup_mask(u["MAFID"])),
        _fact("unique MAFID", files["geo"], "MAFID", _first_dup_mask(g["MAFID"])),
        _fact("person MAFID in units", files["persons"], "MAFID", _not_in(p["MAFID"], u["MAFID"])),
        _fact("unit MAFID in geo", files["units"], "MAFID", _not_in(u["MAFID"], g["MAFID"])),
        _fact("geo MAFID in units", files["geo"], "MAFID", _not_in(g["MAFID"], u["MAFID"])),
        _fact("TABBLKST in state_filter", files["geo"], "TABBLKST", _not_in(g["TABBLKST"], allowed)),
        *[_fact(f"{c} set for occupied units", files["units"], c, occupied & (u[c] == 0))
          for c in ("HHRACE", "HHSPAN", "TEN", "HHT2")],
        _fact("GQ persons are RTYPE 5 with RELSHIP 37/38", files["persons"], "RELSHIP",
              (p["RTYPE"] == 5) != np.isin(p["RELSHIP"], (37, 38))),
    ]
    # per-state partition: persons per state through their unit's geography (orphans under "??")
    order = np.argsort(g["MAFID"], kind="stable")
    pos = np.searchsorted(g["MAFID"], p["MAFID"], sorter=order)
    pos = np.minimum(pos, max(len(order) - 1, 0))
    found = g["MAFID"][order[pos]] == p["MAFID"] if len(order) else np.zeros(len(p["MAFID"]), bool)
    state = np.where(found, g["TABBLKST"][order[pos]] if len(order) else 0, -1)
    per_state = _per_state(state.astype(np.int64), fmt=lambda s: f"{s:02d}" if s >= 0 else "??")
    summary = {"rows": {files[n]: len(c["MAFID"]) for n, c in (("persons", p), ("units", u), ("geo", g))},
               "universe": config.universe, "persons_per_state": per_state}

    def own() -> None:
        # The facts above replicate check_cross_file rule for rule (tested on the corpus), so its cost (numpy
        # isin/argsort over every MAFID, ~25 s CPU at 10 M persons) is paid only to word the error when a
        # fact has failed; its InputError is then the authoritative one.
        if any(int(str(f["violations"])) for f in facts):
            check_cross_file(Inputs(persons=p, units=u, geo=g, files=files), config.state_filter)

    return inputs, facts, summary, own


def _per_state(codes: np.ndarray, fmt: Callable[[int], str]) -> dict[str, int]:
    values, counts = np.unique(codes, return_counts=True)
    return {fmt(int(v)): int(c) for v, c in zip(values, counts, strict=True)}


# -- SafeTab-P ----------------------------------------------------------------------------------------------

def _read_text_table(path: Path) -> pd.DataFrame:
    df = pd.read_csv(path, sep="|", dtype=str, keep_default_na=False, na_filter=False)
    df.columns = [c.strip() for c in df.columns]
    out: pd.DataFrame = df.apply(lambda s: s.str.strip())
    return out


def _safetab(confidential: Mapping[str, Any], public: Mapping[str, Any],
             config: Any) -> tuple[list[InputSuite], list[dict[str, object]], dict[str, Any], Callable[[], None]]:
    from dasflow.products.safetab_p.iterations import CODE_TO_ITER_FILE, CODES_FILE, ETH_ITER_FILE, RACE_ITER_FILE
    from dasflow.products.safetab_p.product import PERSON_DIR
    from dasflow.products.safetab_p.records import (
        GRFC_COLUMNS,
        PERSON_COLUMNS,
        PERSON_FILE,
        encode_persons,
        read_pipe_file,
    )

    geo, index = public["geography"], public["iterations"]
    it_dir = Path(index.source)
    its = {name: _read_text_table(it_dir / name) for name in suites.ITERATION_FILES}
    codes = [str(c) for c in index.codes]
    grfc = read_pipe_file(geo.source, GRFC_COLUMNS, extra_columns=True)
    inputs = [InputSuite("safetab_p.grfc", Path(geo.source).name, {c: grfc.column(c) for c in grfc.column_names},
                         suites.GRFC)]
    for name, frame in its.items():
        inputs.append(InputSuite(f"safetab_p.{name.removesuffix('.txt')}", name,
                                 {c: frame[c] for c in frame.columns}, suites.ITERATION_FILES[name]))
    grfc_key = pc.binary_join_element_wise(grfc.column("TABBLKST"), grfc.column("TABBLKCOU"),
                                           grfc.column("TABTRACTCE"), grfc.column("TABBLK"), "")
    race, eth, cmap = (its[RACE_ITER_FILE], its[ETH_ITER_FILE], its[CODE_TO_ITER_FILE])
    static = [
        _fact("unique block", Path(geo.source).name, "TABBLK",
              _first_dup_mask(grfc_key.to_numpy(zero_copy_only=False))),
        _fact("unique code", CODES_FILE, "RACE_ETH_CODE", its[CODES_FILE].RACE_ETH_CODE.duplicated().to_numpy()),
        _fact("unique iteration code", RACE_ITER_FILE, "ITERATION_CODE", race.ITERATION_CODE.duplicated().to_numpy()),
        _fact("unique iteration code", ETH_ITER_FILE, "ITERATION_CODE", eth.ITERATION_CODE.duplicated().to_numpy()),
        _fact("race and ethnicity iteration codes distinct", ETH_ITER_FILE, "ITERATION_CODE",
              eth.ITERATION_CODE.isin(race.ITERATION_CODE).to_numpy()),
        _fact("mapped iteration is known", CODE_TO_ITER_FILE, "ITERATION_CODE",
              (~cmap.ITERATION_CODE.isin(pd.concat([race.ITERATION_CODE, eth.ITERATION_CODE]))).to_numpy()),
        _fact("mapped code is known", CODE_TO_ITER_FILE, "RACE_ETH_CODE",
              (~cmap.RACE_ETH_CODE.isin(its[CODES_FILE].RACE_ETH_CODE)).to_numpy()),
        _fact("unique mapping row", CODE_TO_ITER_FILE, "RACE_ETH_CODE", cmap.duplicated().to_numpy()),
    ]
    code_set = pa.array([*codes, "Null"])
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
        block_fact, codes_of_file = _safetab_person_facts(persons, name, grfc_key, code_set, public["universe"],
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
        person_suites.append(InputSuite("safetab_p.persons", name, _columns_of(persons) if path is None
                                        else functools.partial(_read_columns, path), suites.SAFETAB_PERSONS))
        del persons
    inputs = person_suites + inputs
    facts = block_facts + static + code_facts
    summary = {"rows": {**row_counts, Path(geo.source).name: int(grfc.num_rows),
                        **{n: len(f) for n, f in its.items()}},
               "universe": public["universe"], "persons_per_state": dict(sorted(per_state.items()))}

    def own() -> None:
        if own_error:
            raise own_error[0]

    return inputs, facts, summary, own


def _columns_of(table: pa.Table) -> dict[str, Column]:
    return {c: table.column(c) for c in table.column_names}


def _read_columns(path: Path) -> dict[str, Column]:
    from dasflow.products.safetab_p.records import PERSON_COLUMNS, read_pipe_file

    return _columns_of(read_pipe_file(path, PERSON_COLUMNS))


def _safetab_person_facts(persons: pa.Table, name: str, grfc_key: pa.Array, code_set: pa.Array, universe: str,
                          config: Any) -> tuple[dict[str, object], list[dict[str, object]]]:
    """The person file's cross-file facts: blocks in the GRF-C (persons of the run's states), codes listed."""
    from dasflow.products.safetab_p.iterations import CODES_FILE

    block = pc.binary_join_element_wise(persons.column("TABBLKST"), persons.column("TABBLKCOU"),
                                        persons.column("TABTRACTCE"), persons.column("TABBLK"), "")
    st = persons.column("TABBLKST")
    if universe == "PR":
        in_run = pc.equal(st, "72")
    elif config.state_filter_us:
        in_run = pc.is_in(st, value_set=pa.array(list(config.state_filter_us)))
    else:
        in_run = pc.not_equal(st, "72")
    codes = [_fact_not_in(f"{col} in {CODES_FILE}", name, col, persons.column(col), code_set)
             for col in [*(f"QRACE{i}" for i in range(1, 9)), "QSPAN"]]
    # one universe per release (US or PR, separate ledgers): a record of the other universe in the release's
    # input is refused, not silently dropped (a mixed-up export would otherwise pass unnoticed)
    pr = pc.equal(st, "72").to_numpy(zero_copy_only=False)
    codes.append(_fact(f"person in the release universe {universe}", name, "TABBLKST",
                       ~pr if universe == "PR" else pr))
    return _fact_not_in("person block in GRF-C", name, "TABBLK", block, grfc_key, where=in_run), codes


# -- group sizes --------------------------------------------------------------------------------------------

def _groupsize(confidential: Mapping[str, Any], public: Mapping[str, Any],
               config: Any) -> tuple[list[InputSuite], list[dict[str, object]], dict[str, Any], Callable[[], None]]:
    from dasflow.products.groupsize.product import GroupSizeProduct

    hh: pd.DataFrame = confidential["households"]
    source = str(confidential.get("households_source", "<households>"))
    geo: pd.DataFrame = public["geography"]
    key = hh["STATE"].astype(str) + "\x00" + hh["COUNTY"].astype(str)
    known = pd.Index(geo["STATE"].astype(str) + "\x00" + geo["COUNTY"].astype(str))
    facts = [
        _fact("(STATE, COUNTY) in the public geography", source, "COUNTY",
              ~np.asarray(key.isin(known).to_numpy(), dtype=bool)),
        _scalar_fact("occupied units = public invariant n", source, "SIZE", len(hh) == int(public["n_groups"])),
    ]
    per_state = {str(k): int(v) for k, v in hh["STATE"].value_counts().sort_index().items()}
    summary = {"rows": {source: len(hh)}, "n_groups": int(public["n_groups"]), "households_per_state": per_state}

    def own() -> None:
        GroupSizeProduct(config).prepare(confidential, public)

    return [InputSuite("groupsize.households", source, {c: hh[c] for c in hh.columns},
                       suites.GROUPSIZE_HOUSEHOLDS)], facts, summary, own


# -- TopDown -----------------------------------------------------------------------------------------------

def _topdown(confidential: Mapping[str, Any], public: Mapping[str, Any],
             config: Any) -> tuple[list[InputSuite], list[dict[str, object]], dict[str, Any], Callable[[], None]]:
    """TopDown persons (block GEOID + the schema's attribute codes) against the public block geography."""
    from dasflow.products.topdown.product import TopDown

    persons: pd.DataFrame = confidential["persons"]
    source = str(confidential.get("persons_source", "<persons>"))
    schema = config.strategy.schema
    if "spine" in public:
        blocks = np.asarray(public["spine"].block_geoid).astype(str)
    elif "GEOID" in public["blocks"].columns:
        blocks = public["blocks"]["GEOID"].astype(str).to_numpy()
    else:  # a GRF-C: the block GEOID is state + county + tract + block
        b = public["blocks"]
        blocks = (b["TABBLKST"].astype(str) + b["TABBLKCOU"].astype(str) + b["TABTRACTCE"].astype(str)
                  + b["TABBLK"].astype(str)).to_numpy()
    checks = [Check("ExpectTableColumnsToMatchSet", {"column_set": ["GEOID", *schema.names], "exact_match": False}),
              Check("ExpectColumnValuesToNotBeNull", {"column": "GEOID"}),
              Check("ExpectColumnValuesToMatchRegex", {"column": "GEOID", "regex": r"^[0-9]{15}$"})]
    checks += [Check("ExpectColumnValuesToBeBetween", {"column": a, "min_value": 0, "max_value": int(d) - 1})
               for a, d in schema.attributes]
    cols = {c: persons[c] for c in ["GEOID", *schema.names] if c in persons.columns}
    geoid = persons["GEOID"].astype(str).to_numpy() if "GEOID" in persons.columns else np.zeros(0, str)
    blocks_source = str(public.get("blocks_source", "<blocks>"))
    facts = [_fact("person block in the block geography", source, "GEOID", _not_in(geoid, blocks)),
             _fact("unique block GEOID", blocks_source, "GEOID", _first_dup_mask(blocks))]
    kinds = getattr(config, "invariant_kinds", ("total",) if getattr(config, "total_invariant", False) else ())
    invariants = public.get("invariants") or {}
    total = invariants.get("total")
    if total is not None and "total" in kinds:
        facts.append(_scalar_fact("persons = public population invariant", "invariants.json", "total",
                                  int(total) == len(persons)))
    states = pd.Series(geoid).str[:2].value_counts().sort_index()
    state_inv = invariants.get("state")
    if isinstance(state_inv, dict) and "state" in kinds:
        geo_states = set(pd.Series(blocks).str[:2])
        facts.append(_scalar_fact("invariant states = states of the block geography", "invariants.json", "state",
                                  set(map(str, state_inv)) == geo_states))
        for k, n in sorted(state_inv.items()):
            facts.append(_scalar_fact(f"persons of state {k} = public state population invariant",
                                      "invariants.json", f"state.{k}", int(states.get(str(k), 0)) == n))
    product = TopDown(config)
    if public.get("block_facts") is not None and getattr(config, "uses_structural_zeros", False) \
            and "HHGQ" in persons.columns and len(persons):
        from dasflow.products.topdown.invariants import STRUCTURAL_ATTRIBUTE

        bm = product.block_mask(public)
        sp = product.spine(public)
        assert bm is not None
        order = np.argsort(sp.block_geoid.astype(str))
        sg = sp.block_geoid.astype(str)[order]
        pos = np.minimum(np.searchsorted(sg, geoid), sg.size - 1)
        known = sg[pos] == geoid
        code = pd.to_numeric(persons[STRUCTURAL_ATTRIBUTE], errors="coerce").fillna(0).to_numpy().astype(np.int64)
        code = np.clip(code, 0, 62)
        impossible = known & (((bm[order[pos]] >> code) & 1) == 0)
        facts.append(_fact("person in a cell its block's public facts allow (no structural zero)", source,
                           STRUCTURAL_ATTRIBUTE, impossible))
    summary = {"rows": {source: len(persons)}, "persons_per_state": {str(k): int(v) for k, v in states.items()}}

    def own() -> None:
        product.prepare(confidential, public)

    return [InputSuite("topdown.persons", source, cols, checks)], facts, summary, own


_RANGE_CHECKS = frozenset({"ExpectColumnValuesToBeBetween", "ExpectColumnValuesToNotBeNull",
                           "ExpectColumnValuesToBeOfType"})


def _range_only(checks: Sequence[Check]) -> set[str]:
    """Columns whose every expectation depends only on dtype, nulls and the min/max (e.g. MAFID: millions of
    distinct values, checked by ``ToBeBetween``)."""
    by_col: dict[str, set[str]] = {}
    for c in checks:
        if c.column is not None:
            by_col.setdefault(c.column, set()).add(c.expectation)
    return {col for col, kinds in by_col.items() if kinds <= _RANGE_CHECKS}


RUNNERS: dict[str, Callable[..., tuple[list[InputSuite], list[dict[str, object]], dict[str, Any],
                                       Callable[[], None]]]] = {
    "phsafe": _phsafe, "safetab-p": _safetab, "groupsize": _groupsize, "topdown": _topdown}


def _error_from_suite(s: InputSuite, columns: Mapping[str, Column], rows: list[ExpectationRow],
                      first: tuple[Check, list[Any], list[Any]] | None) -> InputError:
    check = first[0] if first else None
    bad = next(r for r in rows if not r.success)
    column = bad.column or (check.column if check else None)
    row = None
    if first is not None and first[2] and column is not None and column in columns:
        row = _first_row_of(columns[column], first[2][0])
    elif column is None:
        row = 1  # header-level expectation (column set, order)
    return InputError(f"{bad.expectation} failed ({bad.detail}) [suite {s.suite}]", file=s.file, row=row,
                      column=column)


def run_product_suite(product: str, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: Any) -> ValidationResult:
    """Validate one product's inputs (phases 1–3) with its GX suites; never raises for bad data.

    ``confidential``/``public``/``config`` are what the product's adapter returns (``confidential_inputs``,
    ``public_inputs``, ``load_config``). Call ``result.raise_for_failure()`` to fail closed.
    """
    if product not in RUNNERS:
        raise InputError(f"no validation suites for product {product!r}; known: {sorted(RUNNERS)}",
                         column="products.name")
    error: InputError | None = None
    rows: list[ExpectationRow] = []
    try:
        inputs, facts, summary, own = RUNNERS[product](confidential, public, config)
    except InputError as exc:  # the inputs could not even be assembled (e.g. an iteration file is unreadable)
        error, inputs, facts, summary = exc, [], [], {}
        own = None
    if own is not None:
        try:
            own()  # the product's own fail-closed checks (authoritative first error)
        except InputError as exc:
            error = exc
    for s in inputs:
        columns = s.load()
        out = gx.validate(s.suite, s.checks, domain_frame(columns, extremes_only=_range_only(s.checks)))
        rows += out.rows
        if not out.success and error is None:
            error = _error_from_suite(s, columns, out.rows, out.first_failure)
        del columns
    if facts:
        ff = facts_frame(facts)
        out = gx.validate(f"{product}.cross_file", suites.FACTS_SUITE, ff)
        rows += out.rows
        if not out.success and error is None:
            bad = ff[ff.violations > 0].iloc[0]
            error = InputError(f"{bad.rule} violated", file=str(bad.file),
                               row=int(bad.first_row) or None, column=str(bad.column))
        summary["cross_file"] = ff.to_dict(orient="records")
    summary["suite_version"] = gx.SUITE_VERSION
    summary["expectations"] = {"evaluated": len(rows), "failed": sum(not r.success for r in rows)}
    result = ValidationResult(product=product, success=error is None, summary=summary, rows=rows, error=error)
    result.html = render_html(result)
    return result
