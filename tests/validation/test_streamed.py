"""Issue #20: input validation streamed by partition and chunk gives the verdict, summary, report and first error
of validating each input whole (every corpus case, chunks of a few rows), with errors naming the file and its own
row; chunk-boundary cases (a duplicate key split across chunks, a bad value in a chunk's last row); the
streaming building blocks."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.registry import get_plugin
from dasflow.validation import gx, run_product_suite, run_streamed_suite
from dasflow.validation.domain import domain_frame
from dasflow.validation.result import ValidationResult
from dasflow.validation.stream import Chunk, KeySet, RowFact, StreamedSuite, line_chunks, range_only, row_chunks
from dasflow.validation.suites import between, cols, in_set
from tests.validation.helpers import CASES, CONFIG_FILES, INPUTS, _config_text, corpus_store

STREAMED = ["phsafe", "safetab-p", "groupsize"]


def _whole(store: LocalStore, product: str) -> ValidationResult | InputError:
    """Today's path: the confidential inputs read whole (a reader error raised there), then the suites."""
    plugin = get_plugin(product)
    cfg = plugin.load_config(_config_text(CONFIG_FILES[product]), "US")
    pub = plugin.public_inputs(store, INPUTS, cfg)
    try:
        conf = plugin.confidential_inputs(store, INPUTS, cfg)
    except InputError as exc:
        return exc
    return run_product_suite(plugin, conf, pub, cfg)


def _streamed(store: LocalStore, product: str, chunk_rows: int) -> ValidationResult:
    plugin = get_plugin(product)
    cfg = plugin.load_config(_config_text(CONFIG_FILES[product]), "US")
    return run_streamed_suite(plugin, store, INPUTS, plugin.public_inputs(store, INPUTS, cfg), cfg, chunk_rows)


def _same(whole: ValidationResult | InputError, streamed: ValidationResult) -> None:
    if isinstance(whole, InputError):  # a reader error: the same error, now recorded in the result
        assert streamed.error is not None and not streamed.success
        assert (streamed.error.file, streamed.error.row, streamed.error.column, str(streamed.error)) == \
            (whole.file, whole.row, whole.column, str(whole))
        return
    assert streamed.success == whole.success
    assert streamed.to_json() == whole.to_json()
    assert streamed.html == whole.html


def _preflight_passes(store: LocalStore, product: str) -> bool:
    try:
        get_plugin(product).preflight(store, INPUTS, public=True)
        get_plugin(product).preflight(store, INPUTS, public=False)
        get_plugin(product).public_inputs(store, INPUTS, get_plugin(product).load_config(
            _config_text(CONFIG_FILES[product]), "US"))
    except InputError:
        return False
    return True


@pytest.mark.parametrize("case", [None, *sorted(c for c, s in CASES.items() if s["product"] in STREAMED)])
def test_streamed_validation_equals_whole_input_validation(tmp_path: Path, case: str | None) -> None:
    """Every corpus case (and the valid base) of the streamed products: same verdict, same JSON result and HTML
    page (errors, facts, counts, expectation rows) at chunk sizes 2 and one chunk per file."""
    store = corpus_store(tmp_path / "store", case)
    products = [CASES[case]["product"]] if case else STREAMED
    for product in products:
        if not _preflight_passes(store, product):  # phase 0 runs before either path (validate_stage)
            continue
        whole = _whole(store, product)
        for chunk_rows in (2, 10**6):
            _same(whole, _streamed(store, product, chunk_rows))


def _units_lines(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_phsafe_duplicate_mafid_split_across_chunks_and_bad_value_in_last_row_of_a_chunk(tmp_path: Path) -> None:
    """A unit MAFID repeated 9 rows later is found with chunks of 4 rows (the copy in another chunk), named by
    the file's own row; a bad value in the last row of a chunk is located in the file, not in the chunk."""
    store = corpus_store(tmp_path / "store")
    units = tmp_path / "store" / INPUTS["phsafe"] / "units.csv"
    lines = _units_lines(units)
    first = lines[1].split(lines[0][5] if "|" not in lines[0] else "|")
    sep = "|" if "|" in lines[0] else ","
    dup = lines[10].split(sep)
    dup[1] = first[1]  # data row 10 (file row 11) repeats data row 1's MAFID
    lines[10] = sep.join(dup)
    units.write_text("".join(lines))
    whole = _whole(store, "phsafe")
    for chunk_rows in (4, 3):
        r = _streamed(store, "phsafe", chunk_rows)
        assert not r.success and r.error is not None
        assert (r.error.file, r.error.row, r.error.column) == ("units.csv", 11, "MAFID")
        _same(whole, r)
    shutil.copytree(tmp_path / "store", tmp_path / "store2")
    store2 = LocalStore(tmp_path / "store2")
    persons = tmp_path / "store2" / INPUTS["phsafe"] / "persons.csv"
    lines = _units_lines(persons)
    sep = "|" if "|" in lines[0] else ","
    bad = lines[8].split(sep)  # data row 8: the last row of the 2nd chunk of 4
    bad[4] = "64"  # CENRACE outside 01..63
    lines[8] = sep.join(bad)
    persons.write_text("".join(lines))
    r = _streamed(store2, "phsafe", 4)
    assert r.error is not None and r.error.file is not None
    assert (Path(r.error.file).name, r.error.row, r.error.column) == ("persons.csv", 9, "CENRACE")
    assert str(_whole(store2, "phsafe")) == str(r.error)


def test_phsafe_duplicate_geo_mafids_are_found_by_the_sorted_geo(tmp_path: Path) -> None:
    """geo.csv's own duplicates come from the one stable sort of its MAFIDs (no hash table): a MAFID repeated on
    two later rows counts twice and names the first repeat's row, as the whole-input path does; with the repeat
    both a unit without geography and a duplicate exist, and the first failed rule in order is the error."""
    store = corpus_store(tmp_path / "store")
    geo = tmp_path / "store" / INPUTS["phsafe_geo"] / "geo.csv"
    lines = _units_lines(geo)
    sep = "|" if "|" in lines[0] else ","
    mafid = lines[2].split(sep)[1]
    for row in (6, 9):  # data rows 6 and 9 (file rows 7 and 10) repeat data row 2's MAFID
        cells = lines[row].split(sep)
        cells[1] = mafid
        lines[row] = sep.join(cells)
    geo.write_text("".join(lines))
    whole = _whole(store, "phsafe")
    assert not isinstance(whole, InputError) and not whole.success
    for chunk_rows in (2, 10**6):
        r = _streamed(store, "phsafe", chunk_rows)
        _same(whole, r)
        dup = next(f for f in r.summary["cross_file"] if f["rule"] == "unique MAFID" and f["file"] == "geo.csv")
        assert (int(dup["violations"]), int(dup["first_row"])) == (2, 7)


def test_safetab_bad_value_in_the_last_row_of_a_chunk_names_the_file_row(tmp_path: Path) -> None:
    store = corpus_store(tmp_path / "store")
    path = tmp_path / "store" / INPUTS["safetab-p"] / "person-records.txt"
    lines = _units_lines(path)
    cells = lines[6].split("|")
    cells[1] = "3"  # QSEX
    lines[6] = "|".join(cells)
    path.write_text("".join(lines))
    whole = _whole(store, "safetab-p")
    for chunk_rows in (3, 6, 5):
        r = _streamed(store, "safetab-p", chunk_rows)
        assert r.error is not None and (r.error.row, r.error.column) == (7, "QSEX"), r.error
        _same(whole, r)


def test_line_chunks_cut_at_newlines_with_file_rows(tmp_path: Path) -> None:
    p = tmp_path / "f.csv"
    p.write_bytes(b"A|B\n" + b"".join(b"%d|x\n" % i for i in range(10)))
    runs = list(line_chunks(p, 3, block_bytes=5))
    assert [o for o, _, _ in runs] == [0, 3, 6, 9]
    assert all(h == b"A|B\n" for _, h, _ in runs)
    assert b"".join(d for _, _, d in runs) == p.read_bytes()[4:]
    p.write_bytes(b"A|B\n1|x\n\n2|y")  # a blank line is not a row; a last line without newline is
    assert [(o, d) for o, _, d in line_chunks(p, 1)] == [(0, b"1|x\n"), (1, b"\n"), (1, b"2|y")]
    p.write_bytes(b"A|B\n")
    assert list(line_chunks(p, 2)) == [(0, b"A|B\n", b"")]


def test_keyset_first_seen_equals_duplicated_over_the_whole_column() -> None:
    rng = np.random.default_rng(1)
    keys = rng.integers(0, 500, 3000)
    ks = KeySet()
    dup = np.concatenate([ks.first_seen(keys[i:i + 37]) for i in range(0, keys.size, 37)])
    assert np.array_equal(dup, pd.Series(keys).duplicated().to_numpy())
    assert np.array_equal(ks.contains(np.arange(600)), np.isin(np.arange(600), keys))
    assert len(ks) == keys.size


def test_rowfact_counts_every_violation_and_names_the_first_global_row() -> None:
    f = RowFact("rule", "f.csv", "X")
    for chunk in row_chunks("f.csv", {"X": np.array([0, 0, 0, 0, 1, 0, 1])}, 3):
        f.add(np.asarray(chunk.columns["X"]) == 1, chunk)
    assert f.record() == {"rule": "rule", "file": "f.csv", "column": "X", "violations": 2, "first_row": 6}


def test_streamed_suite_domain_equals_the_whole_columns_domain() -> None:
    """Folding the chunks' domain parts gives the frame of the whole columns (order of first appearance, min
    and max of range-only columns), so GX sees exactly what it saw on the whole input."""
    rng = np.random.default_rng(2)
    x = rng.integers(1, 30, 1000)
    y = pa.chunked_array([pa.array([str(v) for v in rng.integers(0, 9, 1000)])])
    m = rng.integers(100_000_000, 900_000_000, 1000)
    checks = [*cols(["X", "Y", "M"]), between("X", 1, 29), in_set("Y", [str(i) for i in range(9)]),
              between("M", 100_000_000, 900_000_000)]
    suite = StreamedSuite("t", checks)
    whole = {"X": x, "Y": y, "M": m}
    part = suite.part("f", lambda: row_chunks("f", whole, 64))
    for chunk in row_chunks("f", whole, 64):
        part.add(chunk)
    assert range_only(checks) == {"X", "M"}  # range checks only: their min and max decide them
    expected = domain_frame(whole, extremes_only={"X", "M"})
    assert part.frame().equals(expected) and suite.union().equals(expected)
    assert list(expected["Y"]) == list(pd.unique(np.asarray(y)))  # distinct values in order of first appearance
    assert gx.validate("t", checks, part.frame()).success


def test_chunk_rows_is_an_execution_setting() -> None:
    """``validation_chunk_rows`` does not change the release's identity (same verdict at any size)."""
    from dasflow.config import parse_release_config

    raw: dict[str, Any] = {"release_id": "r", "universe": "US", "products": [{"name": "phsafe", "config_text": "{}"}],
                           "cap": {"rho": "1"}, "rng": {"mode": "test", "seed": 1}}
    a = parse_release_config(raw, source="a")
    b = parse_release_config({**raw, "validation_chunk_rows": 5}, source="b")
    assert b.validation_chunk_rows == 5 and a.sha256() == b.sha256()
    with pytest.raises(InputError):
        parse_release_config({**raw, "validation_chunk_rows": 0}, source="c")


def test_chunk_is_typed() -> None:
    c = Chunk("f", 3, {"a": np.arange(4)})
    assert c.rows == 4


def _split_persons(root: Path, parts: int) -> None:
    """The corpus's person-records.txt as a split input of ``parts`` files (person-records/NN.txt)."""
    path = root / INPUTS["safetab-p"] / "person-records.txt"
    lines = path.read_text().splitlines(keepends=True)
    folder = path.parent / "person-records"
    folder.mkdir()
    body = lines[1:]
    step = -(-len(body) // parts)
    for i in range(parts):
        (folder / f"{i:02d}.txt").write_text(lines[0] + "".join(body[i * step:(i + 1) * step]))
    path.unlink()


def test_safetab_split_input_one_gx_run_gives_the_per_file_report(tmp_path: Path) -> None:
    """A split input (3 files): the persons suite validated once on the union of the files' domains gives the
    per-file rows of validating each file whole; a bad value in the second file is named in that file."""
    store = corpus_store(tmp_path / "store")
    _split_persons(tmp_path / "store", 3)
    whole = _whole(store, "safetab-p")
    assert isinstance(whole, ValidationResult) and whole.success
    assert sum(r.suite == "safetab_p.persons" for r in whole.rows) == 3 * len({(r.expectation, r.column)
                                                                              for r in whole.rows
                                                                              if r.suite == "safetab_p.persons"})
    for chunk_rows in (4, 10**6):
        _same(whole, _streamed(store, "safetab-p", chunk_rows))
    second = sorted((tmp_path / "store" / INPUTS["safetab-p"] / "person-records").glob("*.txt"))[1]
    lines = second.read_text().splitlines(keepends=True)
    cells = lines[5].split("|")
    cells[6] = "12a4"  # TABBLK: not 4 digits (the GX regex and the product's own check)
    lines[5] = "|".join(cells)
    second.write_text("".join(lines))
    whole = _whole(store, "safetab-p")
    r = _streamed(store, "safetab-p", 4)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == \
        ("person-records/01.txt", 6, "TABBLK")
    _same(whole, r)


def _topdown(tmp: Path) -> tuple[LocalStore, dict[str, Any]]:
    from tests.dag.helpers import topdown_release

    raw = topdown_release(tmp, "td", states=["10"], persons=1500, synth_seed=4)
    return LocalStore(tmp / "store"), raw


def _topdown_results(store: LocalStore, raw: dict[str, Any], chunk_rows: int) -> tuple[Any, ValidationResult]:
    plugin = get_plugin("topdown")
    text = next(p["config_text"] for p in raw["products"] if p["name"] == "topdown")
    cfg = plugin.load_config(text, "US")
    inputs = raw["inputs"]
    pub = plugin.public_inputs(store, inputs, cfg)
    try:
        whole: Any = run_product_suite(plugin, plugin.confidential_inputs(store, inputs, cfg), pub, cfg)
    except InputError as exc:
        whole = exc
    return whole, run_streamed_suite(plugin, store, inputs, pub, cfg, chunk_rows)


def _rewrite_person_file(store: LocalStore, edit: Any) -> None:
    import io

    key = next(k for k in store.list("confidential/synth/topdown/persons/") if k.endswith(".parquet"))
    frame = pd.read_parquet(io.BytesIO(store.get(key)))
    edit(frame)
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False)
    store.put(key, buf.getvalue())


def test_topdown_streamed_equals_whole_input(tmp_path: Path) -> None:
    """TopDown persons in Parquet batches: valid input, a block outside the GRF-C in a batch's last row, an
    attribute code out of range: same verdict, JSON result and HTML page, errors at the concatenated input's row."""
    store, raw = _topdown(tmp_path)
    for chunk_rows in (7, 10**6):
        whole, streamed = _topdown_results(store, raw, chunk_rows)
        assert streamed.success
        _same(whole, streamed)

    def block(frame: pd.DataFrame) -> None:
        frame.loc[13, "TABBLK"] = 9999 if frame["TABBLK"].dtype.kind in "iu" else "9999"  # last row of chunk 2

    _rewrite_person_file(store, block)
    whole, streamed = _topdown_results(store, raw, 7)
    assert streamed.error is not None and (streamed.error.row, streamed.error.column) == (15, "GEOID")
    _same(whole, streamed)

    def code(frame: pd.DataFrame) -> None:
        frame.loc[13, "TABBLK"] = frame.loc[12, "TABBLK"]
        frame.loc[20, "CENRACE"] = 63

    _rewrite_person_file(store, code)
    whole, streamed = _topdown_results(store, raw, 7)
    assert streamed.error is not None and (streamed.error.row, streamed.error.column) == (22, "CENRACE")
    _same(whole, streamed)

    def codes(frame: pd.DataFrame) -> None:  # block codes that zfill does not simply left-pad, in chunk 2
        frame.loc[20, "CENRACE"] = frame.loc[19, "CENRACE"]
        frame.loc[9, "TABBLKCOU"] = -5  # "-05"
        frame.loc[11, "TABTRACTCE"] = 1234567  # seven digits

    _rewrite_person_file(store, codes)
    whole, streamed = _topdown_results(store, raw, 7)
    assert streamed.error is not None and (streamed.error.row, streamed.error.column) == (11, "GEOID")
    _same(whole, streamed)


def test_person_geoid_is_the_readers_zfill_join() -> None:
    """The validation's person GEOIDs equal the reader's zfill-and-join for in-range codes (Arrow left pad) and
    for any other chunk (negative, over-wide, missing or text codes: pandas' zfill itself)."""
    from dasflow.products.topdown.checks import GEO_WIDTHS, PERSON_GEO, person_geoid

    def zfill(codes: dict[str, Any]) -> list[str]:
        parts = [pd.Series(codes[c]).astype(str).str.zfill(w) for c, w in zip(PERSON_GEO, GEO_WIDTHS, strict=True)]
        return [None if v is None or v != v else v for v in parts[0] + parts[1] + parts[2] + parts[3]]  # NaN: null

    rng = np.random.default_rng(9)
    codes: dict[str, Any] = {c: rng.integers(0, 10**w, 40).astype(t)
                             for (c, w), t in zip(zip(PERSON_GEO, GEO_WIDTHS, strict=True),
                                                  (np.int8, np.int16, np.int64, np.uint16), strict=True)}
    codes["TABBLK"][:3] = [0, 9999, 7]
    assert person_geoid(codes).to_pylist() == zfill(codes)
    for column, value in (("TABBLKCOU", -5), ("TABTRACTCE", 1234567), ("TABBLKST", np.nan), ("TABBLK", "12a4")):
        odd = dict(codes)
        odd[column] = codes[column].astype(object if isinstance(value, str) else np.float64 if value != value
                                           else np.int64)
        odd[column][4] = value
        got = person_geoid(odd)
        assert got.type == pa.string() and got.to_pylist() == zfill(odd), column
    # the reader's Arrow tables (preprocessing: plugin._persons) take the same function: chunked, with a null
    table = pa.Table.from_batches([pa.record_batch({c: codes[c][:20] for c in PERSON_GEO}),
                                   pa.record_batch({c: codes[c][20:] for c in PERSON_GEO})])
    assert person_geoid(table).to_pylist() == zfill(codes)
    nulls = table.set_column(0, "TABBLKST", pa.chunked_array([pa.array([None, *codes["TABBLKST"][1:].tolist()],
                                                                       pa.int8())]))
    got = person_geoid(nulls).to_pylist()  # a null code: the numpy column's zfill, as the streamed chunks had it
    assert got[0] is None and got == zfill({c: np.asarray(nulls[c]) for c in PERSON_GEO})
    # text codes (the synthetic census stores the state as text): digit strings within the width are a left pad
    # in Arrow — as Arrow strings, large strings or numpy text — and any other text is pandas' zfill
    state = np.array(["01", "6", "", "44", *(f"{v:02d}" for v in codes["TABBLKST"][4:])], dtype=object)
    digits = {**codes, "TABBLKST": state}
    assert person_geoid(digits).to_pylist() == zfill(digits)
    assert person_geoid({**digits, "TABBLKST": state.astype(str)}).to_pylist() == zfill(digits)
    for kind in (pa.string(), pa.large_string()):
        text = table.set_column(0, "TABBLKST", pa.chunked_array([pa.array(state[:20].tolist(), kind),
                                                                 pa.array(state[20:].tolist(), kind)]))
        assert person_geoid(text).to_pylist() == zfill(digits), kind
    for bad in ("-1", "123", "1a", "٣"):  # a sign, over-wide, not a digit, a non-ASCII digit
        odd = {**digits, "TABBLKST": state.copy()}
        odd["TABBLKST"][5] = bad
        assert person_geoid(odd).to_pylist() == zfill(odd), bad
    none = {**digits, "TABBLKST": state.copy()}
    none["TABBLKST"][2] = None
    assert person_geoid(none).to_pylist() == zfill(none)


def test_person_geoid_of_digit_text_creates_no_python_string_per_person(monkeypatch: pytest.MonkeyPatch) -> None:
    """Digit-string state codes (the synthetic census's TABBLKST) take the Arrow path: pandas' per-object
    ``zfill`` is never called for them (it is for text that is not digits within the width)."""
    from dasflow.products.topdown import checks

    table = pa.table({"TABBLKST": pa.array(["01", "44", "6"]), "TABBLKCOU": pa.array([1, 5, 99], pa.int16()),
                      "TABTRACTCE": pa.array([100, 20101, 5], pa.int32()),
                      "TABBLK": pa.array([1001, 7, 0], pa.int16())})

    def fallback(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pandas fallback used")

    monkeypatch.setattr(checks.pd, "Series", fallback)
    assert checks.person_geoid(table).to_pylist() == ["010010001001001", "440050201010007", "060990000050000"]
    with pytest.raises(AssertionError, match="fallback"):
        checks.person_geoid(table.set_column(0, "TABBLKST", pa.array(["01", "4x", "6"])))


def test_matrix_streamed_equals_whole_input(tmp_path: Path) -> None:
    """The matrix product's records (the TopDown persons files) in batches: same result; a code out of its domain
    in a batch's last row is named at the concatenated input's row."""
    store, _ = _topdown(tmp_path)
    plugin = get_plugin("matrix")
    cfg = plugin.load_config(_config_text("matrix-config.json"), "US")
    inputs = {"matrix": "confidential/synth/topdown/persons/"}

    def both(chunk_rows: int) -> tuple[Any, ValidationResult]:
        whole = run_product_suite(plugin, plugin.confidential_inputs(store, inputs, cfg), {}, cfg)
        return whole, run_streamed_suite(plugin, store, inputs, {}, cfg, chunk_rows)

    for chunk_rows in (7, 10**6):
        whole, streamed = both(chunk_rows)
        assert streamed.success and streamed.summary["records"] > 0
        _same(whole, streamed)

    def code(frame: pd.DataFrame) -> None:
        frame.loc[13, "CENRACE"] = 99

    _rewrite_person_file(store, code)
    whole, streamed = both(7)
    assert streamed.error is not None and (streamed.error.row, streamed.error.column) == (15, "CENRACE")
    _same(whole, streamed)


def test_phsafe_state_folders_pass_alike_and_errors_name_the_state_file(tmp_path: Path) -> None:
    """PHSafe's state-folder layout: a valid input gives the whole-input path's result; a duplicate unit MAFID in
    the state's units.csv is named in that file (``10/units.csv``) and its own row."""
    store = corpus_store(tmp_path / "store")
    folder = tmp_path / "store" / INPUTS["phsafe"]
    (folder / "10").mkdir()
    for name in ("persons.csv", "units.csv"):
        (folder / name).rename(folder / "10" / name)
    _same(_whole(store, "phsafe"), _streamed(store, "phsafe", 5))
    units = folder / "10" / "units.csv"
    lines = _units_lines(units)
    sep = "|" if "|" in lines[0] else ","
    dup = lines[12].split(sep)
    dup[1] = lines[2].split(sep)[1]
    lines[12] = sep.join(dup)
    units.write_text("".join(lines))
    r = _streamed(store, "phsafe", 5)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == ("10/units.csv", 13, "MAFID")
    assert str(r.error).endswith("duplicate MAFID")


def test_safetab_split_input_with_a_header_only_file(tmp_path: Path) -> None:
    """A split input one of whose files has no person (header only) validates as the whole-input path does."""
    store = corpus_store(tmp_path / "store")
    _split_persons(tmp_path / "store", 2)
    folder = tmp_path / "store" / INPUTS["safetab-p"] / "person-records"
    header = (folder / "00.txt").read_text().splitlines(keepends=True)[0]
    (folder / "02.txt").write_text(header)
    whole = _whole(store, "safetab-p")
    assert isinstance(whole, ValidationResult) and whole.success
    _same(whole, _streamed(store, "safetab-p", 3))
