"""Scale-out: TopDown post-processing as mapped parts on the thread runner vs a Dask LocalCluster, and the
single-process estimator, on the same committed measurements.

    .venv/bin/python benchmarks/scale_out.py --persons 1000000 --states 10,11,23,30,33,38,44,50 [--workers 2]

One multi-state synthetic release (dasflow.synth; invariants: total, state populations, structural zeros from
the block facts) is validated, preprocessed and measured once; its store is then copied per runner and only the
product subflow runs (its done stages are skipped by their manifests), so the timed part is post-processing:
mapping the parts (combine, root, one part per state and level) and combining them. Reported: wall time per
runner, cluster start-up separately, the parts' own compute seconds, and whether the estimates are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

import pandas as pd
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasflow import synth
from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config, open_run


def build(root: Path, persons: int, states: list[str], seed: int) -> dict[str, Any]:
    store = LocalStore(root)
    data = store.local_path("confidential/synth")
    synth.generate(data, persons=persons, seed=seed, states=states, formats=("topdown",))
    for name in ("GRF-C.txt", "block_facts.csv", "invariants.json"):  # the synthetic census's public files
        store.put(f"public/topdown/{name}", (data / "topdown" / "public" / name).read_bytes())
    config = {"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "63/25", "privacy_defn": "zcdp",
              "strategy": "pl94"}
    return {"release_id": "scale-out", "universe": "US", "store": str(root),
            "inputs": {"topdown": "confidential/synth/topdown/persons/", "topdown_public": "public/topdown/"},
            "products": [{"name": "topdown", "config_text": json.dumps(config)}],
            "cap": {"rho": "63/25"}, "rng": {"mode": "test", "seed": seed}}


def tree_cpu() -> float:
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=1_000_000)
    ap.add_argument("--states", default="10,11,23,30,33,38,44,50")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    from dasflow.flows.release import _api_url, local_dask_cluster, product_flow, task_runner

    _api_url()  # the flow's Prefect API (temporary server) up before anything is timed

    work = Path(tempfile.mkdtemp(prefix="dasflow-scale-out-"))
    out: dict[str, Any] = {"persons": args.persons, "states": args.states, "load_before": os.getloadavg()}
    t = time.perf_counter()
    raw = build(work / "base", args.persons, args.states.split(","), args.seed)
    ctx = freeze_config(parse_release_config(raw), LocalStore(work / "base"))
    stages.validate_stage(ctx, "topdown")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "topdown")
    stages.measure_stage(ctx, "topdown")
    out["prepare_seconds"] = time.perf_counter() - t
    steps = stages.postprocess_steps(ctx, "topdown")
    out["steps"] = {s["step"]: len(s["parts"]) for s in steps}

    # the single-process estimator on the same measurements (no parts)
    plugin = ctx.plugin("topdown")
    cfg = ctx.product_config("topdown")
    public = plugin.public_inputs(ctx.post_store(), ctx.config.inputs, cfg)
    measurements = stages.load_measurements(ctx, "topdown")
    t, c = time.perf_counter(), time.process_time()
    whole = plugin.product(cfg).postprocess(measurements, public)
    out["single_process"] = {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}

    blocks: dict[str, pd.DataFrame] = {}
    for runner in ("thread", "dask"):
        store_dir = work / runner
        shutil.copytree(work / "base", store_dir)
        run_cfg = parse_release_config(raw | {"store": str(store_dir), "task_runner": runner})
        t0 = time.perf_counter()
        with local_dask_cluster(run_cfg, workers=args.workers) as live:
            started = time.perf_counter() - t0
            cpu0 = tree_cpu()
            t1 = time.perf_counter()
            result = product_flow.with_options(task_runner=task_runner(live))("scale-out", str(store_dir), "topdown")
            wall = time.perf_counter() - t1
            cpu = tree_cpu() - cpu0
        parts_dir = store_dir / "runs/scale-out/postprocessed/topdown/parts"
        part_seconds = sum(float(pd.read_parquet(p)["SECONDS"].iloc[0]) for p in parts_dir.rglob("run.parquet"))
        blocks[runner] = pd.read_parquet(store_dir / "runs/scale-out/postprocessed/topdown/block.parquet")
        out[runner] = {"cluster_start": started, "wall": wall, "cpu_tree": cpu, "parts": result["postprocess_parts"],
                       "processes": len(result["part_processes"]), "parts_compute_seconds": part_seconds}
        print(runner, out[runner], flush=True)
    out["identical_thread_dask"] = bool(blocks["thread"].equals(blocks["dask"]))
    out["single_vs_parts_block_equal"] = bool(
        whole["block"].reset_index(drop=True).equals(blocks["thread"].reset_index(drop=True)))
    out["load_after"] = os.getloadavg()
    assert open_run("scale-out", str(work / "thread")).ledger.spent().rho == ctx.ledger.spent().rho
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
