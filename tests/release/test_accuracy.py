"""The accuracy report (issue 12 item 3): expected MOEs from the plan, observed error against the ground truth by
population size (test releases only), group-size/TopDown consistency diagnostics, and a self-contained HTML
page that opens in headless Chromium with every plot rendered."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from xml.etree import ElementTree

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from PIL import Image as PILImage

from dasflow.errors import IntegrityError
from dasflow.io.store import LocalStore
from dasflow.pipeline.run import RunContext
from dasflow.privacy import accounting
from dasflow.products.groupsize.reporting import groupsize_consistency
from dasflow.products.topdown.reporting import topdown_consistency
from dasflow.release import accuracy
from dasflow.release.accuracy import (
    TruthRefused,
    accuracy_report,
    compare,
    error_by_size,
    expected_moes,
    hierarchy_check,
    truth_frames,
)
from tests.release.helpers import give_counts_truth, released_context

CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--host-resolver-rules=MAP * ~NOTFOUND")


@pytest.fixture
def test_release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> RunContext:
    give_counts_truth(monkeypatch)
    return released_context(tmp_path)


def test_expected_moes_come_from_the_plan_via_accounting(test_release: RunContext) -> None:
    moes = expected_moes(test_release)
    assert list(moes["key"]) == ["counts/state", "counts/state_sex"]
    assert list(moes["moe90"]) == [accounting.dgauss_moe_exact(Fraction(1), Fraction(9, 10)),
                                   accounting.dgauss_moe_exact(Fraction(2), Fraction(9, 10))]
    assert list(moes["moe95"]) == [accounting.dgauss_moe_exact(Fraction(1), Fraction(19, 20)),
                                   accounting.dgauss_moe_exact(Fraction(2), Fraction(19, 20))]


def test_compare_and_error_by_size() -> None:
    released = pd.DataFrame({"G": ["a", "b", "c", "d"], "VARIANCE": [4.0] * 4, "COUNT": ["3", "9", "150", "-2"]})
    truth = pd.DataFrame({"G": ["a", "b", "c", "d"], "COUNT": [0, 5, 100, 0]})
    cells = compare(released, truth)
    assert list(cells["ERROR"]) == [3, 4, 50, -2]
    table = error_by_size(cells).set_index("size")
    assert table.loc["0", "cells"] == 2 and table.loc["0", "mean_error"] == 0.5
    assert table.loc["0", "rmse"] == pytest.approx(np.sqrt((9 + 4) / 2))
    assert table.loc["0", "within_moe90"] == 1.0  # |3|, |2| <= 1.645·2
    assert table.loc["1–9", "within_moe90"] == 0.0
    assert table.loc["100–999", "mae"] == 50


def test_hierarchy_check_counts_inconsistent_cells() -> None:
    parent = pd.DataFrame({"STATE": ["01", "01", "02"], "SIZE": ["1", "2", "1"], "COUNT": [5, 3, 4]})
    child = pd.DataFrame({"STATE": ["01", "01", "01", "02"], "SIZE": ["1", "1", "2", "1"], "COUNT": [2, 3, 4, 4]})
    cells, bad, worst = hierarchy_check(parent, child, ["STATE"], child[["STATE"]], ["SIZE"])
    assert (cells, bad, worst) == (3, 1, 1.0)


def test_topdown_and_groupsize_diagnostics() -> None:
    us = pd.DataFrame({"GEOID": ["US", "US"], "SEX": [0, 1], "COUNT": [10, 7]})
    st = pd.DataFrame({"GEOID": ["01", "01", "02", "02"], "SEX": [0, 1, 0, 1], "COUNT": [4, 3, 6, 4]})
    rows = topdown_consistency({"topdown_US.csv": us, "topdown_state.csv": st})
    assert rows == [{"product": "topdown", "check": "US = Σ state", "cells": 2, "inconsistent": 0,
                     "max_abs_diff": 0.0}]
    nation = pd.DataFrame({"STATE": ["US", "US"], "HOUSEHOLD_SIZE": ["1", "2+"], "COUNT": [5, 6]})
    state = pd.DataFrame({"STATE": ["01", "02", "01", "02"], "HOUSEHOLD_SIZE": ["1", "1", "2+", "2+"],
                          "COUNT": [2, 3, 1, 4]})
    gs = groupsize_consistency({"groupsize_nation.csv": nation, "groupsize_state.csv": state}, n=12)
    assert [(r["inconsistent"], r["max_abs_diff"]) for r in gs] == [(1, 1.0), (1, 1.0)]


def test_topdown_consistency_streamed_from_the_store_equals_the_whole_frames(tmp_path: Path) -> None:
    """The release's TopDown tables streamed from the store in Arrow tables of a few rows (the child level
    summed to its parents table by table) give the same cells, differing cells and largest difference as the
    whole frames through ``hierarchy_check``; a Parquet table streams alike, with one inconsistent cell."""
    rng = np.random.default_rng(5)
    counties = [f"01{c:03d}" for c in range(1, 4)] + [f"02{c:03d}" for c in range(1, 3)]
    county = pd.DataFrame([(g, s, int(rng.integers(0, 50))) for g in counties for s in (0, 1)],
                          columns=["GEOID", "SEX", "COUNT"])
    state = county.assign(GEOID=county["GEOID"].str[:2]).groupby(["GEOID", "SEX"], as_index=False)["COUNT"].sum()
    us = state.assign(GEOID="US").groupby(["GEOID", "SEX"], as_index=False)["COUNT"].sum()
    state.loc[3, "COUNT"] += 7  # one state cell off by 7
    store = LocalStore(tmp_path / "store")
    prefix = "runs/r/release/topdown/"
    for name, frame in (("US", us), ("state", state)):
        store.put(f"{prefix}topdown_{name}.csv", frame.to_csv(sep="|", index=False).encode())
    buf = io.BytesIO()
    county.to_parquet(buf, index=False)
    store.put(f"{prefix}topdown_county.parquet", buf.getvalue())
    files = accuracy.ReleaseFiles(store, prefix)
    frames = {rel: files[rel] for rel in files}
    streamed = topdown_consistency(files)
    assert streamed == topdown_consistency(frames)
    assert [(r["check"], r["cells"], r["inconsistent"], r["max_abs_diff"]) for r in streamed] == [
        ("US = Σ state", 2, 1, 7.0), ("state = Σ county", 4, 1, 7.0)]
    tables = list(files.text_tables("topdown_state.csv", rows=2))
    assert sum(t.num_rows for t in tables) == len(state)
    assert all(t.schema.types == [pa.string()] * 3 for t in tables)
    expect = [(str(r.GEOID), str(r.SEX), str(r.COUNT)) for r in state.itertuples()]
    got = [row for t in tables for row in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True)]
    assert got == expect


class _TinyTables(dict[str, pd.DataFrame]):
    """Release frames that stream as text tables of ``rows`` rows (state runs cut mid-table), recording how many
    rows of each file have been handed out."""

    def __init__(self, frames: dict[str, pd.DataFrame], rows: int) -> None:
        super().__init__(frames)
        self.rows = rows
        self.read: dict[str, int] = {}

    def text_tables(self, rel: str) -> Iterator[pa.Table]:
        frame = self[rel]
        text = pa.table({c: pa.array(frame[c].astype(str).to_numpy(), pa.string()) for c in frame.columns})
        for start in range(0, text.num_rows, self.rows):
            self.read[rel] = self.read.get(rel, 0) + min(self.rows, text.num_rows - start)
            yield text.slice(start, self.rows)


def _levels(seed: int) -> dict[str, pd.DataFrame]:
    """Consistent TopDown tables of three states (counties and tracts), sorted by GEOID then cell."""
    rng = np.random.default_rng(seed)
    tracts = [f"{s}{c:03d}{t:06d}" for s in ("01", "04", "06") for c in (1, 3) for t in range(1, 4)]
    tract = pd.DataFrame([(g, sex, age, int(rng.integers(0, 9))) for g in tracts for sex in (0, 1)
                          for age in (0, 1, 2)], columns=["GEOID", "SEX", "AGE", "COUNT"])
    tract = tract[tract["COUNT"] > 0].reset_index(drop=True)  # nonzero cells only, as published
    out = {"topdown_tract.csv": tract}
    for name, width in (("county", 5), ("state", 2), ("US", 0)):
        geo = tract["GEOID"].str[:width] if width else "US"
        out[f"topdown_{name}.csv"] = (tract.assign(GEOID=geo).groupby(["GEOID", "SEX", "AGE"], as_index=False)
                                      ["COUNT"].sum())
    return out


def test_topdown_consistency_state_by_state_equals_the_whole_check() -> None:
    """Streamed in tables of 1, 4 and 7 rows (state runs cut mid-table), the state-by-state check gives the
    whole check's cells, differing cells and largest difference for every pair of levels, including a county
    cell off by 5, a parent cell without children (all of its children are missing) and children whose state
    has no parent rows (not compared, as the whole check's left join leaves them); both levels are consumed one
    state at a time."""
    frames = _levels(3)
    county = frames["topdown_county.csv"]
    county.loc[county.index[4], "COUNT"] += 5
    tract = frames["topdown_tract.csv"]
    gone = tract["GEOID"].str.startswith("04003")  # county 04003 keeps its rows, its tracts are dropped
    frames["topdown_tract.csv"] = tract[~gone].reset_index(drop=True)
    frames["topdown_county.csv"] = county[~county["GEOID"].str.startswith("06")].reset_index(drop=True)
    whole = topdown_consistency(frames)
    expect = []
    for (pn, pw), cn in (((("US", 0), "state")), (("state", 2), "county"), (("county", 5), "tract")):
        parent, child = frames[f"topdown_{pn}.csv"], frames[f"topdown_{cn}.csv"]
        sums = child.assign(GEOID=child["GEOID"].str[:pw] if pw else "US").groupby(
            ["GEOID", "SEX", "AGE"], as_index=False)["COUNT"].sum()
        m = parent.merge(sums, on=["GEOID", "SEX", "AGE"], how="left", suffixes=("", "_C")).fillna({"COUNT_C": 0})
        d = (m["COUNT"] - m["COUNT_C"]).abs()
        expect.append({"product": "topdown", "check": f"{pn} = Σ {cn}", "cells": len(m),
                       "inconsistent": int((d > 0).sum()), "max_abs_diff": float(d.max())})
    assert whole == expect
    assert [r["inconsistent"] > 0 for r in whole] == [False, True, True]  # 06's counties gone; 04003's tracts
    for rows in (1, 4, 7):
        files = _TinyTables({k: v.copy() for k, v in frames.items()}, rows)
        assert topdown_consistency(files) == whole
    streamed = _TinyTables(frames, 2)
    seen: list[int] = []
    from dasflow.products.topdown import reporting
    states = reporting._by_state(streamed.text_tables("topdown_tract.csv"), 2, "topdown_tract.csv")
    done = 0
    for _state, held in states:  # rows read beyond the states handed out so far
        done += sum(t.num_rows for t in held)
        seen.append(streamed.read["topdown_tract.csv"] - done)
    assert len(seen) == 3 and max(seen) <= 2  # at most the table that began the next state is read ahead


def test_topdown_consistency_on_threads_gives_the_rows_of_one_thread_in_level_order() -> None:
    """The pairs of levels checked side by side (the finest first) give one thread's rows, in level order; a
    failure in one pair is raised as it is."""
    frames = _levels(6)
    frames["topdown_county.csv"].loc[2, "COUNT"] += 3
    one = topdown_consistency(frames, workers=1)
    assert [r["check"] for r in one] == ["US = Σ state", "state = Σ county", "county = Σ tract"]
    assert [r["inconsistent"] for r in one] == [0, 1, 1]
    for workers in (2, 3, 8):
        assert topdown_consistency(frames, workers=workers) == one
    frames["topdown_state.csv"] = frames["topdown_state.csv"].iloc[::-1]
    with pytest.raises(IntegrityError, match="not in GEOID order"):
        topdown_consistency(_TinyTables(frames, 1), workers=3)


def test_topdown_consistency_refuses_a_file_out_of_state_order(tmp_path: Path) -> None:
    """A stored table whose states are not in GEOID order is refused by name, never summed wrongly."""
    frames = _levels(4)
    tract = frames["topdown_tract.csv"]
    shuffled = pd.concat([tract[tract["GEOID"].str.startswith("04")], tract[~tract["GEOID"].str.startswith("04")]])
    store = LocalStore(tmp_path / "store")
    prefix = "runs/r/release/topdown/"
    for rel, frame in (frames | {"topdown_tract.csv": shuffled}).items():
        store.put(prefix + rel, frame.to_csv(sep="|", index=False).encode())
    with pytest.raises(IntegrityError, match=r"topdown_tract\.csv: rows are not in GEOID order \(state 01 after 04\)"):
        topdown_consistency(accuracy.ReleaseFiles(store, prefix))


def test_production_release_gets_expected_moes_only(tmp_path: Path) -> None:
    ctx = released_context(tmp_path, seed=None)
    with pytest.raises(TruthRefused):
        truth_frames(ctx)
    with pytest.raises(TruthRefused):
        accuracy_report(ctx, {"counts": {}})
    page = accuracy_report(ctx, None)
    assert "TEST RELEASE" not in page
    assert "expected MOEs and consistency diagnostics only" in page
    assert "Observed error" not in page
    plots = _plots(page)  # expected MOEs, and consistency when a hierarchical product is released: SVG charts
    assert plots and all(m == "image/svg+xml" for m, _ in plots)
    for _, data in plots:
        _check_svg(data)
    assert accuracy_report(ctx, None) == page  # the same bytes on a re-run


def _plots(page: str) -> list[tuple[str, bytes]]:
    """Every embedded plot: its MIME type and decoded bytes."""
    return [(mime, base64.b64decode(m)) for mime, m in
            re.findall(r'class="plot"[^>]*src="data:(image/png|image/svg\+xml);base64,([^"]+)"', page)]


def _check_svg(data: bytes) -> None:
    """A well-formed SVG with a size, and bars that are drawn (positive widths) in at least one colour."""
    root = ElementTree.fromstring(data)
    assert root.tag == "{http://www.w3.org/2000/svg}svg" and float(root.get("width", 0)) > 0
    bars = [r for r in root.iter("{http://www.w3.org/2000/svg}rect") if r.get("fill") != "#ffffff"]
    assert bars and all(float(r.get("width", -1)) >= 0 for r in bars)
    assert any(float(r.get("width", 0)) > 0 for r in bars), "no bar drawn"


def _chromium() -> str:
    """The Debian ``chromium`` binary; its absence FAILS the test (the report must be checked in a browser)."""
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.fail("chromium is not installed: `apt-get update && apt-get install -y chromium` (add it to "
                    ".ci/run); the accuracy report must be checked in a real browser")
    return exe


def _run_chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp / f"profile-{len(list(tmp.glob('profile-*')))}"
    profile.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    return subprocess.run([_chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120, env=env, check=False)


@pytest.mark.slow
def test_report_opens_in_headless_chromium_and_every_plot_renders(test_release: RunContext, tmp_path: Path) -> None:
    """Test release with ground truth: the page is self-contained, every embedded PNG decodes to a non-blank
    image, Chromium loads every <img> (naturalWidth > 0, checked by a script in a test-only copy of the page),
    and a screenshot of the page is not blank and shows the plots' colours."""
    truth = truth_frames(test_release)
    page = accuracy_report(test_release, truth)
    assert page.startswith("<!DOCTYPE html>") and "<title>TEST RELEASE" in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
    plots = _plots(page)
    # expected MOE (SVG), RMSE by size and one scatter for the one product (PNG)
    assert [m for m, _ in plots] == ["image/svg+xml", "image/png", "image/png"]
    for mime, data in plots:
        if mime == "image/svg+xml":
            _check_svg(data)
            continue
        pixels = np.asarray(PILImage.open(io.BytesIO(data)).convert("RGB"), dtype=np.float64)
        assert pixels.std() > 10, "a blank plot"
    report = tmp_path / "report.html"
    report.write_text(page, encoding="utf-8")
    # 1. every <img> decodes in the browser
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", (
        "<script>window.addEventListener('load',()=>{const i=[...document.images];"
        "const ok=i.filter(x=>x.complete&&x.naturalWidth>0).length;"
        "document.body.insertAdjacentHTML('beforeend',`<div id=probe>${ok}/${i.length}</div>`)});</script>"
        "</body>")), encoding="utf-8")
    dom = _run_chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    found = re.search(r'<div id="probe">(\d+)/(\d+)</div>', dom.stdout)
    assert found is not None, dom.stderr[-2000:]
    assert found.group(1) == found.group(2) == str(len(plots))
    # 2. a screenshot of the report itself is not blank and shows the plots
    shot = tmp_path / "shot.png"
    result = _run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1200,3200", report.as_uri())
    assert shot.exists(), result.stderr[-2000:]
    pixels = np.asarray(PILImage.open(shot).convert("RGB"), dtype=np.float64)
    assert pixels.shape[:2] == (3200, 1200)
    assert pixels.var() > 100, "blank screenshot"
    c0 = np.all(np.abs(pixels - np.array([31, 119, 180])) < 12, axis=2)  # matplotlib "C0" (plots only)
    assert c0.sum() > 500, "the plots are not visible in the screenshot"


def _merged(released: pd.DataFrame, truth: pd.DataFrame, zero_fill: bool = False) -> pd.DataFrame:
    """compare() through the pandas merge only (the reference for the integer-code join)."""
    fast = accuracy._inner_rows
    try:
        accuracy._inner_rows = lambda *a: None  # type: ignore[assignment]
        return accuracy.compare(released, truth, zero_fill=zero_fill)
    finally:
        accuracy._inner_rows = fast


@pytest.mark.parametrize("kind", ["categorical", "text", "integer"])
def test_compare_on_integer_codes_gives_the_merge(kind: str) -> None:
    """A large truth (every cell, in its own order, keys categorical / text / integers) against a release of
    some cells (read as text, one absent from the truth): same rows, same order, same values as the merge."""
    rng = np.random.default_rng(5)
    regions = [str(i) for i in range(10, 50)]  # no leading zero: the integer case reads back the same text
    cells = np.arange(1, 30)
    grid = pd.MultiIndex.from_product([regions, ["A", "B", "C"], cells],
                                      names=["REGION_ID", "ITERATION_CODE", "CELL"]).to_frame(index=False)
    truth = grid.sample(frac=1.0, random_state=3).reset_index(drop=True)
    truth["REGION_TYPE"] = "STATE"
    truth["COUNT"] = rng.integers(0, 500, len(truth))
    if kind == "categorical":
        truth = truth.astype({"REGION_ID": "category", "ITERATION_CODE": "category", "CELL": "category"})
    elif kind == "integer":
        truth["REGION_ID"] = truth["REGION_ID"].astype(int)
    picked = grid.iloc[rng.choice(len(grid), 700, replace=False)].astype(str)
    released = pd.concat([picked, pd.DataFrame({"REGION_ID": ["99"], "ITERATION_CODE": ["A"], "CELL": ["1"]})],
                         ignore_index=True)
    released["REGION_TYPE"] = "STATE"
    released["COUNT"] = rng.integers(-5, 500, len(released)).astype(str)
    released["VARIANCE"] = "4.5"
    assert accuracy._inner_rows(released, truth, ["REGION_ID", "ITERATION_CODE", "CELL", "REGION_TYPE"]) is not None
    got = accuracy.compare(released, truth)
    assert len(got) == 700
    pd.testing.assert_frame_equal(got, _merged(released, truth), check_exact=True)
    dup = pd.concat([truth, truth.iloc[:1]], ignore_index=True)  # duplicate keys: the merge decides
    assert accuracy._inner_rows(released, dup, ["REGION_ID", "ITERATION_CODE", "CELL", "REGION_TYPE"]) is None
    pd.testing.assert_frame_equal(accuracy.compare(released, dup), _merged(released, dup), check_exact=True)
