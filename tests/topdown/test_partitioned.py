"""TopDown's confidential side per state (issue #20): per-state preprocessing equals the national pass, keys
below the state level are drawn one state at a time into segmented NMFs, and the release is byte-stable across a
crash between segments and across the input layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.inputs import mark_synthetic
from dasflow.pipeline.run import freeze_config, open_run
from dasflow.products.topdown import partitioned
from dasflow.products.topdown.measure import group_states, measured_units, state_segments
from dasflow.products.topdown.partitioned import PACK_BLOCKS, _variances, parts_layout
from dasflow.products.topdown.plugin import parse_topdown_config
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files, topdown_release

REPO = Path(__file__).resolve().parents[2]
PERSONS = "confidential/synth/topdown/persons/"


def _run_all(raw: dict[str, Any], store: LocalStore) -> None:
    ctx = freeze_config(parse_release_config(raw), store)
    stages.validate_stage(ctx, "topdown")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "topdown")
    stages.measure_stage(ctx, "topdown")
    stages.postprocess_stage(ctx, "topdown")
    release_stage(ctx)


def test_per_state_preprocessing_equals_the_national_pass(tmp_path: Path) -> None:
    raw = topdown_release(tmp_path, "p", persons=3000)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    plugin, cfg = ctx.plugin("topdown"), ctx.product_config("topdown")
    product = plugin.product(cfg)
    public = plugin.public_inputs(ctx.store, ctx.config.inputs, cfg)
    parts = plugin.partitions(ctx.store, ctx.config.inputs, public, cfg)
    assert parts == ["10", "11", "44"]
    national = product.prepare(plugin.confidential_inputs(ctx.store, ctx.config.inputs, cfg), public)
    per_state = {p: product.prepare(plugin.partition_inputs(ctx.store, ctx.config.inputs, cfg, p), public)
                 for p in parts}
    sp = product.spine(public)
    segs = product.segmentation(sp)
    for l, level in enumerate(sp.levels):
        name = f"hist/{level}"
        combined = plugin.combine_prepared(name, [per_state[p][name] for p in parts])
        pd.testing.assert_frame_equal(combined, national[name])
        if l > segs.top:  # below the state level a partition holds only its own state's units
            for p in parts:
                of = segs.of_unit[l]
                assert of is not None
                assert {segs.codes[int(c)] for c in of[per_state[p][name]["UNIT"].to_numpy()]} == {p}
    assert len(national["hist/US"]) < sum(len(per_state[p]["hist/US"]) for p in parts)  # really summed


def test_a_person_in_another_states_folder_is_refused_and_layouts_are_checked(tmp_path: Path) -> None:
    raw = topdown_release(tmp_path, "p", persons=2000)
    store = LocalStore(tmp_path / "store")
    ctx = freeze_config(parse_release_config(raw), store)
    plugin, cfg = ctx.plugin("topdown"), ctx.product_config("topdown")
    public = plugin.public_inputs(store, ctx.config.inputs, cfg)
    moved = sorted(k for k in store.list(PERSONS + "44/") if k.endswith(".parquet"))[0]
    store.put(PERSONS + "10/part-99999.parquet", store.get(moved))
    with pytest.raises(InputError) as err:
        plugin.partition_inputs(store, ctx.config.inputs, cfg, "10")
    assert err.value.column == "TABBLKST" and err.value.row == 1 and "10/part-99999.parquet" in str(err.value.file)
    store.delete(PERSONS + "10/part-99999.parquet")
    store.put(PERSONS + "loose.parquet", store.get(moved))
    with pytest.raises(InputError, match="one layout only"):
        plugin.partitions(store, ctx.config.inputs, public, cfg)
    store.delete(PERSONS + "loose.parquet")
    store.put(PERSONS + "XX/part-00000.parquet", store.get(moved))
    with pytest.raises(InputError, match="2-digit state"):
        plugin.partitions(store, ctx.config.inputs, public, cfg)


def _flat_layout(tmp: Path, segment_blocks: int | None = 1) -> dict[str, Any]:
    """The same persons as one file directly under a prefix (the national layout: no partitions)."""
    raw = topdown_release(tmp, "r1", persons=3000, segment_blocks=segment_blocks)
    store = LocalStore(tmp / "store")
    keys = sorted(k for k in store.list(PERSONS) if k.endswith(".parquet"))
    table = pa.concat_tables([pq.read_table(store.local_path(k)) for k in keys])
    target = store.local_path("confidential/flat/topdown/persons.parquet")
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target)
    mark_synthetic(store, "confidential/flat/", generator_note="tests.topdown.test_partitioned: one national file")
    raw["inputs"] = {**raw["inputs"], "topdown": "confidential/flat/topdown/"}
    return raw


def test_segmented_release_is_byte_stable_across_a_crash_between_segments_and_the_layout(tmp_path: Path) -> None:
    # every county alone: Delaware and Rhode Island in county chunks, DC (one county) whole; counties with
    # several block groups chunked again below them ("10.1.0")
    clean = topdown_release(tmp_path / "clean", "r1", persons=3000, segment_blocks=1)
    _run_all(clean, LocalStore(tmp_path / "clean/store"))
    ctx = open_run("r1", str(tmp_path / "clean/store"))
    product = ctx.plugin("topdown").product(ctx.product_config("topdown"))
    ids = list(product.segmentation(product.spine(ctx.post_public("topdown"))).ids)
    assert ids == ["10.0", "10.1", "10.1.0", "10.1.1", "10.2", "11", "44.0", "44.1", "44.2", "44.3", "44.4",
                   "44.4.0", "44.4.1"]
    record = stages.manifest_if_current(ctx, "preprocess", "topdown", stages.input_hashes(ctx))
    assert record is not None and record["partitions"] == ["10", "11", "44"]
    segmented = {}
    for spec in stages.product_specs(ctx, "topdown"):
        commit = ctx.ledger.committed(spec.key)
        assert commit is not None
        segs = ctx.ledger.segments(spec, commit)
        segmented[spec.key] = None if segs is None else [s.segment for s in segs]
    # every key below the state level lists the chunks with a measured unit at its level, in segment order
    assert {s for v in segmented.values() if v for s in v} == set(ids)
    assert all(v == sorted(v, key=ids.index) for v in segmented.values() if v)
    assert all(v is None for k, v in segmented.items() if k.split("/")[1] in ("US", "state"))

    # a process killed right after its first segment reached storage, then resumed in another process
    crash = topdown_release(tmp_path / "crash", "r1", persons=3000, segment_blocks=1)
    (tmp_path / "release.json").write_text(json.dumps(crash))
    script = ("import json, sys\nfrom dasflow.io.store import LocalStore\n"
              "from tests.topdown.test_partitioned import _run_all\n"
              f"_run_all(json.loads(open({str(tmp_path / 'release.json')!r}).read()), "
              f"LocalStore({str(tmp_path / 'crash/store')!r}))\n")
    env = {**os.environ, "DASFLOW_TEST_MODE": "1", "DASFLOW_FAULT_AT": "measure:after-segment:topdown/*",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=REPO, capture_output=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    measured = tmp_path / "crash/store/runs/r1/measurements"
    first = [p for p in measured.rglob("seg=*.parquet")]
    assert len(first) == 1  # exactly one segment stored, its key not indexed nor committed
    before = first[0].read_bytes()
    key = first[0].parent.relative_to(measured).as_posix()
    assert not (measured / f"{key}.parquet").exists()
    _run_all(crash, LocalStore(tmp_path / "crash/store"))
    assert first[0].read_bytes() == before  # reused, never redrawn
    assert release_files(tmp_path / "crash/store", "r1") == release_files(tmp_path / "clean/store", "r1")

    # the national single-file layout: no partitions, the same segments drawn from the national histograms
    flat = _flat_layout(tmp_path / "flat")
    _run_all(flat, LocalStore(tmp_path / "flat/store"))
    fctx = open_run("r1", str(tmp_path / "flat/store"))
    frecord = stages.manifest_if_current(fctx, "preprocess", "topdown", stages.input_hashes(fctx))
    assert frecord is not None and "partitions" not in frecord
    tables = {k: v for k, v in release_files(tmp_path / "clean/store", "r1").items() if k.startswith("topdown/")
              and k.endswith(".csv")}
    assert tables and {k: release_files(tmp_path / "flat/store", "r1")[k] for k in tables} == tables


def test_group_states_bounds_a_segment_by_public_blocks() -> None:
    ids, of = group_states(["01", "02", "04", "05", "06"], [3, 4, 10, 2, 1], 7)
    assert ids == ["01-02", "04", "05-06"] and of.tolist() == [0, 0, 1, 2, 2]
    ids, of = group_states(["01", "02"], [3, 4], 1)
    assert ids == ["01", "02"] and of.tolist() == [0, 1]  # a state above the bound stays whole and alone
    assert group_states(["01", "02", "04"], [3, 4, 5], 100)[0] == ["01-04"]
    with pytest.raises(InputError, match="segment_blocks"):
        group_states(["01"], [3], 0)
    for bad in (0, True, "10"):
        with pytest.raises(InputError, match="segment_blocks"):
            parse_topdown_config({"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1",
                                  "segment_blocks": bad})
    assert parse_topdown_config({"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1",
                                 "segment_blocks": 5}).segment_blocks == 5
    for bad in (0, False, 1.5):
        with pytest.raises(InputError, match="bottom_up_max_entries"):
            parse_topdown_config({"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1",
                                  "bottom_up_max_entries": bad})
    assert parse_topdown_config({"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1",
                                 "bottom_up_max_entries": 7}).options.bottom_up_max_entries == 7


def test_a_state_above_the_bound_is_split_into_chunks_of_its_counties(tmp_path: Path) -> None:
    """Delaware (3 counties) and Rhode Island (5) above a 10-block bound are split into chunks of consecutive
    counties of at most 10 blocks (or one larger county, whose descendants are chunked again below its only
    tract: "10.1.0"); DC (one county) stays whole. A chunk's partition is its state's, every unit lies in its
    parent's segment or a chunk of it, and the segments of each level partition its measured units."""
    probe = topdown_release(tmp_path / "probe", "p", persons=3000)
    ctx = freeze_config(parse_release_config(probe), LocalStore(tmp_path / "probe/store"))
    plugin, cfg = ctx.plugin("topdown"), ctx.product_config("topdown")
    sp = plugin.product(cfg).spine(plugin.public_inputs(ctx.store, ctx.config.inputs, cfg))
    segs = state_segments(sp, 10)
    assert segs.ids == ("10.0", "10.1", "10.1.0", "10.1.1", "10.2", "11", "44.0", "44.1", "44.1.0", "44.1.1")
    assert [segs.members(i) for i in ("10.2", "11", "44.0")] == [("10",), ("11",), ("44",)]
    county = segs.top + 1
    of_county = segs.segment_of(county)
    assert of_county is not None and segs.segment_of(segs.top) is None
    state_of_county = segs.of_unit[county]
    assert state_of_county is not None
    blocks = np.bincount(sp.block_unit[county], minlength=sp.n_units(county))
    for k, sid in enumerate(segs.ids):
        counties = np.flatnonzero(of_county == k)
        if sid.count(".") >= 2:  # a chunk below a county: no county of its own
            assert counties.size == 0 and segs.members(sid) == segs.members(sid.rsplit(".", 1)[0])
            continue
        assert {segs.codes[int(c)] for c in state_of_county[counties]} == set(segs.members(sid))
        if "." in sid:  # consecutive counties of the state, within the bound unless one county alone
            assert counties.size == 1 or blocks[counties].sum() <= 10
            mine = np.flatnonzero(state_of_county == state_of_county[counties[0]])
            assert np.array_equal(counties, mine[np.searchsorted(mine, counties[0]):][:counties.size])
    _assert_segments_nest_and_bound(sp, segs, 10)
    assert any(i.count(".") >= 2 for i in segs.ids)  # a county above the bound chunked below it
    assert state_segments(sp, 10**6).ids == ("10-44",)


def _assert_segments_nest_and_bound(sp: Any, segs: Any, bound: int) -> None:
    """Below the first chunked level every unit lies in its parent's segment or in a chunk of it (``X.j`` under
    ``X``, only below a parent above the bound); the segments of each level partition its measured units; a
    segment's units at a level hold at most ``bound`` blocks together, or are one unit, or one parent's
    children that are blocks."""
    for l in range(segs.top + 2, sp.n_levels):
        seg, up = segs.segment_of(l), segs.segment_of(l - 1)
        mine, theirs = np.asarray(segs.ids)[seg], np.asarray(segs.ids)[up[sp.parent[l]]]
        nested = (mine == theirs) | np.char.startswith(mine.astype(str), np.char.add(theirs.astype(str), "."))
        assert nested.all(), l
        par_blocks = np.bincount(sp.block_unit[l - 1], minlength=sp.n_units(l - 1))[sp.parent[l]]
        assert (par_blocks[mine != theirs] > bound).all(), l
    for l in range(segs.top + 1, sp.n_levels):
        got = np.concatenate([segs.measured_units(sp, l, i) for i in segs.ids])
        assert np.array_equal(np.sort(got), measured_units(sp, l)) and got.size == np.unique(got).size
        blocks = np.bincount(sp.block_unit[l], minlength=sp.n_units(l))
        seg = segs.segment_of(l)
        for k, sid in enumerate(segs.ids):
            units = np.flatnonzero(seg == k)
            if "." in sid and units.size > 1 and blocks[units].sum() > bound:
                assert l == sp.n_levels - 1 and np.unique(sp.parent[l][units]).size == 1, (sid, l)


def test_small_states_share_a_segment_and_both_layouts_draw_it_alike(tmp_path: Path) -> None:
    """Rhode Island and Delaware/DC below a bound of their blocks: the segments are "10-11" (drawn from both
    partitions' counts, one object) and "44"; the one-file layout draws the same segments and publishes the same
    tables; every measured unit is in exactly one segment."""
    probe = topdown_release(tmp_path / "probe", "p", persons=3000)
    pctx = freeze_config(parse_release_config(probe), LocalStore(tmp_path / "probe/store"))
    plugin, cfg = pctx.plugin("topdown"), pctx.product_config("topdown")
    sp = plugin.product(cfg).spine(plugin.public_inputs(pctx.store, pctx.config.inputs, cfg))
    blocks = dict(zip(*np.unique(sp.block_geoid.astype(str).astype("U2"), return_counts=True), strict=True))
    bound = int(blocks["10"] + blocks["11"])
    grouped = topdown_release(tmp_path / "grouped", "r1", persons=3000, segment_blocks=bound)
    _run_all(grouped, LocalStore(tmp_path / "grouped/store"))
    ctx = open_run("r1", str(tmp_path / "grouped/store"))
    product = ctx.plugin("topdown").product(ctx.product_config("topdown"))
    seen = 0
    for spec in stages.product_specs(ctx, "topdown"):
        commit = ctx.ledger.committed(spec.key)
        assert commit is not None
        segs = ctx.ledger.segments(spec, commit)
        if segs is None:
            continue
        assert [s.segment for s in segs] == ["10-11", "44"]
        l = int(spec.detail["level_index"])
        units = np.concatenate([ctx.ledger.load_segment(spec, s).table["UNIT"].to_numpy() for s in segs])
        assert np.array_equal(np.sort(units), measured_units(product.spine(ctx.post_public("topdown")), l))
        seen += 1
    assert seen
    flat = _flat_layout(tmp_path / "flat", segment_blocks=bound)
    _run_all(flat, LocalStore(tmp_path / "flat/store"))
    tables = {k: v for k, v in release_files(tmp_path / "grouped/store", "r1").items() if k.startswith("topdown/")
              and k.endswith(".csv")}
    assert tables and {k: release_files(tmp_path / "flat/store", "r1")[k] for k in tables} == tables


def _assert_parts_bounded(sp: Any, lay: Any, bound: int) -> None:
    """Every part's families at each level it holds hang under parents with at most ``bound`` blocks together,
    or are one parent's family; a part holds consecutive levels from ``first`` to ``last`` (split parts end
    above the blocks), and reads its parents from one part (its own, or at its first level the part it was
    split from, itself holding families one level up)."""
    blocks = [np.bincount(sp.block_unit[l], minlength=sp.n_units(l)) for l in range(sp.n_levels)]
    for p, name in enumerate(lay.names):
        held = [l for l in range(lay.a + 1, sp.n_levels) if (lay.own[l] == p).any()]
        assert held == list(range(lay.first[p], lay.last[p] + 1)), (bound, name)
        for l in held:
            parents = np.flatnonzero(lay.key[l - 1] == p)
            assert parents.size == 1 or int(blocks[l - 1][parents].sum()) <= bound, (bound, name, l)
            src = {int(x) for x in lay.own[l - 1][parents]} if l - 1 > lay.a else set()
            assert len(src) <= 1 and (l == lay.first[p] or src == {p}), (bound, name, l)
            if l == lay.first[p] and src:
                (q,) = src
                assert name.startswith(f"{lay.names[q]}.") and lay.last[q] == l - 1, (bound, name, l)


def test_small_units_share_a_post_processing_part_within_the_bound(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The post-processing parts below the partition level a: consecutive level-a units packed while their
    blocks sum to at most the bound ("s-t"; a unit above it alone, "s", and chunked "s.k" below its children
    when it has several), each unit in exactly one pack, and every deeper unit's family in its ancestor's part
    (or a chunk of it)."""
    probe = topdown_release(tmp_path / "probe", "p", persons=3000)
    ctx = freeze_config(parse_release_config(probe), LocalStore(tmp_path / "probe/store"))
    plugin, cfg = ctx.plugin("topdown"), ctx.product_config("topdown")
    sp = plugin.product(cfg).spine(plugin.public_inputs(ctx.store, ctx.config.inputs, cfg))
    layouts = {bound: parts_layout(sp, bound) for bound in (1, 12, 40, 25_000)}
    a = layouts[1].a
    blocks = np.bincount(layouts[1].anc[-1], minlength=sp.n_units(a))
    assert layouts[25_000].names == (f"0-{sp.n_units(a) - 1}",)  # the whole test census in one part
    assert layouts[1].names.count("0") == 1 and not any("-" in n for n in layouts[1].names)
    for bound, lay in layouts.items():
        packs = [n for n in lay.names if "." not in n]
        spans = [tuple(int(x) for x in n.split("-")) if "-" in n else (int(n), int(n)) for n in packs]
        assert [u for lo, hi in spans for u in range(lo, hi + 1)] == list(range(sp.n_units(a))), bound
        for n, (lo, hi) in zip(packs, spans, strict=True):
            held = int(blocks[lo:hi + 1].sum())
            assert held <= min(bound, PACK_BLOCKS) or lo == hi, (bound, n)  # above the bound only a unit alone
            assert (lay.key[a][lo:hi + 1] == lay.index[n]).all()
            if any(m.startswith(f"{n}.") for m in lay.names):
                assert lo == hi and held > bound  # only a unit above the bound is chunked
        for l in range(a + 1, sp.n_levels):  # a unit's family lies in its level-a ancestor's part or a chunk of it
            home = [lay.names[int(k)] for k in lay.key[a][lay.anc[l]]]
            got = [lay.names[int(k)] for k in lay.own[l]]
            assert all(g == h or g.split(".")[0] == h for g, h in zip(got, home, strict=True)), (bound, l)
        _assert_parts_bounded(sp, lay, bound)
    assert any("-" in n for n in layouts[12].names) and any("-" not in n for n in layouts[12].names)
    # nine states of one-tract counties: counties above the bound split again (through their only tract)
    nine = topdown_release(tmp_path / "nine", "n", persons=8000,
                           states=("44", "11", "10", "09", "02", "56", "50", "38", "46"))
    ctx9 = freeze_config(parse_release_config(nine), LocalStore(tmp_path / "nine/store"))
    sp9 = plugin.product(cfg).spine(plugin.public_inputs(ctx9.store, ctx9.config.inputs,
                                                         ctx9.product_config("topdown")))
    for bound in (1, 12, 40):
        lay9 = parts_layout(sp9, bound)
        _assert_parts_bounded(sp9, lay9, bound)
        assert (bound == 40) != any(n.count(".") >= 2 for n in lay9.names), bound
    # PACK_BLOCKS caps the packs under a large segment bound (chunks still follow the segment bound)
    monkeypatch.setattr(partitioned, "PACK_BLOCKS", 40)
    capped = parts_layout(sp, 25_000)
    assert [n for n in capped.names if "." not in n] == [n for n in layouts[40].names if "." not in n]
    assert len(capped.names) > 1 and not any("." in n for n in capped.names)


def test_segment_variances_are_the_exact_values_as_floats() -> None:
    """Variances grouped by object identity: shared objects, equal values held by distinct objects and float
    columns all give ``float(v)`` per row."""
    from fractions import Fraction

    shared = [Fraction(1, 3), Fraction(2, 7)]
    column = np.empty(7, dtype=object)
    column[:] = [shared[0], shared[1], shared[0], Fraction(1, 3), Fraction(5, 11), shared[1], shared[0]]
    assert _variances(column).tolist() == [float(v) for v in column]
    assert _variances(np.array([0.5, 0.25])).tolist() == [0.5, 0.25]
    assert _variances(np.empty(0, dtype=object)).size == 0
