"""Scale-out: TopDown's post-processing in independent parts (per state, per family), mapped onto threads or a
Dask cluster, gives the same release bytes; parts are checkpoints a resumed run reuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config, open_run
from dasflow.release.stage import release_stage
from tests.dag.helpers import release_files, topdown_release
from tests.dag.test_pipeline import run_all


def test_topdown_post_processing_comes_in_parts_per_state_and_level(tmp_path: Path) -> None:
    raw = topdown_release(tmp_path, "parts")
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    steps = stages.postprocess_steps(ctx, "topdown")
    names = [s["step"] for s in steps]
    assert names[:2] == ["combine", "level-0"] and names[2:] == [f"level-{l}" for l in range(1, len(names) - 1)]
    wide = [s for s in steps if len(s["parts"]) > 1]
    assert wide, "some level is split into independent parts"
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


def test_parts_equal_the_single_process_estimator_for_the_detailed_strategy(tmp_path: Path) -> None:
    """Detailed-only strategy: every family has a closed-form solve, so splitting families between parts must
    give exactly the single-process estimates."""
    raw = topdown_release(tmp_path, "exact", strategy="detailed")
    ctx = freeze_config(parse_release_config(raw), LocalStore(tmp_path / "store"))
    run_all(ctx)
    plugin = ctx.plugin("topdown")
    cfg = ctx.product_config("topdown")
    public = plugin.public_inputs(ctx.post_store(), ctx.config.inputs, cfg)
    whole = plugin.product(cfg).postprocess(stages.load_measurements(ctx, "topdown"), public)
    split = pd.read_parquet(tmp_path / "store/runs/exact/postprocessed/topdown/block.parquet")
    pd.testing.assert_frame_equal(whole["block"].reset_index(drop=True), split.reset_index(drop=True))
    listing = pd.read_parquet(tmp_path / "store/runs/exact/postprocessed/topdown/invariants.parquet")
    pd.testing.assert_frame_equal(whole["invariants"].reset_index(drop=True), listing.reset_index(drop=True))
    for level in [k for k in whole if k.startswith("internal/")]:
        got = pd.read_parquet(tmp_path / f"store/runs/exact/postprocessed/topdown/{level}.parquet")
        assert np.array_equal(whole[level].to_numpy(), got.to_numpy()), level


@pytest.mark.slow
def test_dask_local_cluster_gives_byte_identical_release_files(tmp_path: Path) -> None:
    """The same release through the Prefect flow on the thread runner and on a 2-worker
    ``distributed.LocalCluster``: identical release bytes, and the parts ran as mapped tasks."""
    from dasflow.flows.release import run_release

    results = {}
    for runner in ("thread", "dask"):
        raw = topdown_release(tmp_path / runner, "scale-out") | {"task_runner": runner}
        out = run_release(parse_release_config(raw))["products"]["topdown"]
        assert out["postprocess_parts"] >= 4
        # threads run the parts in this process; Dask on the cluster's worker processes
        assert (out["part_processes"] == [os.getpid()]) == (runner == "thread"), out["part_processes"]
        results[runner] = release_files(tmp_path / runner / "store", "scale-out")
    assert any(n.startswith("topdown/") for n in results["thread"])
    assert results["thread"] == results["dask"]


def test_command_line_execution_settings_override_the_config_not_its_hash(tmp_path: Path) -> None:
    from dasflow.cli import _parser
    from dasflow.flows.cli import _execution

    cfg = parse_release_config(topdown_release(tmp_path, "cli"))
    args = _parser().parse_args(["run", "x.json", "--dask-address", "tcp://10.0.0.5:8786"])
    out = _execution(cfg, args)
    assert (out.task_runner, out.dask_address) == ("dask", "tcp://10.0.0.5:8786")
    assert out.sha256() == cfg.sha256()  # the same release, resumable on another runner
    args = _parser().parse_args(["resume", "cli", "--store", "s", "--task-runner", "thread"])
    assert _execution(cfg, args).task_runner == "thread"
    assert _execution(cfg, _parser().parse_args(["run", "x.json"])) is cfg
