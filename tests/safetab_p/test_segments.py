"""SafeTab-P keys measured in region segments (issue #20 item 2): a key whose public group domain exceeds
``plan.SEGMENT_GROUPS`` is drawn one range of regions at a time through the ledger's segmented protocol, each
segment's counts read from the state partitions holding it, stage 2 shaped by the same segment of its stage-1
key, and post-processed segment by segment.

Checked on a three-state synthetic census with a small segment bound: segments cover every group once; with
noise off the segments equal the whole-key measurement exactly; stage 2's detail levels come from the same
groups' stage-1 totals; the release equals the whole-table post-processing of the same measurements; a measure
stage killed between segments resumes to byte-identical NMFs."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dasflow import synth
from dasflow.errors import LedgerRefusal
from dasflow.pipeline import stages
from dasflow.pipeline.prepared import PartitionedPrepared
from dasflow.pipeline.run import RunContext
from dasflow.privacy import rng
from dasflow.privacy.ledger import Ledger
from dasflow.products.base import NOISY_COLUMN
from dasflow.products.safetab_p import outputs, plan
from dasflow.products.safetab_p.measure import segment_ids, stage1_key, stat_levels
from tests.safetab_p.test_partitioned_preprocess import LAYOUTS, context
from tests.safetab_p.test_partitioned_preprocess import make_store as _make_store

#: three small states (9 counties in all): level-2 domains of ≈ 20 K groups
STATES = ["10", "11", "44"]
#: small enough that every level-2 key below the state is cut into segments of two regions
GROUPS = 4_300


@pytest.fixture(scope="module")
def census(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("census")
    synth.generate(root, persons=3000, seed=5, states=STATES, formats=tuple(LAYOUTS))
    return root


def make_store(census: Path, tmp: Path, layout: str) -> Path:
    return _make_store(census, tmp, layout, STATES)


def _run(store_dir: Path, *, until: str = "postprocess") -> RunContext:
    ctx = context(store_dir)
    stages.validate_stage(ctx, "safetab-p")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "safetab-p")
    if until in ("measure", "postprocess"):
        stages.measure_stage(ctx, "safetab-p")
    if until == "postprocess":
        stages.postprocess_stage(ctx, "safetab-p")
    return ctx


def _segmented(ctx: RunContext) -> list[tuple[object, object]]:
    return [(s, n) for s, n in stages.planned(ctx, "safetab-p") if segment_ids(n)]


def _nmfs(store_dir: Path) -> dict[str, bytes]:
    root = store_dir / "runs/st/measurements"
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*.parquet"))}


@pytest.fixture(scope="module")
def released(census: Path, tmp_path_factory: pytest.TempPathFactory) -> RunContext:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(plan, "SEGMENT_GROUPS", GROUPS)
        return _run(make_store(census, tmp_path_factory.mktemp("seg"), "safetab_p_states"))


def test_segments_cover_every_group_once_and_stage_two_follows_its_stage_one(released: RunContext) -> None:
    ctx = released
    segmented = _segmented(ctx)
    names = {n.key.split("/", 2)[2] for _, n in segmented}  # type: ignore[attr-defined]
    assert {"COUNTY/2/stage1", "COUNTY/2/stage2", "TRACT/2/stage2", "PLACE/2/stage2"} <= names
    assert not any(k.startswith("USA/") or "/1/" in k for k in names)  # small domains are drawn whole
    prepared = stages.load_prepared(ctx, "safetab-p")
    from dasflow.products.safetab_p.measure import _domain
    for spec, native in segmented:
        commit = ctx.ledger.committed(spec.key)  # type: ignore[attr-defined]
        entries = ctx.ledger.segments(spec, commit)  # type: ignore[arg-type]
        assert entries is not None and [e.segment for e in entries] == segment_ids(native)  # type: ignore[arg-type]
        assert len(entries) > 1
        whole = ctx.ledger.load(spec, commit)  # type: ignore[arg-type]
        two, to, _, _ = _domain(prepared, native)  # type: ignore[arg-type]
        groups = whole.table["GROUP"].to_numpy()
        if native.detail["stage"] == 1:  # type: ignore[attr-defined]
            assert np.array_equal(groups, two)  # every two-stage group once, in group order
            continue
        assert set(np.unique(groups)) == set(two) | set(to)
        s1 = ctx.ledger.load(*(lambda s: (s, ctx.ledger.committed(s.key)))(
            next(s for s, n in stages.planned(ctx, "safetab-p") if n.key == stage1_key(native))))  # type: ignore[arg-type]
        level = pd.Series(stat_levels(s1.table[NOISY_COLUMN].to_numpy(np.int64), native.detail["thresholds"]),  # type: ignore[attr-defined]
                          index=s1.table["GROUP"].to_numpy())
        rows = whole.table[whole.table["STAT_LEVEL"] >= 0]
        assert (rows["STAT_LEVEL"].to_numpy() == level.loc[rows["GROUP"].to_numpy()].to_numpy()).all()
        assert set(rows["GROUP"]) == set(two)


def test_segments_without_noise_equal_the_whole_key_exactly(released: RunContext) -> None:
    ctx = released
    product = ctx.plugin("safetab-p").product(ctx.product_config("safetab-p"))
    prepared = stages.load_prepared(ctx, "safetab-p")
    assert isinstance(prepared, PartitionedPrepared)
    by_key = {n.key: n for _, n in stages.planned(ctx, "safetab-p")}
    for key in ("safetab-p/US/COUNTY/2/stage1", "safetab-p/US/TRACT/2/stage1"):
        s1 = by_key[key]
        s2 = by_key[key.replace("stage1", "stage2")]
        off = {"noise": Fraction(0)}
        s1 = dataclasses.replace(s1, **off)
        s2 = dataclasses.replace(s2, **off, detail={**s2.detail, "total_only_noise": Fraction(0)})
        g = rng.seeded(1)
        whole1 = product.measure(prepared, s1, g)
        parts1 = {seg: product.measure_segment(prepared, s1, seg, g) for seg in segment_ids(s1)}
        cat1 = pd.concat([m.table for m in parts1.values()], ignore_index=True)
        pd.testing.assert_frame_equal(cat1.astype(whole1.table.dtypes.to_dict()), whole1.table)
        whole2 = product.measure_adaptive(prepared, s2, g, {s1.key: whole1})
        parts2 = [product.measure_segment_adaptive(prepared, s2, seg, g, lambda k, sg, _p=parts1: _p[sg])
                  for seg in segment_ids(s2)]
        order = ["GROUP", "STAT_LEVEL", "SEX", "AGESTART"]
        cat2 = pd.concat([m.table for m in parts2], ignore_index=True).sort_values(order, ignore_index=True)
        want = whole2.table.sort_values(order, ignore_index=True)
        pd.testing.assert_frame_equal(cat2.astype(want.dtypes.to_dict()), want)
        assert (want["STAT_LEVEL"] > 0).any()  # detail levels occur: the cells were compared too


def test_segmented_release_equals_the_whole_table_post_processing(released: RunContext) -> None:
    ctx = released
    product = ctx.plugin("safetab-p").product(ctx.product_config("safetab-p"))
    whole = outputs.tables(product.postprocess(stages.load_measurements(ctx, "safetab-p"),
                                               ctx.post_public("safetab-p")))
    record = stages.manifest_if_current(ctx, "postprocess", "safetab-p",
                                        stages._measurement_hashes(ctx, "safetab-p"))
    assert record is not None
    from dasflow.pipeline.estimates import StoredEstimates
    chunks = list(product.table_chunks(StoredEstimates(ctx.store, record["outputs"])))
    t1 = pd.concat([c for n, c in chunks if n == "t1"], ignore_index=True)
    t2 = pd.concat([c for n, c in chunks if n == "t2"], ignore_index=True)
    pd.testing.assert_frame_equal(t1.astype(whole["t1"].dtypes.to_dict()), whole["t1"])
    # T2 rows: the same rows; within a segmented key its segments' cells and margins alternate
    cols = list(whole["t2"].columns)
    a = t2.astype(whole["t2"].dtypes.to_dict()).sort_values(cols, ignore_index=True)
    pd.testing.assert_frame_equal(a, whole["t2"].sort_values(cols, ignore_index=True))
    t2_key = next(k for k, o in record["outputs"].items() if o["name"] == "t2")
    with ctx.store.reader(t2_key) as fh:
        row_groups = pq.ParquetFile(fh).metadata.num_row_groups
    stage2 = [n for _, n in stages.planned(ctx, "safetab-p") if n.key.endswith("/stage2")]
    assert row_groups == sum(len(segment_ids(n) or [None]) for n in stage2)  # one per segment


def test_segment_rows_read_only_the_partitions_holding_them(released: RunContext,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = stages.load_prepared(released, "safetab-p")
    assert isinstance(prepared, PartitionedPrepared)
    name = "counts/US/COUNTY/2"
    frame = prepared[name]
    reads: list[int] = []
    original = pq.ParquetFile.read_row_group
    monkeypatch.setattr(pq.ParquetFile, "read_row_group",
                        lambda self, i, *a, **k: (reads.append(i), original(self, i, *a, **k))[1])
    groups = frame["GROUP"].to_numpy()
    middle = int(groups[len(groups) // 2])
    for (low, high), files in (((0, int(groups[0]) + 1), 1), ((int(groups[-1]), int(groups[-1]) + 1), 1),
                               ((-5, 0), 0), ((middle, middle + 1), 1), ((0, int(groups[-1]) + 1), 3)):
        reads.clear()
        got = prepared.rows(name, "GROUP", low, high)
        want = frame[(groups >= low) & (groups < high)].reset_index(drop=True)
        pd.testing.assert_frame_equal(got, want)
        assert len(reads) == files  # of three states' files, only those whose GROUP range meets [low, high)


def test_a_measure_killed_between_segments_resumes_to_identical_nmfs(census: Path,
                                                                      released: RunContext, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "SEGMENT_GROUPS", GROUPS)
    ctx = _run(make_store(census, tmp_path, "safetab_p_states"), until="preprocess")
    original = Ledger._segment_once
    calls = []

    def crash_after_some(self, spec, segment, draw):  # type: ignore[no-untyped-def]
        calls.append(segment)
        if len(calls) == 7:  # in the middle of a segmented key
            raise KeyboardInterrupt("killed")
        return original(self, spec, segment, draw)

    monkeypatch.setattr(Ledger, "_segment_once", crash_after_some)
    with pytest.raises(KeyboardInterrupt):
        stages.measure_stage(ctx, "safetab-p")
    monkeypatch.setattr(Ledger, "_segment_once", original)
    again = stages.measure_stage(context(Path(ctx.config.store)), "safetab-p")
    assert again["drawn_now"] > 0
    assert _nmfs(Path(ctx.config.store)) == _nmfs(Path(released.config.store))


def test_stage_two_of_a_segment_without_its_stage_one_is_refused(released: RunContext) -> None:
    product = released.plugin("safetab-p").product(released.product_config("safetab-p"))
    spec = next(n for _, n in _segmented(released) if n.detail["stage"] == 2)  # type: ignore[attr-defined]
    with pytest.raises(LedgerRefusal, match="needs its stage-1 segment"):
        product.measure_segment({}, spec, segment_ids(spec)[0], rng.seeded(0))  # type: ignore[arg-type]
