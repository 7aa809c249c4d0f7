"""Scale-out: TopDown post-processing as mapped parts on the thread runner vs a Dask LocalCluster, and the
single-process estimator, on the same committed measurements.

    .venv/bin/python benchmarks/scale_out.py --persons 1000000 --states 10,11,23,30,33,38,44,50 [--workers 2]

One multi-state synthetic release (dasflow.synth; invariants: total, state populations, structural zeros from
the block facts) is validated, preprocessed and measured once; its store is then copied per run, so every run
post-processes the same seeded measurements:

``single_process``  the post-processing stage in this process, no task runner (the reference);
``thread``          the product subflow (its done stages skipped by their manifests) on the thread runner;
``dask``            the same on a LocalCluster of ``--workers`` single-threaded workers, started and warmed
                    (libraries imported) before the clock starts, as a standing cluster would be.

Reported per run: wall seconds, CPU seconds summed over every process (client with the in-process scheduler,
Prefect server, nannies, workers), both as ratios against the single-process run, the tasks (batches) and
parts, cluster start-up separately, and whether the estimate files are byte-identical to the single-process
run's. Before each timed run the objects left by earlier runs in this process are frozen (``gc.freeze``), so
the garbage collector does not rescan them (a ``dasflow run`` has no such history). ``estimator_only`` is
``Product.postprocess`` on measurements already in memory (no store I/O).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasflow import synth
from dasflow.config import parse_release_config
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, freeze_config, open_run


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


def tree_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of this process and each live descendant (Prefect server, Dask nannies and
    workers), by pid."""
    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            out[f"{p.pid} {' '.join(p.cmdline()[1:3])[:40]}"] = t.user + t.system
        except psutil.Error:
            pass
    return out


def thread_cpu(before: dict[int, tuple[str, float]] | None = None) -> dict[int, tuple[str, float]]:
    """CPU seconds of this process's threads by native id (with their Python names), or since ``before``
    (the 6 busiest)."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    now = {t.id: (names.get(t.id, "native"), t.user_time + t.system_time) for t in psutil.Process().threads()}
    if before is None:
        return now
    delta = {k: (n, round(c - before.get(k, (n, 0.0))[1], 2)) for k, (n, c) in now.items()}
    return dict(sorted(delta.items(), key=lambda kv: -kv[1][1])[:6])


def cpu_since(before: dict[str, float]) -> tuple[float, dict[str, float]]:
    after = tree_cpu()
    per = {k: round(v - before.get(k, 0.0), 2) for k, v in after.items() if v - before.get(k, 0.0) > 0.005}
    return sum(per.values()), per


def estimates(store_dir: Path) -> dict[str, bytes]:
    """The post-processed estimate files (not the diagnostics, which hold timings)."""
    root = store_dir / "runs/scale-out/postprocessed/topdown"
    return {p.name: p.read_bytes() for p in sorted(root.glob("*.parquet")) if p.name != "diagnostics.parquet"}


def estimator_only(ctx: RunContext) -> dict[str, float]:
    """``Product.postprocess`` alone on the same measurements (no parts; measurements and public inputs loaded
    before the clock starts)."""
    adapter = ctx.plugin("topdown")
    cfg = ctx.product_config("topdown")
    public = adapter.public_inputs(ctx.post_store(), ctx.config.inputs, cfg)
    measurements = stages.load_measurements(ctx, "topdown")
    t, c = time.perf_counter(), time.process_time()
    adapter.product(cfg).postprocess(measurements, public)
    return {"wall": time.perf_counter() - t, "cpu": time.process_time() - c}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=1_000_000)
    ap.add_argument("--states", default="10,11,23,30,33,38,44,50")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--runs", default="estimator,single,thread,dask",
                    help="which runs (single always runs: the reference)")
    ap.add_argument("--base", help="keep the measured base store here and reuse it when present")
    args = ap.parse_args()
    from distributed import Client

    from dasflow.flows.release import _api_url, local_dask_cluster, product_flow, task_runner

    _api_url()  # the flow's Prefect API (temporary server) up before anything is timed

    work = Path(tempfile.mkdtemp(prefix="dasflow-scale-out-"))
    base = Path(args.base) if args.base else work / "base"
    out: dict[str, Any] = {"persons": args.persons, "states": args.states, "load_before": os.getloadavg()}
    t = time.perf_counter()
    if (base / "config.json").exists():  # measured before (by other code: stages redone, NMFs reused)
        raw = json.loads((base / "config.json").read_text())
        ctx = open_run("scale-out", str(base))
        stages.validate_stage(ctx, "topdown")
    else:
        raw = build(base, args.persons, args.states.split(","), args.seed)
        ctx = freeze_config(parse_release_config(raw), LocalStore(base))
        stages.validate_stage(ctx, "topdown")
        stages.plan_stage(ctx)
        (base / "config.json").write_text(json.dumps(raw))
    stages.preprocess_stage(ctx, "topdown")
    stages.measure_stage(ctx, "topdown")
    out["prepare_seconds"] = time.perf_counter() - t
    out["steps"] = {s["step"]: len(s["parts"]) for s in stages.postprocess_steps(ctx, "topdown")}
    out["batches"] = {n: [[len(b) for b in wave] for wave in stages.postprocess_waves(ctx, "topdown", n)]
                      for n in (1, args.workers)}

    if "estimator" in args.runs.split(","):
        out["estimator_only"] = estimator_only(ctx)

    # the single-process run: what the product subflow does, as stage calls in this process with no task
    # runner (preprocess and measure skipped by their manifests; post-processing computes every part itself:
    # loads the measurements and public inputs, writes the parts and the estimates)
    shutil.copytree(base, work / "single")
    gc.collect()
    gc.freeze()
    before, t = tree_cpu(), time.perf_counter()
    for stage in (stages.preprocess_stage, stages.measure_stage, stages.postprocess_stage):
        stage(open_run("scale-out", str(work / "single")), "topdown")
    cpu, _ = cpu_since(before)
    out["single_process"] = {"wall": time.perf_counter() - t, "cpu": cpu}
    reference = estimates(work / "single")
    print("single", out["single_process"], flush=True)

    for runner in [r for r in ("thread", "dask") if r in args.runs.split(",")]:
        store_dir = work / runner
        shutil.copytree(base, store_dir)
        run_cfg = parse_release_config(raw | {"store": str(store_dir), "task_runner": runner})
        gc.collect()
        gc.freeze()  # objects of the earlier runs in this process: not rescanned by every collection of this one
        before, t0 = tree_cpu(), time.perf_counter()
        with local_dask_cluster(run_cfg, workers=args.workers) as live:
            if live.dask_address:  # a standing cluster has its libraries loaded: import them now, untimed
                with Client(live.dask_address, set_as_default=False) as client:  # type: ignore[no-untyped-call]
                    client.run(importlib.import_module, "dasflow.tasks.stages")
            start_cpu, _ = cpu_since(before)
            started = time.perf_counter() - t0
            before, t1, threads = tree_cpu(), time.perf_counter(), thread_cpu()
            result = product_flow.with_options(task_runner=task_runner(live))("scale-out", str(store_dir), "topdown")
            wall = time.perf_counter() - t1
            cpu, per = cpu_since(before)
            client_threads = thread_cpu(threads)
        single = out["single_process"]
        out[runner] = {"cluster_start_wall": started, "cluster_start_cpu": start_cpu, "wall": wall, "cpu": cpu,
                       "cpu_by_process": per, "client_threads": client_threads, "parts": result["postprocess_parts"],
                       "batches": result["postprocess_batches"], "processes": len(result["part_processes"]),
                       "cpu_over_single": cpu / single["cpu"], "speed_up_over_single": single["wall"] / wall,
                       "estimates_identical_to_single": estimates(store_dir) == reference}
        print(runner, out[runner], flush=True)
    out["load_after"] = os.getloadavg()
    for run in ("single", "thread", "dask"):  # post-processing spent nothing
        if (work / run).exists():
            assert open_run("scale-out", str(work / run)).ledger.spent().rho == ctx.ledger.spent().rho
    print(json.dumps(out, indent=1, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
