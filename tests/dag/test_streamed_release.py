"""Issue #20 (H3): TopDown's post-processing combine and the release stage stream per partition.

The streamed combine writes each level and the blocks one level-a subtree per Parquet row group, with the
diagnostics as running aggregates: the same rows, order and figures as one concatenation of the parts. The
release writes TopDown's tables one state at a time, the same bytes as the whole-frame aggregation; a table
failing output validation in a later chunk names its own row and publishes nothing of the product.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.estimates import StoredEstimates
from dasflow.pipeline.run import freeze_config
from dasflow.products.topdown import product as topdown_product
from dasflow.products.topdown.model import Histogram, consistency_violations
from dasflow.products.topdown.partitioned import PartitionedTopDown, partition_level
from dasflow.products.topdown.product import STANDARD_LEVELS
from dasflow.release import stage as release
from tests.dag.helpers import topdown_release
from tests.dag.test_pipeline import run_all


def _whole_tables(product, block: pd.DataFrame) -> dict[str, pd.DataFrame]:  # type: ignore[no-untyped-def]
    """The release tables as the whole-frame aggregation computed them before streaming (reference)."""
    schema = product.config.strategy.schema
    out = {}
    for name, width in STANDARD_LEVELS:
        geo = block["GEOID"].str[:width] if width else pd.Series(["US"] * len(block), index=block.index)
        agg = (pd.DataFrame({"GEOID": geo, "CELL": block["CELL"], "COUNT": block["COUNT"]})
               .groupby(["GEOID", "CELL"], sort=True, as_index=False)["COUNT"].sum())
        attrs = np.unravel_index(agg["CELL"].to_numpy(np.int64), schema.shape)
        table = pd.DataFrame({"GEOID": agg["GEOID"]})
        for a, v in zip(schema.names, attrs, strict=True):
            table[a] = v
        table["COUNT"] = agg["COUNT"].to_numpy()
        out[f"topdown_{name}"] = table
    return out


@pytest.mark.parametrize(("segment_blocks", "chunked"), [(80, False), (12, True)])
def test_streamed_combine_and_release_equal_the_whole_concatenation(tmp_path: Path, segment_blocks: int,
                                                                     chunked: bool,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With small states packed into shared parts (``segment_blocks`` = 80 blocks, above every state's 11–77),
    and with states and their subtrees split into chunks (12 blocks) and the levels below the state read per
    measurement segment (a small bottom-up bound): the parts are computed in their task waves' order, every
    batch of a wave in reverse, so a part that read another part of its own wave would fail."""
    raw = topdown_release(tmp_path, "stream", states=("44", "11", "10", "09", "02", "56", "50", "38", "46"),
                          persons=8000, segment_blocks=segment_blocks,
                          bottom_up_max_entries=2_000 if chunked else None)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    if chunked:
        for p in ctx.config.products:
            stages.validate_stage(ctx, p.name)
        stages.plan_stage(ctx)
        stages.preprocess_stage(ctx, "topdown")
        stages.measure_stage(ctx, "topdown")
        waves = stages.postprocess_waves(ctx, "topdown", 2)
        for wave in waves:
            for batch in reversed(wave):
                stages.postprocess_batch(ctx, "topdown", batch)
        segs = [s for s in stages.product_specs(ctx, "topdown") if (c := ctx.ledger.committed(s.key)) is not None
                and (found := ctx.ledger.segments(s, c)) is not None and any("." in f.segment for f in found)]
        assert segs  # some state's keys were drawn in county chunks
    run_all(ctx)
    post = tmp_path / "store/runs/stream/postprocessed/topdown"
    plugin = ctx.plugin("topdown")
    product = plugin.product(ctx.product_config("topdown"))
    public = ctx.post_public("topdown")
    sp = product.spine(public)
    a = partition_level(sp)
    steps = stages.postprocess_steps(ctx, "topdown")
    deep = next(s for s in steps if s["step"] == f"level-{sp.n_levels - 1}")
    assert len(deep["parts"]) > 1
    chunks = [p for p in deep["parts"] if "." in p]
    if not chunked:  # consecutive small states share a part ("s-t"), none is split
        assert not chunks and any("-" in p for p in deep["parts"])
    else:  # a large state's subtree in chunks below its counties, which stay in the state's own part
        assert chunks and all(p.split(".")[0] in next(s for s in steps if s["step"] == f"level-{a + 1}")["parts"]
                              for p in chunks)
        # combine (one national part; the deep levels are read from the measurement segments) with root ..
        # level a, the level a + 1 parts, the chains, and a new wave at each first level of a county's chunks
        # (parts "s.k.j" read their parents from the part they were split from)
        waves = stages.postprocess_waves(ctx, "topdown", 2)
        split_of = stages.partitioner(ctx, "topdown")
        assert isinstance(split_of, PartitionedTopDown)
        lay = split_of._layout(public)[1]
        deeper = sorted({f for f in lay.first if f > a + 2})
        assert deeper and all(lay.names[p].count(".") >= 2 for p, f in enumerate(lay.first) if f > a + 2)
        assert [w[0][0][0] for w in waves] == ["combine", f"level-{a + 1}", f"level-{a + 2}",
                                               *(f"level-{f}" for f in deeper)]
        assert waves[0][0][:2] == [("combine", "all"), ("level-0", "root")]
        assert next(s for s in steps if s["step"] == "combine")["parts"] == ["all"]
        # the parts of one measurement segment run in one task, which decodes the segment once
        split = stages.partitioner(ctx, "topdown")
        assert split is not None
        group = {}
        for st in split.post_steps(public):
            if st.groups is not None:
                group |= dict(zip(st.parts, st.groups, strict=True))
        assert {g for g in group.values() if "." in g}  # a large state's chunks are groups of their own
        for wave in waves[1:]:
            owner = {group[part]: i for i, batch in enumerate(wave) for _, part in batch}
            assert all(owner[group[part]] == i for i, batch in enumerate(wave) for _, part in batch)
    # one row group per level-a subtree below the partition level: the nation's table was never whole
    assert pq.ParquetFile(post / "block.parquet").metadata.num_row_groups == len(deep["parts"])
    # diagnostics: the running aggregates equal the figures of one concatenation of every part
    parts = stages.stored_parts(ctx, "topdown")
    diag = pd.read_parquet(post / "diagnostics.parquet")
    hists: list[Histogram] = []
    cons = product.constraints(public)
    for step in stages.postprocess_steps(ctx, "topdown")[1:]:
        level = int(step["step"].removeprefix("level-"))
        tables = [parts.part(step["step"], p)["hist"] for p in step["parts"]]
        whole = pa.concat_tables(tables)
        h = Histogram(*(whole.column(c).to_numpy().astype(np.int64) for c in ("UNIT", "CELL", "COUNT")))
        order = np.lexsort((h.cell, h.unit))
        h = Histogram(h.unit[order], h.cell[order], h.count[order])
        stored = pd.read_parquet(post / f"internal/{sp.levels[level]}.parquet")
        assert np.array_equal(stored.to_numpy(), np.column_stack([h.unit, h.cell, h.count])), level
        row = diag.iloc[level]
        if level:
            assert row["consistency_violations"] == consistency_violations(sp, level, h, hists[level - 1])
        assert row["invariant_violations"] == (0 if cons is None else cons.violations(level, h))
        assert row["units"] == sp.n_units(level) and row["level"] == sp.levels[level]
        hists.append(h)
    assert a >= 1 and (diag["consistency_violations"] == 0).all()
    # the release tables, written state by state, are the bytes of the whole-frame aggregation
    block = pd.read_parquet(post / "block.parquet")
    for name, frame in _whole_tables(product, block).items():
        want = frame.to_csv(index=False, sep="|", lineterminator="\n").encode()
        assert (tmp_path / f"store/runs/stream/release/topdown/{name}.csv").read_bytes() == want, name
    # the in-memory path of tables() (one frame) gives the same tables as the stored, grouped one
    est = StoredEstimates(ctx.post_store(), {f"runs/stream/postprocessed/topdown/{n}.parquet": {"name": n}
                                             for n in ("block",)})
    for name, frame in product.tables({"block": block}).items():
        pd.testing.assert_frame_equal(frame, product.tables(est)[name])
    # small states are aggregated together (here one chunk per table): the tables of one state per chunk
    batched = list(product.table_chunks(est))
    monkeypatch.setattr(topdown_product, "TABLE_CHUNK_ROWS", 1)
    per_state = list(product.table_chunks(est))
    assert len(batched) == len(STANDARD_LEVELS) < len(per_state)
    for name in dict.fromkeys(n for n, _ in per_state):
        pd.testing.assert_frame_equal(pd.concat([c for n, c in batched if n == name], ignore_index=True),
                                      pd.concat([c for n, c in per_state if n == name], ignore_index=True))


def test_grouped_reader_gives_complete_groups_in_order_whatever_the_row_groups(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    rows = [("02001", 1), ("01002", 2), ("02003", 3), ("03001", 4), ("01009", 5), ("03002", 6), ("04000", 7)]
    chunks = [rows[0:2], rows[2:4], rows[4:6], rows[6:]]
    tables = iter(pa.table({"GEOID": [g for g, _ in c], "COUNT": pa.array([n for _, n in c], pa.int64())})
                  for c in chunks)
    store.write_parquet("e/block.parquet", tables)
    est = StoredEstimates(store, {"e/block.parquet": {"name": "block"}})
    got = [(g["GEOID"].str[:2].unique().tolist(), g["COUNT"].tolist()) for g in est.groups("block", "GEOID", 2)]
    assert got == [(["01"], [2, 5]), (["02"], [1, 3]), (["03"], [4, 6]), (["04"], [7])]
    assert list(est) == ["block"] and est["block"]["COUNT"].tolist() == [1, 2, 3, 4, 5, 6, 7]


def test_a_bad_row_in_a_later_chunk_names_its_row_and_publishes_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    raw = topdown_release(tmp_path, "bad")
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    store = ctx.post_store()
    prefix = "runs/bad/release/topdown/"
    before = {k: store.get(k) for k in store.list(prefix)}
    state = pd.read_csv(io.BytesIO(before[prefix + "topdown_state.csv"]), sep="|", dtype=str)
    product_cls = type(ctx.plugin("topdown").product(ctx.product_config("topdown")))
    streamed = product_cls.table_chunks

    def broken(self, estimates):  # type: ignore[no-untyped-def]
        seen = 0
        for name, chunk in streamed(self, estimates):
            if name == "topdown_state":
                seen += 1
                if seen == 2:  # the second state's chunk: its first row gets a fractional count
                    chunk = chunk.astype({"COUNT": object})
                    chunk.iloc[0, chunk.columns.get_loc("COUNT")] = "1.5"
            yield name, chunk

    monkeypatch.setattr(product_cls, "table_chunks", broken)
    monkeypatch.setattr(topdown_product, "TABLE_CHUNK_ROWS", 1)  # one state per chunk
    monkeypatch.setattr(release, "VALIDATION_ROWS", 1)  # every chunk validated on its own
    for k in before:
        store.delete(k)
    first_state_rows = int((state["GEOID"] == state["GEOID"].iloc[0]).sum())
    with pytest.raises(InputError, match=f"row {first_state_rows + 2}, column COUNT"):
        release.write_product_tables(ctx, "topdown", StoredEstimates(
            store, stages.manifest_if_current(ctx, "postprocess", "topdown",
                                              stages._measurement_hashes(ctx, "topdown"))["outputs"]),
            ctx.ledger.plan_record())
    assert store.list(prefix) == []
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "store" / prefix).iterdir())


def _grouped(b: pd.DataFrame, width: int) -> pd.DataFrame:
    return (pd.DataFrame({"GEOID": b["GEOID"].str[:width], "CELL": b["CELL"], "COUNT": b["COUNT"]})
            .groupby(["GEOID", "CELL"], sort=True, as_index=False).sum())


def test_level_sums_are_the_string_group_by_of_every_level() -> None:
    """Integer-keyed sums per level (``_level_sums``) equal the string group-by they replace, frame for frame
    (values, order, dtypes), on rows in any order with repeated (block, cell) pairs; any other GEOID form, a cell
    outside the schema or no rows hands the chunk back to the group-by."""
    rng = np.random.default_rng(21)
    n_cells, n = 2016, 20_000
    blocks = np.unique(rng.integers(0, 10**15, 600))
    blocks = np.concatenate([blocks, blocks[:5] // 10**4 * 10**4 + 7])  # blocks sharing a tract
    geoid = pd.Series([f"{g:015d}" for g in rng.choice(blocks, n)], dtype="string").iloc[::-1]
    b = pd.DataFrame({"GEOID": geoid.to_numpy(), "CELL": rng.integers(0, n_cells, n),
                      "COUNT": rng.integers(0, 50, n)}, index=rng.permutation(n))
    b["GEOID"] = b["GEOID"].astype("string")
    cells, counts = b["CELL"].to_numpy(np.int64), b["COUNT"].to_numpy(np.int64)
    sums = topdown_product._level_sums(b["GEOID"], cells, counts, n_cells)
    assert sums is not None and sorted(sums) == [2, 5, 11, 12, 15]
    for width, frame in sums.items():
        pd.testing.assert_frame_equal(frame, _grouped(b, width), check_dtype=True)
    assert len(sums[15]) < n  # repeated pairs were summed
    for bad in (b.assign(GEOID=b["GEOID"].str[:14]), b.assign(GEOID=b["GEOID"].str.replace("0", "a", n=1))):
        assert topdown_product._level_sums(bad["GEOID"], cells, counts, n_cells) is None
    assert topdown_product._level_sums(b["GEOID"], cells, counts, int(cells.max())) is None
    assert topdown_product._level_sums(b["GEOID"].iloc[:0], cells[:0], counts[:0], n_cells) is None
