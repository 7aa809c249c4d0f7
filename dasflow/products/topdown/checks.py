"""TopDown's input validation: the GX suite of the person records (block GEOID + the schema's attribute codes),
the cross-file facts against the public block geography, the population invariants and the structural-zero
facts, and the phase-0 file pre-checks.

Fail-closed argument: everything here runs in the validate stage and draws no noise; a failure stops the release
before preprocessing, so nothing is measured for data that failed. The invariant facts compare a public number
with a count of the confidential records and report only whether they agree. The summary holds counts only.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, local_file
from dasflow.io.store import ObjectStore
from dasflow.products.plugin import InputChecks
from dasflow.products.topdown.invariants import STRUCTURAL_ATTRIBUTE
from dasflow.products.topdown.measure import block_histogram
from dasflow.products.topdown.product import TopDown, TopDownConfig
from dasflow.validation.gx import Check
from dasflow.validation.lookup import GeoidIndex, geoid_keys
from dasflow.validation.preflight import check_delimited, check_parquet_files
from dasflow.validation.products import InputSuite, fact, first_dup_mask, not_in, scalar_fact
from dasflow.validation.stream import Chunk, RowFact, StreamedSuite, parquet_chunks, shifted

#: the GRF-C columns the block GEOID is built from (the production file carries more)
GRFC_KEY_COLUMNS = ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"]


def preflight(store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
    """Phase 0: the public ``GRF-C.txt`` (when present) as a delimited file; every confidential Parquet part
    decodes."""
    if public:
        key = input_prefix(inputs, "topdown_public", "public/topdown/") + "GRF-C.txt"
        if store.exists(key):
            check_delimited(local_file(store, key), GRFC_KEY_COLUMNS, "|", extra_columns=True)
    else:
        check_parquet_files(store, input_prefix(inputs, "topdown", "confidential/topdown/"))


def input_checks(confidential: Mapping[str, Any], public: Mapping[str, Any], config: TopDownConfig) -> InputChecks:
    """TopDown persons (block GEOID + the schema's attribute codes) against the public block geography, the
    configured population invariants and the public block facts; the product's own tabulation (``prepare``) as
    the own check."""
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
    facts = [fact("person block in the block geography", source, "GEOID", not_in(geoid, blocks)),
             fact("unique block GEOID", blocks_source, "GEOID", first_dup_mask(blocks))]
    kinds = getattr(config, "invariant_kinds", ("total",) if getattr(config, "total_invariant", False) else ())
    invariants = public.get("invariants") or {}
    states = pd.Series(geoid).str[:2].value_counts().sort_index()
    facts.extend(_invariant_facts(invariants, kinds, len(persons), states, blocks))
    product = TopDown(config)
    if public.get("block_facts") is not None and getattr(config, "uses_structural_zeros", False) \
            and "HHGQ" in persons.columns and len(persons):
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
        facts.append(fact("person in a cell its block's public facts allow (no structural zero)", source,
                          STRUCTURAL_ATTRIBUTE, impossible))
    summary = {"rows": {source: len(persons)}, "persons_per_state": {str(k): int(v) for k, v in states.items()}}

    def own() -> None:
        product.prepare(confidential, public)

    return InputChecks(suites=[InputSuite("topdown.persons", source, cols, checks)], facts=facts,
                       summary=summary, own=own)



#: the person files' block columns (the GEOID is built from them, zero-padded, as the plugin's reader does)
PERSON_GEO = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK")


def _public_blocks(public: Mapping[str, Any]) -> np.ndarray:
    if "spine" in public:
        return np.asarray(public["spine"].block_geoid).astype(str)
    if "GEOID" in public["blocks"].columns:
        return np.asarray(public["blocks"]["GEOID"].astype(str).to_numpy())
    b = public["blocks"]
    return np.asarray((b["TABBLKST"].astype(str) + b["TABBLKCOU"].astype(str) + b["TABTRACTCE"].astype(str)
                       + b["TABBLK"].astype(str)).to_numpy())


#: digits of the state, county, tract and block codes in a block GEOID
GEO_WIDTHS = (2, 3, 6, 4)


def person_geoid(codes: Any) -> pa.Array | pa.ChunkedArray:
    """The block GEOIDs of person records (``PERSON_GEO`` columns of a mapping or an Arrow table): each code as
    text, zero-filled to its width (``str.zfill``), joined — the one GEOID the reader, preprocessing and the
    streamed validation all use. Arrow strings, no Python object per person, when every code is non-null and
    either a non-negative integer within its width or a string of at most that many ASCII digits (there
    ``zfill`` is a left pad with zeros; the synthetic census stores the state code as text); any other input
    (nulls, negative or over-wide codes, other text) goes through pandas' ``zfill`` itself."""
    cols = [codes[c] if isinstance(codes[c], pa.Array | pa.ChunkedArray) else np.asarray(codes[c])
            for c in PERSON_GEO]
    for i, a in enumerate(cols):
        if isinstance(a, np.ndarray) and a.dtype.kind in "OSU":  # text codes: checked in Arrow, not per object
            with contextlib.suppress(pa.ArrowInvalid, pa.ArrowTypeError):
                cols[i] = pa.array(a)

    def padded(a: Any, width: int) -> bool:
        if not isinstance(a, pa.Array | pa.ChunkedArray):  # numpy: integer dtype, no nulls by construction
            return a.dtype.kind in "iu" and (a.size == 0 or (int(a.min()) >= 0 and int(a.max()) < 10**width))
        if a.null_count:
            return False
        if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
            return len(a) == 0 or bool(pc.all(pc.match_substring_regex(a, f"^[0-9]{{0,{width}}}$")).as_py())
        if not pa.types.is_integer(a.type):
            return False
        bounds = pc.min_max(a)
        return len(a) == 0 or (bounds["min"].as_py() >= 0 and bounds["max"].as_py() < 10**width)

    if all(padded(a, w) for a, w in zip(cols, GEO_WIDTHS, strict=True)):
        arrow = [a if isinstance(a, pa.Array | pa.ChunkedArray) else pa.array(a) for a in cols]
        if any(isinstance(a, pa.ChunkedArray) for a in arrow):
            arrow = [a if isinstance(a, pa.ChunkedArray) else pa.chunked_array([a]) for a in arrow]
        return pc.binary_join_element_wise(*[pc.utf8_lpad(a.cast(pa.string()), w, "0")
                                             for a, w in zip(arrow, GEO_WIDTHS, strict=True)], "")
    text = [pd.Series(np.asarray(a)).astype(str).str.zfill(w) for a, w in zip(cols, GEO_WIDTHS, strict=True)]
    return pa.array(text[0] + text[1] + text[2] + text[3], type=pa.string(), from_pandas=True)  # NaN: null


def _person_chunks(store: ObjectStore, prefix: str, names: list[str], chunk_rows: int) -> Iterator[Chunk]:
    """The person Parquet files in batches (:func:`parquet_chunks`: rows numbered as the plugin's reader
    concatenates them), as GEOID (:func:`person_geoid`, an Arrow string array) + the schema's attributes."""
    for chunk in parquet_chunks(store, prefix, [*PERSON_GEO, *names], chunk_rows, "person files"):
        yield Chunk(prefix, chunk.offset, {"GEOID": person_geoid(chunk.columns),
                                           **{n: pd.Series(np.asarray(chunk.columns[n])) for n in names}})


def stream_checks(store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any], config: TopDownConfig,
                  chunk_rows: int) -> InputChecks:
    """:func:`input_checks` in one pass over the person Parquet files in batches of at most ``chunk_rows`` rows:
    per batch the suite's domain, the block and structural-zero facts, the per-state counts and the product's
    own block tabulation checks (``block_histogram``: blocks, codes, structural zeros; rows of the concatenated
    input as before). Kept between batches: counts and the (public-sized) GEOID domain only. Own check: the
    first error of the first batch holding one."""
    prefix = input_prefix(inputs, "topdown", "confidential/topdown/")
    schema = config.strategy.schema
    names = list(schema.names)
    blocks = _public_blocks(public)
    lookup = GeoidIndex(pa.array(pd.unique(blocks), type=pa.string()))
    checks = [Check("ExpectTableColumnsToMatchSet", {"column_set": ["GEOID", *schema.names], "exact_match": False}),
              Check("ExpectColumnValuesToNotBeNull", {"column": "GEOID"}),
              Check("ExpectColumnValuesToMatchRegex", {"column": "GEOID", "regex": r"^[0-9]{15}$"})]
    checks += [Check("ExpectColumnValuesToBeBetween", {"column": a, "min_value": 0, "max_value": int(d) - 1})
               for a, d in schema.attributes]
    suite = StreamedSuite("topdown.persons", checks)
    part = suite.part(prefix, lambda: _person_chunks(store, prefix, names, chunk_rows))
    in_geo = RowFact("person block in the block geography", prefix, "GEOID")
    product = TopDown(config)
    zeros = public.get("block_facts") is not None and getattr(config, "uses_structural_zeros", False) \
        and STRUCTURAL_ATTRIBUTE in names
    bm = product.block_mask(public) if zeros else None
    sp = product.spine(public)
    structural = RowFact("person in a cell its block's public facts allow (no structural zero)", prefix,
                         STRUCTURAL_ATTRIBUTE)
    states: dict[str, int] = {}
    rows = 0
    own_error: list[InputError] = []
    for chunk in part.source():
        geoid = chunk.columns["GEOID"]
        assert isinstance(geoid, pa.Array | pa.ChunkedArray)
        persons = pd.DataFrame({"GEOID": pd.Series(pd.arrays.ArrowStringArray(geoid), copy=False),
                                **{n: chunk.columns[n] for n in names}})
        part.add(chunk)
        keys = geoid_keys(geoid)
        in_geo.add(lookup.positions(geoid, keys) < 0, chunk)
        at = sp.block_index.positions(geoid, keys)  # the block's spine index, −1 if not a spine block
        known = at >= 0
        impossible = np.zeros(len(geoid), dtype=bool)
        if bm is not None and len(persons) and len(sp.block_geoids):
            code = pd.to_numeric(persons[STRUCTURAL_ATTRIBUTE], errors="coerce").fillna(0).to_numpy()
            code = np.clip(code.astype(np.int64), 0, 62)
            block = np.maximum(at, 0)
            impossible = known & (((bm[block] >> code) & 1) == 0)
            structural.add(impossible, chunk)
        counts = pc.value_counts(pc.utf8_slice_codeunits(geoid, 0, 2))
        for k, v in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(), strict=True):
            states[str(k)] = states.get(str(k), 0) + int(v)
        rows += len(persons)
        # the product's own tabulation check (block_histogram: blocks of the spine, codes, structural zeros) can
        # only fail on a batch where one of these vectorised masks does: only such a batch is handed to it, for
        # its authoritative error (it sorts the spine's blocks on every call)
        suspect = not known.all() or impossible.any() or any(
            persons[a].dtype.kind not in "iub" or bool(((persons[a] < 0) | (persons[a] >= d)).any())
            for a, d in schema.attributes)
        if suspect and not own_error:
            try:
                shifted(lambda p=persons: block_histogram(  # type: ignore[misc]
                    sp, p, schema, source=prefix, structural=None if bm is None else (STRUCTURAL_ATTRIBUTE, bm)),
                    chunk.offset)
            except InputError as exc:
                own_error.append(exc)
    facts = [in_geo.record(), fact("unique block GEOID", str(public.get("blocks_source", "<blocks>")), "GEOID",
                                   first_dup_mask(blocks))]
    kinds = getattr(config, "invariant_kinds", ("total",) if getattr(config, "total_invariant", False) else ())
    invariants = public.get("invariants") or {}
    facts.extend(_invariant_facts(invariants, kinds, rows, states, blocks))
    if bm is not None and rows:
        facts.append(structural.record())
    summary = {"rows": {prefix: rows}, "persons_per_state": {k: states[k] for k in sorted(states)}}

    def own() -> None:
        if own_error:
            raise own_error[0]

    return InputChecks(suites=[suite], facts=facts, summary=summary, own=own)


def _invariant_facts(invariants: Mapping[str, Any], kinds: Any, persons: int, states: Any,
                     blocks: Any) -> list[Any]:
    """The public invariants against the persons: the total, and each state's population (``states``: persons
    per state code) with the invariant's states equal to the block geography's."""
    facts = []
    total = invariants.get("total")
    if total is not None and "total" in kinds:
        facts.append(scalar_fact("persons = public population invariant", "invariants.json", "total",
                                 int(total) == persons))
    state_inv = invariants.get("state")
    if isinstance(state_inv, dict) and "state" in kinds:
        geo_states = set(pd.Series(blocks).str[:2])
        facts.append(scalar_fact("invariant states = states of the block geography", "invariants.json", "state",
                                 set(map(str, state_inv)) == geo_states))
        for k, n in sorted(state_inv.items()):
            facts.append(scalar_fact(f"persons of state {k} = public state population invariant",
                                     "invariants.json", f"state.{k}", int(states.get(str(k), 0)) == n))
    return facts
