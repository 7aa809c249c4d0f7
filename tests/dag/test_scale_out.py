"""Scale-out: TopDown's post-processing in independent parts (per state, per family), mapped onto threads or a
Dask cluster, gives the same release bytes; parts are checkpoints a resumed run reuses."""

from __future__ import annotations

import json
import os
import uuid
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from dasflow.config import parse_release_config
from dasflow.errors import InputError, IntegrityError, LedgerRefusal
from dasflow.io.store import LocalStore, ObjectStore, S3Store
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config, open_run
from dasflow.products.topdown.partitioned import PartitionedTopDown
from dasflow.release.stage import release_stage
from tests.dag.helpers import hashed_keys, local_release, release_files, topdown_release
from tests.dag.test_pipeline import run_all
from tests.servers import KEY, SECRET, free_port, make_bucket, moto_server, s3_client


def test_topdown_post_processing_comes_in_parts_per_state_and_level(tmp_path: Path) -> None:
    """Parts per level below the partition level: a unit's subtree alone, or consecutive small units packed
    together up to the ``segment_blocks`` bound (here 12 blocks; the default 25,000 packs a test census whole)."""
    raw = topdown_release(tmp_path, "parts", segment_blocks=12)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    steps = stages.postprocess_steps(ctx, "topdown")
    names = [s["step"] for s in steps]
    assert names[:2] == ["combine", "level-0"] and names[2:] == [f"level-{l}" for l in range(1, len(names) - 1)]
    wide = [s for s in steps if len(s["parts"]) > 1]
    assert wide, "some level is split into independent parts"
    assert any("-" in p for s in wide for p in s["parts"]), "small units share a part"
    parts = stages.stored_parts(ctx, "topdown")
    for s in steps:
        for p in s["parts"]:
            assert parts.done(s["step"], p) is not None
    # the combined estimates are consistent integers: children sum to their parents at every level
    diag = pd.read_parquet(tmp_path / "store/runs/parts/postprocessed/topdown/diagnostics.parquet")
    assert (diag["consistency_violations"] == 0).all()
    block = pd.read_csv(tmp_path / "store/runs/parts/release/topdown/topdown_block.csv", sep="|")
    total = json.loads((tmp_path / "store/public/topdown/invariants.json").read_text())["total"]
    assert int(block["COUNT"].sum()) == total and (block["COUNT"] >= 0).all()


def test_parts_are_checkpoints_a_rerun_reuses(tmp_path: Path) -> None:
    raw = topdown_release(tmp_path, "reuse")
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    before = release_files(tmp_path / "store", "reuse")
    parts = stages.stored_parts(ctx, "topdown")
    last = stages.postprocess_steps(ctx, "topdown")[-1]
    victim = parts.manifest_key(last["step"], last["parts"][0])
    stamp = {k: (tmp_path / "store" / k).stat().st_mtime_ns
             for k in ctx.store.list(parts.prefix) if k.endswith(".json") and k != victim}
    # a worker died before writing one part's manifest, so the stage never finished: a resumed run recomputes
    # that part only
    ctx.store.delete(victim)
    ctx.store.delete("runs/reuse/manifests/postprocess/topdown.json")
    stages.postprocess_stage(open_run("reuse", str(tmp_path / "store")), "topdown")
    again = {k: (tmp_path / "store" / k).stat().st_mtime_ns for k in stamp}
    assert again == stamp
    assert parts.done(last["step"], last["parts"][0]) is not None
    release_stage(open_run("reuse", str(tmp_path / "store")))
    assert release_files(tmp_path / "store", "reuse") == before


def test_a_part_file_is_checked_against_its_manifest_when_it_is_read(tmp_path: Path) -> None:
    """Readers verify the bytes they use: a part file changed after its manifest was written fails loudly
    (IntegrityError) when read, through a fresh instance as on another worker; a deleted one makes the part not
    done (recomputed); the unchanged files of the same part still read."""
    raw = topdown_release(tmp_path, "check")
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    step = stages.postprocess_steps(ctx, "topdown")[-1]
    part = step["parts"][0]
    fresh = stages.stored_parts(open_run("check", str(tmp_path / "store")), "topdown")
    record = fresh.done(step["step"], part)
    assert record is not None and set(record["names"].values()) == {"hist", "run", "status"}
    key = next(k for k, name in record["names"].items() if name == "hist")
    path = tmp_path / "store" / key
    original = path.read_bytes()
    path.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    other = stages.stored_parts(open_run("check", str(tmp_path / "store")), "topdown")
    assert other.done(step["step"], part) is not None  # existence only: the bytes are checked on read
    assert set(other.part(step["step"], part, ["run", "status"])) == {"run", "status"}
    with pytest.raises(IntegrityError, match="part manifest"):
        other.part(step["step"], part)
    path.write_bytes(original)
    assert set(other.part(step["step"], part)) == {"hist", "run", "status"}
    path.unlink()
    assert stages.stored_parts(open_run("check", str(tmp_path / "store")), "topdown").done(step["step"], part) is None


def test_a_worker_derives_the_layout_once_and_holds_no_answers_between_batches(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker's context keeps one partitioner: the parts layout (national arrays at scale) is derived once for
    all its batches, not once per batch; after each batch it holds no decoded measurement segment; the batches
    recompute the same part bytes (estimates and statuses; the run table holds timings)."""
    import dasflow.products.topdown.partitioned as tdp

    raw = topdown_release(tmp_path, "once", segment_blocks=12)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    parts = stages.stored_parts(ctx, "topdown")
    files = sorted(k for k in ctx.store.list(parts.prefix) if k.endswith(("/hist.parquet", "/status.parquet")))
    before = {k: ctx.store.get(k) for k in files}
    for k in ctx.store.list(parts.prefix):
        ctx.store.delete(k)
    calls: list[int] = []
    real = tdp.parts_layout
    monkeypatch.setattr(tdp, "parts_layout", lambda sp, bound: calls.append(1) or real(sp, bound))
    worker = open_run("once", str(tmp_path / "store"))
    waves = stages.postprocess_waves(worker, "topdown", 2)
    batches = [b for w in waves for b in w]
    assert len(batches) > 2
    split = stages.partitioner(worker, "topdown")
    assert isinstance(split, PartitionedTopDown)
    for batch in batches:
        assert stages.postprocess_batch(worker, "topdown", batch)["computed"] == len(batch)
        assert stages.partitioner(worker, "topdown") is split and not split._decoded
    assert calls == [1]
    assert {k: ctx.store.get(k) for k in files} == before


@pytest.mark.parametrize("segment_blocks", [None, 12])
def test_parts_equal_the_single_process_estimator_for_the_detailed_strategy(tmp_path: Path,
                                                                            segment_blocks: int | None) -> None:
    """Detailed-only strategy: every family has a closed-form solve, so splitting families between parts must
    give exactly the single-process estimates — also when the parts read the deep levels' answers from the
    measurement segments their blocks lie in (nine states in 12-block segments: states drawn in county chunks,
    parts that span several segments, counties above the bound split again below their tracts; a small
    bottom-up bound keeps those levels out of the ``all`` part)."""
    more = {} if segment_blocks is None else {"states": ("44", "11", "10", "09", "02", "56", "50", "38", "46"),
                                              "persons": 8000, "bottom_up_max_entries": 2_000}
    raw = topdown_release(tmp_path, "exact", strategy="detailed", segment_blocks=segment_blocks, **more)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    plugin = ctx.plugin("topdown")
    cfg = ctx.product_config("topdown")
    public = plugin.public_inputs(ctx.post_store(), ctx.config.inputs, cfg)
    if segment_blocks is not None:
        split = stages.partitioner(ctx, "topdown")
        assert isinstance(split, PartitionedTopDown)
        sp, lay = split._layout(public)
        deep = split._whole(sp, lay.a) + 1
        assert deep < sp.n_levels
        spans = [split._placement(sp, lay, l)[r] for l in range(deep, sp.n_levels)
                 for r in np.unique(lay.own[l]).tolist()]
        assert any(len(w) > 1 for w in spans) and any("." in x for w in spans for x in w)
        assert any(n.count(".") >= 2 for n in lay.names)  # a county above the bound split again below it
    whole = plugin.product(cfg).postprocess(stages.load_measurements(ctx, "topdown"), public)
    split = pd.read_parquet(tmp_path / "store/runs/exact/postprocessed/topdown/block.parquet")
    pd.testing.assert_frame_equal(whole["block"].reset_index(drop=True), split.reset_index(drop=True))
    listing = pd.read_parquet(tmp_path / "store/runs/exact/postprocessed/topdown/invariants.parquet")
    pd.testing.assert_frame_equal(whole["invariants"].reset_index(drop=True), listing.reset_index(drop=True))
    for level in [k for k in whole if k.startswith("internal/")]:
        got = pd.read_parquet(tmp_path / f"store/runs/exact/postprocessed/topdown/{level}.parquet")
        assert np.array_equal(whole[level].to_numpy(), got.to_numpy()), level


def _nmf_tables(store_dir: Path, release_id: str) -> dict[str, pd.DataFrame]:
    """Every stored NMF object of a release (segments, indexes, whole keys) as its table, metadata aside (the
    binding in the metadata names the store, which differs between two test directories)."""
    base = store_dir / "runs" / release_id / "measurements"
    return {p.relative_to(base).as_posix(): pq.read_table(p).replace_schema_metadata(None).to_pandas()
            for p in sorted(base.rglob("*.parquet"))}


def _ready_to_measure(tmp: Path, release_id: str) -> tuple[Path, RunContext]:
    raw = topdown_release(tmp, release_id, segment_blocks=12,
                          states=("44", "11", "10", "09", "02", "56", "50", "38", "46"), persons=8000)
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp / "store"))
    stages.validate_stage(ctx, "topdown")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "topdown")
    return tmp / "store", ctx


def test_measurement_batches_drawn_in_any_order_and_after_a_failure_give_the_serial_nmfs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TopDown's segments drawn ahead of the measure stage in batches by state (as Dask workers draw them): one
    batch failing mid-way, then all of them in reverse order, one of them twice; the measure stage then commits
    every key. Each segment is drawn exactly once, and the NMFs equal the serial measure stage's."""
    ref_dir, ref = _ready_to_measure(tmp_path / "serial", "batches")
    stages.measure_stage(ref, "topdown")
    expected = _nmf_tables(ref_dir, "batches")
    store_dir, ctx = _ready_to_measure(tmp_path / "batched", "batches")
    batches = stages.measure_batches(ctx, "topdown")
    pairs = [tuple(pair) for batch in batches for pair in batch]
    assert len(pairs) == len(set(pairs)) and len(batches) >= 5
    obj: Any = ctx.plugin("topdown").product(ctx.product_config("topdown"))
    keyed = {spec.key: native for spec, native in stages.planned(ctx, "topdown")}
    wanted = {(key, seg) for key, native in keyed.items() for seg in obj.segments(native) or []}
    assert set(pairs) == wanted  # every segment of every segmented key, once
    for batch in batches:  # a batch is the segments of one set of partitions (a state, or a run of small ones)
        assert len({tuple(obj.segment_parts(keyed[k], s)) for k, s in batch}) == 1
    assert [len(b) for b in batches] == sorted((len(b) for b in batches), reverse=True)
    assert any("." in s for _, s in pairs)  # county chunks of a large state are drawn too

    real = obj.measure_segment
    calls: list[str] = []

    def lost_worker(prepared: Any, spec: Any, segment: str, g: Any) -> Any:
        calls.append(segment)
        if len(calls) == 2:
            raise OSError("worker lost")
        return real(prepared, spec, segment, g)

    monkeypatch.setattr(obj, "measure_segment", lost_worker)
    with pytest.raises(OSError, match="worker lost"):
        stages.measure_batch(ctx, "topdown", batches[0])
    monkeypatch.undo()
    drawn = [stages.measure_batch(ctx, "topdown", b)["drawn"] for b in reversed(batches)]
    assert sum(drawn) == len(pairs) - 1  # the segment stored before the failure is reused, never redrawn
    assert stages.measure_batch(ctx, "topdown", batches[0]) == {"segments": len(batches[0]), "drawn": 0}
    out = stages.measure_stage(ctx, "topdown")
    unsegmented = sum(1 for native in keyed.values() if not obj.segments(native))
    assert out["drawn_now"] == unsegmented  # only the keys at and above the state level are drawn here
    got = _nmf_tables(store_dir, "batches")
    assert sorted(got) == sorted(expected)
    for name, table in expected.items():
        pd.testing.assert_frame_equal(got[name], table, obj=name)
    assert stages.measure_batches(ctx, "topdown") == []  # every key committed
    assert stages.measure_batch(ctx, "topdown", batches[-1])["drawn"] == 0
    # an attacker deletes one segment, its entry, the key's index and commit: this context drew before the
    # measure manifest recorded the key, and must still refuse to draw it again
    key, segment = batches[-1][0]
    for gone in (ctx.ledger.segment_key(key, segment), ctx.ledger._segment_entry(key, segment),
                 ctx.ledger._entry(key, "committed"), ctx.ledger.nmf_key(key)):
        ctx.store.delete(gone)
    with pytest.raises(IntegrityError, match="drawn before"):
        stages.measure_batch(ctx, "topdown", [[key, segment]])
    with pytest.raises(LedgerRefusal, match="not planned"):
        stages.measure_batch(ctx, "topdown", [["topdown/nope", "44"]])
    spec = next(s for s, n in stages.planned(ctx, "topdown") if obj.segments(n))
    with pytest.raises(LedgerRefusal, match="not segments of the key"):
        ctx.ledger.draw_segments(spec, obj.segments(keyed[spec.key]), ["99"], real,
                                 attempt="x")


def test_only_segmented_non_adaptive_products_are_measured_in_batches(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    store, cfg = local_release(tmp_path / "counts")
    ctx = freeze_config(cfg, store)
    run_all(ctx)
    assert stages.measure_batches(ctx, "counts") == []  # not segmented
    with pytest.raises(InputError, match="not drawn in batches"):
        stages.measure_batch(ctx, "counts", [["counts/x", "01"]])
    _, td = _ready_to_measure(tmp_path / "adaptive", "adaptive")
    obj: Any = td.plugin("topdown").product(td.product_config("topdown"))
    assert stages.measure_batches(td, "topdown")
    monkeypatch.setattr(obj, "measure_segment_adaptive", lambda *a: None, raising=False)
    assert stages.measure_batches(td, "topdown") == []  # a later key reads an earlier one


@pytest.mark.slow
def test_dask_local_cluster_gives_byte_identical_release_files(tmp_path: Path) -> None:
    """The same release through the Prefect flow on the thread runner and on a 2-worker
    ``distributed.LocalCluster``: identical release bytes, and the parts ran as mapped tasks."""
    from dasflow.flows.release import run_release

    results = {}
    nmfs: dict[str, dict[str, pd.DataFrame]] = {}
    for runner in ("thread", "dask"):
        raw = topdown_release(tmp_path / runner, "scale-out", segment_blocks=12) | {"task_runner": runner}
        out = run_release(parse_release_config(raw))["products"]["topdown"]
        assert out["postprocess_parts"] >= 4
        # threads run the parts in this process; Dask on the cluster's worker processes
        assert (out["part_processes"] == [os.getpid()]) == (runner == "thread"), out["part_processes"]
        # on Dask the segments are drawn on the workers first; on threads the measure task draws them all
        assert (out["measure_batches"] > 0) == (runner == "dask"), out["measure_batches"]
        assert os.getpid() not in out["measure_processes"]
        results[runner] = release_files(tmp_path / runner / "store", "scale-out")
        nmfs[runner] = _nmf_tables(tmp_path / runner / "store", "scale-out")
    assert any(n.startswith("topdown/") for n in results["thread"])
    assert results["thread"] == results["dask"]
    assert sorted(nmfs["thread"]) == sorted(nmfs["dask"])
    for name, table in nmfs["thread"].items():
        pd.testing.assert_frame_equal(nmfs["dask"][name], table, obj=name)


def test_command_line_execution_settings_override_the_config_not_its_hash(tmp_path: Path) -> None:
    from dasflow.cli import _parser
    from dasflow.flows.cli import _execution

    cfg = parse_release_config(topdown_release(tmp_path, "cli"))
    args = _parser().parse_args(["run", "x.json", "--dask-address", "tcp://10.0.0.5:8786"])
    out = _execution(cfg, args)
    assert (out.task_runner, out.dask_address) == ("dask", "tcp://10.0.0.5:8786")
    assert out.measure_on_workers is None  # an agency's cluster: the flow process measures unless asked
    assert out.sha256() == cfg.sha256()  # the same release, resumable on another runner
    args = _parser().parse_args(["resume", "cli", "--store", "s", "--task-runner", "thread"])
    assert _execution(cfg, args).task_runner == "thread"
    assert _execution(cfg, _parser().parse_args(["run", "x.json"])) is cfg
    assert _parser().parse_args(["run", "x.json"]).product_lanes == 1
    assert _parser().parse_args(["resume", "cli", "--product-lanes", "3"]).product_lanes == 3
    with pytest.raises(SystemExit):
        _parser().parse_args(["run", "x.json", "--product-lanes", "0"])
    for flag, want in (("--measure-on-workers", True), ("--no-measure-on-workers", False)):
        got = _execution(cfg, _parser().parse_args(["run", "x.json", "--dask-address", "tcp://h:1", flag]))
        assert got.measure_on_workers is want and got.sha256() == cfg.sha256()


def test_the_local_cluster_measures_on_its_workers_unless_told_not_to(tmp_path: Path) -> None:
    """The 2-worker cluster dasflow starts runs on this machine as child processes: it draws the measurements
    unless ``measure_on_workers`` is false; a configured cluster's address is passed through unchanged."""
    from dasflow.flows.release import local_dask_cluster

    cfg = parse_release_config(topdown_release(tmp_path, "local") | {"task_runner": "dask"})
    for setting, want in ((None, True), (False, False), (True, True)):
        with local_dask_cluster(cfg.model_copy(update={"measure_on_workers": setting})) as run_cfg:
            assert run_cfg.dask_address and run_cfg.measure_on_workers is want
    external = cfg.model_copy(update={"dask_address": "tcp://10.0.0.5:8786"})
    with local_dask_cluster(external) as run_cfg:
        assert run_cfg is external and not run_cfg.measure_on_workers


def test_the_local_cluster_closes_its_workers_before_its_scheduler(tmp_path: Path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                     capfd) -> None:
    """At the end of a run the local cluster's workers leave while the scheduler is up, so no worker's heartbeat
    meets a closed scheduler (that race logs a traceback on the operator's terminal, dask/distributed#7192):
    when the cluster closes, no worker is registered any more, and nothing was logged with a traceback."""
    import distributed

    from dasflow.flows.release import local_dask_cluster

    seen: list[int] = []
    close = distributed.LocalCluster.close

    def spy(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(len(self.scheduler_info.get("workers", {})))
        return close(self, *args, **kwargs)

    monkeypatch.setattr(distributed.LocalCluster, "close", spy)
    cfg = parse_release_config(topdown_release(tmp_path, "local") | {"task_runner": "dask"})
    with local_dask_cluster(cfg) as run_cfg, distributed.Client(run_cfg.dask_address) as client:
        assert client.submit(sum, range(10)).result() == 45
        assert len(client.scheduler_info()["workers"]) == 2
    assert seen and seen[0] == 0
    assert "Traceback" not in capfd.readouterr().err


def test_parts_are_grouped_into_waves_of_batches_sized_by_public_work() -> None:
    from dasflow.pipeline.partitions import task_waves
    from dasflow.products.partition import PostStep

    parts = tuple("abcdef")
    weights = (50.0, 10.0, 10.0, 10.0, 10.0, 10.0)
    steps = [PostStep("combine", ("all",)), PostStep("root", ("root",)), PostStep("top", ("all",)),
             PostStep("l2", parts, weights=weights, batch_weight=40.0),
             PostStep("l3", parts, chained=True, weights=weights, batch_weight=40.0),
             PostStep("l4", parts[:3], chained=True, weights=weights[:3], batch_weight=40.0)]
    waves = task_waves(steps, slots=2)
    assert waves[0] == [[("combine", "all"), ("root", "root"), ("top", "all")]]  # single parts: one task
    # 100 units of work at 40 per task: 3 batches (more than the 2 slots), heaviest first onto the lightest
    # batch: the heaviest chain alone, then b, d, f (30) and c, e (20)
    assert [sorted({p for _, p in b}) for b in waves[1]] == [["a"], ["b", "d", "f"], ["c", "e"]]
    assert waves[1][0] == [("l2", "a"), ("l3", "a"), ("l4", "a")]
    done = sorted(pair for batch in waves[1] for pair in batch)
    assert done == sorted([(s, p) for s in ("l2", "l3") for p in parts] + [("l4", p) for p in "abc"])
    for batch in waves[1]:  # a chain's parts stay together, in step order
        for step, part in batch:
            if step != "l2":
                assert batch.index((f"l{int(step[1]) - 1}", part)) < batch.index((step, part))
    # every slot gets work even when the work is below one batch; no batch_weight: one part per task
    assert len(task_waves(steps, slots=6)[1]) == 6
    plain = [PostStep("x", ("all",)), PostStep("y", parts)]
    assert task_waves(plain, slots=2)[1] == [[("y", p)] for p in parts]
    # parts that share an input (groups: a measurement segment) stay in one task, packed by their summed work:
    # {a} 50, {b, c} 20, {d, e, f} 30 onto 3 batches
    grouped = [PostStep("l2", parts, weights=weights, batch_weight=40.0, groups=("s", "t", "t", "u", "u", "u")),
               PostStep("l3", parts, chained=True, weights=weights, batch_weight=40.0)]
    waves = task_waves(grouped, slots=2)
    assert [sorted({p for _, p in b}) for b in waves[0]] == [["a"], ["d", "e", "f"], ["b", "c"]]
    assert waves[0][2] == [("l2", "b"), ("l3", "b"), ("l2", "c"), ("l3", "c")]


def _s3_copy(local: Path, store: ObjectStore) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            store.put(path.relative_to(local).as_posix(), path.read_bytes())


@pytest.mark.slow
@pytest.mark.xdist_group("s3servers")
def test_cli_release_on_an_existing_dask_cluster_with_an_s3_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``dasflow run --dask-address --measure-on-workers`` against a separately started
    ``distributed.LocalCluster`` (the scheduler address only, as an agency's cluster) with the release on S3
    (moto): the workers draw the measurement segments and read and write the parts through S3 with their own
    credentials, and the release bytes equal the thread runner's."""
    import dask
    from distributed import LocalCluster

    from dasflow.cli import main
    from dasflow.flows.release import WORKER_DASK_CONFIG, WORKER_THREADS, _api_url, run_release

    raw = topdown_release(tmp_path / "t", "ext", segment_blocks=12)
    run_release(parse_release_config(raw))  # threads, local store: the reference
    expected = release_files(tmp_path / "t" / "store", "ext")
    with moto_server() as endpoint:
        bucket = f"dasflow-{uuid.uuid4().hex[:10]}"
        make_bucket(endpoint, bucket)
        creds = {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                 "AWS_DEFAULT_REGION": "us-east-1"}
        for k, v in creds.items():
            monkeypatch.setenv(k, v)
        store = S3Store(f"s3://{bucket}/census", client=s3_client(endpoint))
        fresh = topdown_release(tmp_path / "s", "ext", segment_blocks=12)  # the same synthetic inputs, uploaded
        _s3_copy(tmp_path / "s" / "store", store)
        config = tmp_path / "release.json"
        config.write_text(json.dumps(fresh | {"store": f"s3://{bucket}/census"}))
        with dask.config.set(WORKER_DASK_CONFIG), LocalCluster(  # type: ignore[no-untyped-call]
                n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None,
                env=creds | WORKER_THREADS | {"PREFECT_API_URL": _api_url()}) as cluster:
            assert main(["run", str(config), "--dask-address", cluster.scheduler_address,
                         "--measure-on-workers"]) == 0
        assert "release ext done" in capsys.readouterr().out
        root = "runs/ext/release/"
        got = {k.removeprefix(root): store.get(k) for k in store.list(root)}
        parts = [k for k in store.list("runs/ext/postprocessed/topdown/parts/") if k.endswith(".json")]
        reserved = [json.loads(store.get(k)) for k in store.list("runs/ext/ledger/entries/")
                    if k.endswith(".reserved.json")]
        probes = store.list("cluster-probes/")
    assert got == expected
    assert len(parts) >= 4  # the workers wrote the parts to S3
    # the segmented keys were reserved and drawn by the worker processes (--measure-on-workers), the rest here
    assert {r["pid"] for r in reserved if "segments" in r} - {os.getpid()}
    assert {r["pid"] for r in reserved if "segments" not in r} == {os.getpid()}
    assert probes == []  # the preflight's probe object is gone


def test_an_unreachable_dask_scheduler_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from dasflow.cli import main
    from dasflow.flows import release

    monkeypatch.setattr(release, "CONNECT_TIMEOUT", 1.0)
    config = tmp_path / "release.json"
    config.write_text(json.dumps(topdown_release(tmp_path, "down")))
    address = f"tcp://127.0.0.1:{free_port()}"
    assert main(["run", str(config), "--dask-address", address]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"Dask scheduler {address} is unreachable" in err, err
    assert not (tmp_path / "store" / "runs" / "down").exists()  # nothing frozen, nothing drawn


def test_a_segment_is_decoded_block_by_block_into_the_narrowest_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """``_segment_answers`` stacks an NMF table a few rows at a time, widening its array when a later block needs
    it: the same units, variances and answers (dtype and values) as stacking the whole table and compacting."""
    from dasflow.products.base import NOISY_COLUMN, VARIANCE_COLUMN
    from dasflow.products.topdown import partitioned as pt

    monkeypatch.setattr(pt, "DECODE_ROWS", 2)
    rows = [[1, -2, 3], [0, 5, 7], [300, 1, 2], [4, 4, 4], [-70000, 0, 1]]
    for n in (1, 2, 3, 5):
        table = pd.DataFrame({"UNIT": np.arange(10, 10 + n), NOISY_COLUMN: [np.array(r) for r in rows[:n]],
                              VARIANCE_COLUMN: [Fraction(1, 3)] * n})
        units, answers, variance = pt._segment_answers(table, 3)
        whole = pt._compact(np.stack(table[NOISY_COLUMN].to_list()))
        assert answers.dtype == whole.dtype and np.array_equal(answers, whole), n
        assert units.tolist() == list(range(10, 10 + n)) and np.allclose(variance, 1 / 3)
    assert pt._segment_answers(table.iloc[:0], 3)[1].shape == (0, 3)
    # an answer vector of another length (a block of one row too short, or every row one short) is refused
    from dasflow.errors import IntegrityError
    for bad in ([np.array(r) for r in rows[:2]] + [np.array([1, 2])], [np.array(r[:2]) for r in rows[:3]]):
        table = pd.DataFrame({"UNIT": np.arange(3), NOISY_COLUMN: bad, VARIANCE_COLUMN: [Fraction(1, 3)] * 3})
        with pytest.raises(IntegrityError, match="3 answers"):
            pt._segment_answers(table, 3)


def test_a_measurement_batch_hashes_its_own_partitions_and_refuses_a_tampered_one(tmp_path: Path) -> None:
    """A batch of segments verifies the prepared objects it reads (one state's, or a run of small states'), each
    against the SHA-256 its preprocess manifest records, not every partition of the nation; a partition replaced
    after preprocessing is an ``IntegrityError`` naming it, and nothing of the segments reading it is drawn."""
    _, ctx = _ready_to_measure(tmp_path, "verify")
    batches = stages.measure_batches(ctx, "topdown")
    prefix = f"{ctx.root}/prepared/topdown/"
    everything = [k for k in ctx.store.list(prefix) if k.endswith(".parquet")]
    hashed = hashed_keys(ctx.store)
    assert stages.measure_batch(ctx, "topdown", batches[-1])["drawn"] == len(batches[-1])
    read = {k for k in hashed if k.startswith(prefix) and k.endswith(".parquet")}
    assert read and len(read) < len(everything) / 2
    assert len([k for k in hashed if k in read]) == len(read)  # each once
    # a partition of another batch replaced by a valid Parquet file of other counts
    obj: Any = ctx.plugin("topdown").product(ctx.product_config("topdown"))
    keyed = {spec.key: native for spec, native in stages.planned(ctx, "topdown")}
    key, segment = batches[0][0]
    parts = obj.segment_parts(keyed[key], segment)
    names = {k.rsplit("/", 1)[1] for k in read}
    target = next(k for k in everything if k.rsplit("/", 1)[1] in names and any(f"part={p}/" in k for p in parts))
    frame = ctx.store.get_parquet(target)
    frame.iloc[0, -1] = frame.iloc[0, -1] + 1
    ctx.store.put_parquet(target, frame)
    before = sorted(ctx.store.list(f"{ctx.root}/measurements/"))
    with pytest.raises(IntegrityError, match="preprocess manifest") as caught:
        stages.measure_batch(ctx, "topdown", batches[0])
    assert target in str(caught.value)
    # segments of keys reading other (verified) frames may be drawn; none reading the replaced one is
    level = target.rsplit("/", 1)[1].removesuffix(".parquet")  # hist/{level}.parquet: that level's counts
    new = set(ctx.store.list(f"{ctx.root}/measurements/")) - set(before)
    assert not any(f"/topdown/{level}/" in k for k in new)
    assert any(f"/topdown/{level}/" in f"/{k}/" for k, _ in batches[0])
