"""Unit tests of the building blocks: phase-0 preflight, domain frames (exact equivalence with row-level GX),
suites of every input, per-state partitions, output suites (confidential columns, integer counts, planned
VARIANCE), Data Docs and stored results."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.validation import gx
from dasflow.validation.domain import domain_frame
from dasflow.validation.outputs import validate_outputs
from dasflow.validation.preflight import _every_line_has, check_delimited
from dasflow.validation.result import ValidationResult
from dasflow.validation.wrap import store_results

COLS = ["A", "B", "C"]


def _file(tmp: Path, data: bytes) -> Path:
    p = tmp / "f.txt"
    p.write_bytes(data)
    return p


@pytest.mark.parametrize(("data", "row", "column", "what"), [
    (b"", 1, None, "empty file"),
    (b"A|B\n1|2\n", 1, "C", "column 3"),
    (b"A;B;C\n1;2;3\n", 1, "A", "wrong delimiter"),
    (b"A|B|C\n1|2|3\n1|2\n", 3, "C", "truncated"),
    (b"A|B|C\n1|2|3\n1|2|3|4\n", 3, "C", "4 fields"),
    (b"A|B|C\n1|2|3\n1|2|3|4\n1|2\n", 3, "C", "4 fields"),  # as many delimiters in all as a valid file
    (b"A|B|C\n1|2\n1|2|3|4\n1|2|3\n", 2, "C", "truncated"),
    (b"A|B|C\n1|2|3\n1|\xff|3\n", 3, "B", "UTF-8"),
    (b"A|B|C\n1|\"2|3\n", 2, "B", "quote"),
    (b"\xef\xbb\xbfA|B|C\n1|2|3\n", 1, None, "byte-order mark"),
    ("A|B|C\n1|2|3\n".encode("utf-16"), 1, None, "UTF-8"),
])
def test_preflight_names_row_and_column(tmp_path: Path, data: bytes, row: int, column: str | None,
                                        what: str) -> None:
    with pytest.raises(InputError, match=what) as info:
        check_delimited(_file(tmp_path, data), COLS, "|")
    assert (info.value.row, info.value.column) == (row, column)


def test_preflight_across_block_boundaries(tmp_path: Path) -> None:
    """Row numbers stay exact when a file spans many read blocks (tiny blocks force it)."""
    body = b"".join(b"%d|x|y\n" % i for i in range(500))
    bad = body + b"oops|x\n" + body
    with pytest.raises(InputError) as info:
        check_delimited(_file(tmp_path, b"A|B|C\n" + bad), COLS, "|", block=64)
    assert info.value.row == 502 and info.value.column == "C"
    assert check_delimited(_file(tmp_path, b"A|B|C\n" + body + b"\n"), COLS, "|", block=97)[2] == 500
    assert check_delimited(_file(tmp_path, b"A|B|C\n1|2|3"), COLS, "|")[2] == 1  # no final newline
    assert check_delimited(_file(tmp_path, b"A|B|C\n1|2|3\n\n1|2|3\r\n\r\n"), COLS, "|")[2] == 2  # blank lines


def test_every_line_has_its_delimiters_from_positions_alone() -> None:
    """The preflight's fast test: true exactly when every line holds k delimiters; a blank line, a line with
    one more beside one with one fewer (the right total), or no delimiter to count leave it to the count."""
    def lines(data: bytes) -> tuple[Any, ...]:
        arr = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(arr == 10)
        starts = np.concatenate([[0], ends[:-1] + 1])
        return arr, starts, ends, (ends - starts) == 0

    def has(data: bytes, k: int) -> bool:
        arr, starts, ends, blank = lines(data)
        return _every_line_has(arr, np.uint8(ord("|")), k, starts, ends, blank)

    assert has(b"1|2|3\n4|5|6\n", 2)
    assert not has(b"1|2|3|\n4|56\n", 2)
    assert not has(b"1|2\n4|5|6|7\n", 2)
    assert not has(b"1|2|3\n\n4|5|6\n", 2)
    assert not has(b"1|2|3\n4|5|6\n", 3)
    assert not has(b"123\n456\n", 0)


def test_domain_frame_is_exactly_equivalent_to_row_level_validation() -> None:
    """A membership rule fails on the distinct-value frame iff it fails on the full column (same unexpected
    values), for random columns with and without violations."""
    gen = np.random.default_rng(5)
    checks = [gx.Check("ExpectColumnValuesToBeBetween", {"column": "x", "min_value": 0, "max_value": 9}),
              gx.Check("ExpectColumnValuesToBeInSet", {"column": "y", "value_set": ["a", "b"]})]
    for trial in range(4):
        x = gen.integers(0, 10 + trial % 2, size=2000)
        y = gen.choice(["a", "b"] + (["c"] if trial >= 2 else []), size=2000)
        full = gx.validate("eq", checks, pd.DataFrame({"x": x, "y": y}))
        dom = gx.validate("eq", checks, domain_frame({"x": x, "y": y}))
        assert [r.success for r in full.rows] == [r.success for r in dom.rows]
        assert full.success == (x.max() <= 9 and set(y) <= {"a", "b"})


def test_validate_gives_the_summary_format_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """``gx.validate`` runs a suite with result format BASIC and re-runs a failing one with SUMMARY: its outcome
    (rows with unexpected counts and observed columns, the first failure's indexes and values) equals that of
    a SUMMARY-only run, for passing and failing suites of every expectation kind the suites use."""
    checks = [gx.Check("ExpectTableColumnsToMatchOrderedList", {"column_list": ["x", "y", "z"]}),
              gx.Check("ExpectColumnValuesToNotBeNull", {"column": "x"}),
              gx.Check("ExpectColumnValuesToBeBetween", {"column": "x", "min_value": 0, "max_value": 9}),
              gx.Check("ExpectColumnValuesToBeInSet", {"column": "y", "value_set": ["a", "b"]}),
              gx.Check("ExpectColumnValuesToMatchRegex", {"column": "z", "regex": "^[0-9]+$"}),
              gx.Check("ExpectColumnValuesToBeOfType", {"column": "x", "type_": "int64"})]
    good = pd.DataFrame({"x": [1, 2, 3], "y": ["a", "b", "a"], "z": ["1", "22", "3"]})
    bad = good.assign(y=["a", "c", "a"], z=["1", "2", "x3"])
    seen: list[str] = []
    state = gx._context()
    real = state["bd"]

    class Recorded:  # the batch definition, recording the result formats asked for
        def __init__(self, only: str | None) -> None:
            self.only = only

        def get_batch(self, batch_parameters: dict[str, object]) -> object:
            batch = real.get_batch(batch_parameters=batch_parameters)
            only = self.only

            class Batch:
                def validate(self, suite: object, result_format: str) -> object:
                    seen.append(result_format)
                    return batch.validate(suite, result_format=only or result_format)
            return Batch()

    for frame, formats in ((good, ["BASIC"]), (bad, ["BASIC", "SUMMARY"])):
        monkeypatch.setitem(state, "bd", Recorded(None))
        seen.clear()
        out = gx.validate("formats", checks, frame)
        assert seen == formats
        monkeypatch.setitem(state, "bd", Recorded("SUMMARY"))
        assert out == gx.validate("formats", checks, frame)
    assert out.first_failure is not None and out.first_failure[1] == [1] and out.first_failure[2] == ["c"]
    assert [r.unexpected for r in out.rows if r.column == "z"] == [1]


def _frames() -> dict[str, pd.DataFrame]:
    return {"groupsize/groupsize_state.csv": pd.DataFrame({"STATE": ["10", "10"], "HOUSEHOLD_SIZE": ["1", "2+"],
                                                           "COUNT": ["4", "-1"]}),
            "phsafe/PH2.csv": pd.DataFrame({"REGION_ID": ["1"], "REGION_TYPE": ["USA"], "PH2_DATA_CELL": ["1"],
                                            "NOISE_DISTRIBUTION": ["Gaussian"], "VARIANCE": ["2.5"],
                                            "COUNT": ["7"]})}


PLAN = {"entries": [{"product": "phsafe", "variance": "5/2"}, {"product": "groupsize", "variance": "3"}]}


def test_output_suites_accept_a_consistent_release() -> None:
    result = validate_outputs(_frames(), PLAN)
    assert result.success, result.error
    assert result.summary["files"] == {"groupsize/groupsize_state.csv": 2, "phsafe/PH2.csv": 1}


def test_output_suites_reject_confidential_columns_counts_and_variance() -> None:
    frames = _frames()
    frames["groupsize/groupsize_state.csv"]["MAFID"] = "123456789"
    r = validate_outputs(frames, PLAN)
    assert not r.success and r.error is not None and r.error.column == "MAFID"
    frames = _frames()
    frames["groupsize/groupsize_state.csv"].loc[1, "COUNT"] = "2.5"
    r = validate_outputs(frames, PLAN)
    assert r.error is not None and (r.error.column, r.error.row) == ("COUNT", 3)
    frames = _frames()
    frames["phsafe/PH2.csv"].loc[0, "VARIANCE"] = "2.4"
    r = validate_outputs(frames, PLAN)
    assert r.error is not None and r.error.column == "VARIANCE" and "not a planned variance" in str(r.error)


def test_a_missing_value_in_a_release_table_names_its_row_and_column(tmp_path: Path) -> None:
    """NaN in a table written from memory, or an empty field in a release file, fails the not-null expectation
    (as text, NaN would read "nan" and pass)."""
    frames = _frames()
    frames["groupsize/groupsize_state.csv"].loc[1, "STATE"] = np.nan
    r = validate_outputs(frames, PLAN)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == \
        ("groupsize/groupsize_state.csv", 3, "STATE"), r.error
    root = tmp_path / "release"
    for rel, frame in _frames().items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        frame.to_csv(root / rel, sep="|", index=False)
    assert validate_outputs(root, PLAN).success
    text = (root / "phsafe/PH2.csv").read_text().replace("|Gaussian|", "||")
    (root / "phsafe/PH2.csv").write_text(text)
    r = validate_outputs(root, PLAN)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == \
        ("phsafe/PH2.csv", 2, "NOISE_DISTRIBUTION"), r.error


def test_results_and_data_docs_are_stored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    r = ValidationResult("phsafe", False, {"rows": {"persons.csv": 3}}, error=InputError("bad", file="persons.csv",
                                                                                         row=4, column="QAGE"))
    from dasflow.validation.report import render_html

    r.html = render_html(r)
    keys = store_results(store, "runs/x", "phsafe", r)
    assert set(keys) == {"runs/x/validation/phsafe.gx.json", "runs/x/validation/phsafe.html"}
    doc = json.loads(store.get("runs/x/validation/phsafe.gx.json"))
    assert doc["passed"] is False and doc["error"] == {"message": "file persons.csv, row 4, column QAGE: bad",
                                                       "file": "persons.csv", "row": 4, "column": "QAGE"}
    page = store.get("runs/x/validation/phsafe.html").decode()
    assert "FAILED" in page and "QAGE" in page and page.startswith("<!doctype html>")
    with pytest.raises(InputError):
        r.raise_for_failure()


def _groupsize_release() -> dict[str, pd.DataFrame]:
    sizes = ["1", "2", "3+"]
    county = pd.DataFrame({"STATE": ["10"] * 6 + ["11"] * 3, "COUNTY": ["001"] * 3 + ["003"] * 3 + ["001"] * 3,
                           "HOUSEHOLD_SIZE": sizes * 3, "COUNT": ["1", "2", "0", "3", "0", "4", "5", "5", "5"]})
    state = pd.DataFrame({"STATE": ["10"] * 3 + ["11"] * 3, "HOUSEHOLD_SIZE": sizes * 2,
                          "COUNT": ["4", "2", "4", "5", "5", "5"]})
    nation = pd.DataFrame({"STATE": ["US"] * 3, "HOUSEHOLD_SIZE": sizes, "COUNT": ["9", "7", "9"]})
    return {"groupsize/groupsize_county.csv": county, "groupsize/groupsize_state.csv": state,
            "groupsize/groupsize_nation.csv": nation}


def test_groupsize_release_consistency_is_checked() -> None:
    """hierarchical-groupsize.md H3/C4: parent = sum of children for every size; counts non-negative."""
    plan: dict[str, list[dict[str, str]]] = {"entries": []}
    assert validate_outputs(_groupsize_release(), plan).success
    frames = _groupsize_release()
    frames["groupsize/groupsize_state.csv"].loc[4, "COUNT"] = "6"
    r = validate_outputs(frames, plan)
    assert r.error is not None and "inconsistent" in str(r.error)
    assert (r.error.file, r.error.row, r.error.column) == ("groupsize/groupsize_state.csv", 6, "COUNT")
    frames = _groupsize_release()
    frames["groupsize/groupsize_county.csv"].loc[2, "COUNT"] = "-1"
    r = validate_outputs(frames, plan)
    assert r.error is not None and (r.error.row, r.error.column) == (4, "COUNT") and "non-negative" in str(r.error)


def test_output_files_with_one_schema_are_checked_together_and_failures_still_name_their_file() -> None:
    """Files of one product with the same columns share one GX run on their distinct values: a passing group
    reports, per file, exactly what a run on that file alone reports; a failing one names its file and row."""
    def frames() -> dict[str, pd.DataFrame]:
        return {f"other/{name}.csv": pd.DataFrame({"GEO": [f"{name}1", f"{name}2", "x"], "COUNT": ["1", "-2", "3"]})
                for name in ("a", "b", "c")}

    plan: dict[str, list[dict[str, str]]] = {"entries": []}
    together = validate_outputs(frames(), plan)
    assert together.success
    alone = [row for rel, frame in sorted(frames().items()) for row in validate_outputs({rel: frame}, plan).rows]
    assert together.rows == alone and len(alone) == 9
    bad = frames()
    bad["other/b.csv"].loc[2, "COUNT"] = "3.5"
    r = validate_outputs(bad, plan)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == ("other/b.csv", 4, "COUNT")
    failed = [(row.suite, row.column) for row in r.rows if not row.success]
    assert failed == [("other/b.csv", "COUNT")]


def test_gx_validations_from_several_threads_each_see_their_own_frame() -> None:
    """Products validated side by side share one GX context, whose batch definition takes the frame as a batch
    parameter: each validation holds the context's lock, so every thread's outcome is its own frame's (a
    failing frame in one thread never passes, a passing one in another never fails), as run one at a time."""
    checks = [gx.Check("ExpectColumnValuesToBeBetween", {"column": "x", "min_value": 0, "max_value": 9})]
    good = pd.DataFrame({"x": list(range(10)) * 500})
    bad = pd.DataFrame({"x": [0] * 4999 + [99]})
    warm = gx.warm_up()  # the first validations wait for the context the warm-up creates: one context
    outcomes: dict[int, list[bool]] = {}

    def run(i: int) -> None:
        frame = bad if i % 2 else good
        outcomes[i] = [gx.validate(f"threads.{i % 2}", checks, frame).success for _ in range(3)]

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    warm.join()
    assert outcomes == {0: [True] * 3, 1: [False] * 3, 2: [True] * 3, 3: [False] * 3}
    context = gx._context()["ctx"]
    gx.warm_up().join()
    assert gx._context()["ctx"] is context  # a later warm-up keeps the process's one context


def test_a_failed_warm_up_is_silent_and_the_first_validation_creates_the_context(
        monkeypatch: pytest.MonkeyPatch) -> None:
    raised: list[object] = []
    monkeypatch.setattr(threading, "excepthook", raised.append)  # an uncaught thread error would land here
    monkeypatch.setattr(gx, "_STATE", {})
    real = gx._create

    def broken() -> None:
        raise ImportError("concurrent import")

    monkeypatch.setattr(gx, "_create", broken)
    gx.warm_up().join()
    assert raised == [] and gx._STATE == {}
    monkeypatch.setattr(gx, "_create", real)
    checks = [gx.Check("ExpectColumnValuesToBeBetween", {"column": "x", "min_value": 0, "max_value": 9})]
    assert gx.validate("warm", checks, pd.DataFrame({"x": [1, 2]})).success
