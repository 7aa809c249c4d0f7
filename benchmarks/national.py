"""National-run benchmark (issue #20 item 5): one seeded release of every product on a synthetic US census.

Per size (``--persons``): a synthetic census of the 50 states and DC (``dasflow.synth.generate``) in the layouts
the products read, per state where a product has a partitioned layout (``{format}_states``: PHSafe's state
folders, SafeTab-P's per-state person-record files), else the format itself (TopDown's and group sizes' per-state
Parquet), written into a fresh local store; then one release of all registered demo products through the stage
functions with their demo configs (``dasflow/demo_data/*.json``), seeded test mode (the inputs are listed in the
synthetic census's manifest). Every step — synth, each validate/plan/preprocess/measure/postprocess per
product, the release stage — runs in a fresh subprocess, so each one's peak RSS is its own (``wait4``
``ru_maxrss``: the interpreter and imports included, ≈ 0.2-0.3 GB); its wall and CPU come both from outside
(the whole subprocess, imports included) and from the stage manifest's ``metrics`` (the stage function only).
The whole run's peak RSS is ``getrusage(RUSAGE_CHILDREN).ru_maxrss``.

Between consecutive sizes the script computes scaling exponents ``log(CPU2/CPU1) / log(n2/n1)`` per stage and
product, and EXTRAPOLATES each stage from the largest measured size to 331 M persons as a power law with its
exponent (CPU, wall, peak RSS; exponents of peak RSS are fitted on RSS above the interpreter baseline). These
are extrapolations from small runs, not measurements.

    .venv/bin/python benchmarks/national.py --persons 1e6,3e6 --out benchmarks/results/national.json

``--keep`` keeps each size's store (else it is deleted after the size; the bytes written are printed);
``--rerun DIR --stages postprocess,release [--products topdown]`` re-runs stages of a kept size with this
checkout's code (before/after comparisons of one stage on the same measurements).

The national size itself (issue #20 item 5) is run as an agency would run it, within this box's disk and time:

    .venv/bin/python benchmarks/national.py --persons 331e6 --production --lanes 2 --prune-prepared --prune-inputs \
        --out benchmarks/results/national_331m.json

``--production`` makes a production release (CSPRNG, charged to the demo's privacy-loss account), whose release stage
has no ground-truth twin (a test release's accuracy report recomputes every product's truth from the confidential
inputs, a test-only cost that is not part of a census run). ``--lanes N`` runs N stage processes at a time: the five
validations (the costliest first, ``validation_order``), then each product's preprocess → measure → post-process →
release-files chain, largest plan first (what ``dasflow run --product-lanes N`` does in one process: a product's release
tables are written in its lane, and the release stage then only checks them, writes the certificate and the manifest);
the whole run's elapsed wall time is then the figure. ``--prune-prepared`` deletes a product's prepared frames
(``runs/{id}/prepared/{product}/``) once its measurements are committed: they are needed again only to re-measure, which
the ledger never allows twice, and at national size they are tens of GB beside ≈ 46 GB of synthetic inputs. The disk in
use is sampled every two seconds (``disk_peak_bytes``: the filesystem's peak used bytes above the start of the size).
``--prune-inputs`` (production only) deletes the synthetic confidential inputs once every product's measurements are
committed: post-processing and the release stage cannot read them (their store view refuses every confidential input), a
production release stage has no truth to recompute, and an agency's CEF stays wherever it lives — here the copy is ≈ 48
GB at national size, so the disk peak is the inputs plus what the stages write up to the last measurement, not plus
everything after it. A later validate, preprocess or measure of that run would refuse (no inputs), which a finished
measurement never needs.

``--dask-workers N`` runs two steps on a Dask ``LocalCluster`` of N single-threaded worker processes, as
``dasflow run --task-runner dask`` maps them on its local cluster:

* ``measure-batches``: a segmented product's measurements (TopDown's keys below the state level), one task per
  state's segments, each segment measure-once in the ledger; the ``measure`` stage then commits every key;
* ``postprocess-parts``: a partitioned product's post-processing parts (TopDown's), in the waves of batches
  ``task_waves`` makes (parts read and write the store, only summaries cross the scheduler); the
  ``postprocess`` stage then only combines the stored parts.

Each step's CPU and peak are the cluster's (its driver process's ``wait4``: scheduler, nannies and workers); each
batch reports its worker's peak (and a parts batch its RSS after it).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import itertools
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# dasflow is imported only in the worker processes (function-level imports below): a child's ru_maxrss starts at
# its parent's RSS at the fork (Linux keeps the high-water mark across fork/exec), so a parent holding the
# library (≈ 125 MB) would floor every figure; this parent stays at the bare interpreter's ≈ 12 MB.

NATION = 331_000_000
SEED = 2020
#: the goals of issue #20 for the national release on this machine
GOAL_WALL_S = 3600.0
GOAL_RSS_BYTES = 16 * 2**30
#: where the synthetic confidential inputs lie in the store (``dasflow.demo.SYNTH_ROOT``; not imported here)
SYNTH_DIR = "confidential/synth"


def _states_format(fmt: str) -> str:
    """The per-state layout of a synth format when the generator has one (``phsafe`` -> ``phsafe_states``)."""
    from dasflow import synth
    return f"{fmt}_states" if f"{fmt}_states" in synth.FORMATS else fmt


def _relayout(path: str) -> str:
    """A demo path under a synth format folder, moved to that format's per-state layout."""
    head, sep, tail = path.partition("/")
    return f"{_states_format(head)}{sep}{tail}"


def _synth_step(store_dir: Path, persons: int) -> dict[str, Any]:
    """Generate the census into ``confidential/synth/`` and the public files as the demo places them."""
    from dasflow import demo, synth
    from dasflow.io.store import LocalStore
    from dasflow.products.plugin import DemoCensus
    from dasflow.synth.reference import states as synth_states
    store = LocalStore(store_dir)
    entries = demo.demo_plugins()
    root = store.local_path(demo.SYNTH_ROOT)
    us = [code for code in sorted(synth_states()) if code != "72"]
    formats = tuple(dict.fromkeys(_states_format(p.synth_format) for p, _ in entries if p.synth_format))
    manifest = synth.generate(root, persons=persons, seed=SEED, states=us, formats=formats)
    for _, entry in entries:
        for src, dst in entry.public_files.items():
            target = store.local_path(dst)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(root / _relayout(src), target)
    census = DemoCensus(states=tuple(us), totals=manifest.data["totals"])
    for plugin, _ in entries:
        plugin.demo_public(store, census)
    return {"formats": list(formats), "totals": manifest.data["totals"]}


def release_config(store_dir: Path, persons: int, production: bool = False) -> dict[str, Any]:
    """The demo's release config (seeded test mode, or ``production``: CSPRNG, charged to the demo's account,
    opened here) with each confidential input prefix moved to the per-state layout."""
    from dasflow import demo
    if production:
        from fractions import Fraction

        from dasflow.io.store import LocalStore
        from dasflow.privacy.account import open_account
        open_account(LocalStore(store_dir), demo.DEMO_ACCOUNT, "US", cap_rho=Fraction(demo.DEMO_ACCOUNT_CAP_RHO))
    cfg = demo.demo_config(store_dir, persons, None if production else SEED)
    raw = cfg.model_dump(mode="json", exclude_none=True)
    synth_root = demo.SYNTH_ROOT + "/"
    raw["release_id"] = f"national-{persons}"
    raw["inputs"] = {k: synth_root + _relayout(v[len(synth_root):]) if v.startswith(synth_root) else v
                     for k, v in raw["inputs"].items()}
    return dict(raw)


def _stage_step(config_file: Path, stage: str, product: str) -> dict[str, Any]:
    """One stage function in this (fresh) process; returns its manifest's metrics when it writes one."""
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import manifest_key
    from dasflow.release.stage import TABLES, product_release_files, release_stage
    ctx = _context(config_file)
    if stage == "plan":
        stages.plan_stage(ctx)
        return {}
    if stage == "order":
        return {"order": stages.largest_first(ctx),
                "partitioned": [p.name for p in ctx.config.products if stages.partitioner(ctx, p.name) is not None],
                "batched": [p.name for p in ctx.config.products if stages.measured_in_batches(ctx, p.name)]}
    if stage == "release":
        release_stage(ctx)
        product = "all"
    elif stage == "release-files":  # a product's release files in its lane, as the release flow makes them
        stage = TABLES
        product_release_files(ctx, product)
    else:
        {"validate": stages.validate_stage, "preprocess": stages.preprocess_stage,
         "measure": stages.measure_stage, "postprocess": stages.postprocess_stage}[stage](ctx, product)
    record = json.loads(ctx.store.get(manifest_key(ctx, stage, product)))
    metrics = record.get("metrics")
    return dict(metrics) if isinstance(metrics, dict) else {}


def _context(config_file: Path) -> Any:
    from dasflow.config import parse_release_config
    from dasflow.pipeline.run import freeze_config
    return freeze_config(parse_release_config(json.loads(config_file.read_text()), source="benchmarks/national.py"))


def _dask_context(config_file: str) -> Any:
    """The run context on a Dask worker, built once per worker process (the spine and public inputs its parts
    share), as the release flow's tasks share theirs (``dasflow.tasks.stages._shared_run``)."""
    from distributed import get_worker
    worker = get_worker()
    ctx = getattr(worker, "_dasflow_national_ctx", None)
    if ctx is None:
        ctx = _context(Path(config_file))
        worker._dasflow_national_ctx = ctx  # type: ignore[attr-defined]
    return ctx


def _dask_waves(config_file: str, product: str, slots: int) -> list[list[list[list[str]]]]:
    from dasflow.pipeline import stages
    waves = stages.postprocess_waves(_dask_context(config_file), product, slots)
    return [[[list(pair) for pair in batch] for batch in wave] for wave in waves]


def _dask_batch(config_file: str, product: str, batch: list[list[str]]) -> dict[str, Any]:
    from dasflow.pipeline import stages
    t0, c0 = time.perf_counter(), time.process_time()
    out = stages.postprocess_batch(_dask_context(config_file), product, batch)
    with open("/proc/self/statm") as fh:
        rss = int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return out | {"pid": os.getpid(), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "rss_bytes": rss, "first": "/".join(batch[0])}


def _dask_measure_batches(config_file: str, product: str) -> list[list[list[str]]]:
    from dasflow.pipeline import stages
    return stages.measure_batches(_dask_context(config_file), product)


def _dask_measure_batch(config_file: str, product: str, batch: list[list[str]]) -> dict[str, Any]:
    from dasflow.pipeline import stages
    t0, c0 = time.perf_counter(), time.process_time()
    out = stages.measure_batch(_dask_context(config_file), product, batch)
    return out | {"pid": os.getpid(), "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "first": "/".join(batch[0])}


@contextlib.contextmanager
def _local_cluster(workers: int) -> Iterator[Any]:
    """A ``LocalCluster`` of ``workers`` single-threaded worker processes with the release flow's settings,
    closed as the flow closes its own (workers first)."""
    from distributed import LocalCluster

    from dasflow.flows.release import WORKER_THREADS, stop_workers
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,  # type: ignore[no-untyped-call]
                      host="127.0.0.1", dashboard_address=None, env=WORKER_THREADS) as cluster:
        try:
            yield cluster
        finally:
            stop_workers(cluster)


def _dask_measure(config_file: Path, product: str, workers: int) -> dict[str, Any]:
    """A segmented product's measurements drawn ahead on a Dask ``LocalCluster`` of ``workers`` workers, as
    ``dasflow run --task-runner dask`` maps them (``measure_batches``: one batch of segments per state, largest
    first, each measure-once in the ledger, nothing committed); the ``measure`` stage then commits every key.
    The process's wait4 usage covers the scheduler, nannies and workers."""
    import dask
    from distributed import Client

    from dasflow.flows.release import WORKER_DASK_CONFIG
    t0 = time.perf_counter()
    with dask.config.set(WORKER_DASK_CONFIG), _local_cluster(workers) as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call]
        batches = client.submit(_dask_measure_batches, str(config_file), product, pure=False).result()
        done = client.gather([client.submit(_dask_measure_batch, str(config_file), product, b, pure=False,
                                            priority=-i) for i, b in enumerate(batches)])
    return {"batches": len(done), "segments": sum(d["segments"] for d in done),
            "drawn": sum(d["drawn"] for d in done), "processes": len({d["pid"] for d in done}),
            "batch_cpu_s": round(sum(d["cpu_s"] for d in done), 2),
            "worker_peak_rss_bytes": max((d["peak_rss_bytes"] for d in done), default=0),
            "wall_seconds": time.perf_counter() - t0}


def _dask_post(config_file: Path, product: str, workers: int) -> dict[str, Any]:
    """A partitioned product's post-processing parts on a Dask ``LocalCluster`` of ``workers`` single-threaded
    worker processes, as ``dasflow run --task-runner dask`` maps them (``task_waves``: waves of batches; the
    parts read their inputs from the store and write their outputs there; only summaries cross the scheduler),
    with the release flow's worker settings. Every worker plans the waves at once (each loads the public
    inputs its parts share). The process's wait4 usage covers the scheduler, nannies and workers."""
    import dask
    from distributed import Client, wait

    from dasflow.flows.release import WORKER_DASK_CONFIG
    t0 = time.perf_counter()
    with dask.config.set(WORKER_DASK_CONFIG), _local_cluster(workers) as cluster, \
            Client(cluster) as client:  # type: ignore[no-untyped-call]
        addresses = sorted(client.nthreads())
        plans = [client.submit(_dask_waves, str(config_file), product, workers, workers=[a], pure=False)
                 for a in addresses]
        waves = plans[0].result()
        wait(plans)  # type: ignore[no-untyped-call]
        batches: list[dict[str, Any]] = []
        for wave in waves:
            batches += client.gather([client.submit(_dask_batch, str(config_file), product, b, pure=False)
                                      for b in wave])
    return {"waves": len(waves), "batches": len(batches), "parts": sum(b["parts"] for b in batches),
            "computed": sum(b["computed"] for b in batches), "processes": len({b["pid"] for b in batches}),
            "batch_cpu_s": round(sum(b["cpu_s"] for b in batches), 2),
            "worker_peak_rss_bytes": max((b["peak_rss_bytes"] for b in batches), default=0),
            "batch_rss_bytes": [[w, b["first"], b["peak_rss_bytes"], b["rss_bytes"]] for w, b in zip(
                (w for w, wave in enumerate(waves) for _ in wave), batches, strict=True)],
            "wall_seconds": time.perf_counter() - t0}


def _child(args: list[str]) -> dict[str, Any]:
    """Run this script's worker mode in a fresh process: its own wall, CPU and peak RSS (``wait4``) and the
    JSON it prints last."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--worker", *args],
                            stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONHASHSEED": "0"})
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"worker {args} failed with exit code {proc.returncode}")
    return {"process_wall_s": round(wall, 2), "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
            "process_sys_s": round(usage.ru_stime, 2), "peak_rss_bytes": int(usage.ru_maxrss) * 1024,
            "result": dict(json.loads(out.strip().splitlines()[-1]))}


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class DiskSampler:
    """The filesystem's used bytes under ``path``, sampled every ``period`` seconds in a thread: the peak above
    the first sample is what the run needed on disk at once (other writers on the same filesystem count too)."""

    def __init__(self, path: Path, period: float = 2.0) -> None:
        self.path, self.period = path, period
        self.start = self.peak = shutil.disk_usage(path).used
        self.min_free = shutil.disk_usage(path).free
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self.sample()

    def sample(self) -> None:
        usage = shutil.disk_usage(self.path)
        self.peak = max(self.peak, usage.used)
        self.min_free = min(self.min_free, usage.free)

    def stop(self) -> dict[str, int]:
        self._stop.set()
        self._thread.join()
        self.sample()
        return {"disk_peak_bytes": self.peak - self.start, "disk_min_free_bytes": self.min_free}


def cpu_model() -> str:
    """The CPU's model name, family and model (runs on machines of the same size differ ≈ 2× in CPU seconds)."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/cpuinfo").read_text().splitlines() if ":" in line)
    except OSError:
        return platform.processor() or "unknown"
    info = {k.strip(): v.strip() for k, v in info.items()}
    return f"{info.get('model name', 'unknown')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})"


def run_size(persons: int, workdir: Path, keep: bool, *, production: bool = False, lanes: int = 1,
             prune_prepared: bool = False, dask_workers: int = 0, prune_inputs: bool = False) -> dict[str, Any]:
    if prune_inputs and not production:
        raise SystemExit("--prune-inputs needs --production (a test release's report recomputes the truth)")
    store_dir = Path(tempfile.mkdtemp(prefix=f"national-{persons}-", dir=workdir)) / "store"
    store_dir.mkdir(parents=True)
    load0 = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    disk = DiskSampler(store_dir)

    def step(stage: str, product: str, args: list[str]) -> dict[str, Any]:
        r = _child(args)
        m: dict[str, Any] = r.pop("result")
        row = {"stage": stage, "product": product, **r}
        if "cpu_seconds" in m:
            row |= {"stage_wall_s": round(m["wall_seconds"], 2), "stage_cpu_s": round(m["cpu_seconds"], 2)}
        if stage in ("postprocess-parts", "measure-batches"):
            row["dask"] = m
        rows.append(row)
        print(f"  {stage:<11} {product:<10} {row.get('stage_wall_s', r['process_wall_s']):8.2f} s wall "
              f"{row.get('stage_cpu_s', r['process_cpu_s']):8.2f} s CPU {r['peak_rss_bytes'] / 2**30:6.2f} GB "
              f"peak (process {r['process_wall_s']:.1f} s)", flush=True)
        return m

    synth_info = step("synth", "all", ["synth", str(store_dir), str(persons)])
    inputs_bytes = _du(store_dir)
    raw = _child(["config", str(store_dir), str(persons), "production" if production else "test"])["result"]
    config_file = store_dir.parent / "config.json"
    config_file.write_text(json.dumps(raw))
    products = [p["name"] for p in raw["products"]]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, lanes)) as pool:  # the costliest validations first, as the flow
        checks = _child(["validation-order", str(config_file)])["result"]["order"]
        list(pool.map(lambda p: step("validate", p, ["stage", str(config_file), "validate", p]), checks))
        step("plan", "all", ["stage", str(config_file), "plan", "all"])
        order = _child(["stage", str(config_file), "order", "all"])["result"]
        if lanes > 1:  # the largest plan first, as the release flow starts them
            products = order["order"]
        split = set(order["partitioned"]) if dask_workers else set()
        batched = set(order["batched"]) if dask_workers else set()
        root = store_dir / "runs" / raw["release_id"]
        measured: list[str] = []
        lock = threading.Lock()

        def chain(p: str) -> None:
            for stage in ("preprocess", "measure", "postprocess", "release-files"):
                if stage == "postprocess" and p in split:  # its parts on the Dask cluster; the stage combines
                    step("postprocess-parts", p, ["dask-post", str(config_file), p, str(dask_workers)])
                if stage == "measure" and p in batched:  # its segments on the Dask cluster; the stage commits
                    step("measure-batches", p, ["dask-measure", str(config_file), p, str(dask_workers)])
                step(stage, p, ["stage", str(config_file), stage, p])
                if stage == "measure" and prune_prepared:
                    shutil.rmtree(root / "prepared" / p, ignore_errors=True)
                if stage == "measure" and prune_inputs:
                    with lock:
                        measured.append(p)
                        if len(measured) == len(products):  # every product's measurements are committed
                            shutil.rmtree(store_dir / SYNTH_DIR, ignore_errors=True)
                            print(f"  synthetic inputs deleted after the last measurement ({p})", flush=True)

        list(pool.map(chain, products))
    step("release", "all", ["stage", str(config_file), "release", "all"])
    elapsed = time.perf_counter() - t0
    written = _du(store_dir)
    space = disk.stop()
    print(f"  bytes in the store at the end: {written / 1e9:.2f} GB ({inputs_bytes / 1e9:.2f} GB synthetic "
          f"inputs); disk peak {space['disk_peak_bytes'] / 1e9:.2f} GB above the start, "
          f"{space['disk_min_free_bytes'] / 1e9:.1f} GB free at least", flush=True)
    if not keep:
        shutil.rmtree(store_dir.parent)
    release = [r for r in rows if r["stage"] != "synth"]
    return {"persons": persons, "load_before": load0, "load_after": os.getloadavg()[0],
            "mode": "production" if production else "test", "lanes": lanes, "prune_prepared": prune_prepared,
            "prune_inputs": prune_inputs,
            "dask_workers": dask_workers,
            "synth": synth_info, "bytes_written": written, "input_bytes": inputs_bytes, **space, "steps": rows,
            "release_cpu_s": round(sum(r.get("stage_cpu_s", r["process_cpu_s"]) for r in release), 2),
            "release_wall_s": round(sum(r.get("stage_wall_s", r["process_wall_s"]) for r in release), 2),
            "release_process_wall_s": round(sum(r["process_wall_s"] for r in release), 2),
            "release_elapsed_s": round(elapsed, 2),
            "release_peak_rss_bytes": max(r["peak_rss_bytes"] for r in release),
            "kept": str(store_dir) if keep else None}


def rerun_stages(run_dir: Path, wanted: list[str], products: list[str] | None) -> dict[str, Any]:
    """Re-run some stages (``postprocess``, ``release``, …) of a kept size (``--keep``: ``run_dir`` holds
    ``config.json`` and ``store/``) with this checkout's code, each in a fresh process as above; the measurements
    are the kept ledger's (never redrawn). A stage whose manifest is current for this code is skipped by the
    stage itself (its figures are then those of the check only)."""
    config_file = run_dir / "config.json"
    raw = json.loads(config_file.read_text())
    names = [p["name"] for p in raw["products"]]
    rows: list[dict[str, Any]] = []
    for stage in wanted:
        for product in (["all"] if stage in ("plan", "release") else names):
            if products and product != "all" and product not in products:
                continue
            r = _child(["stage", str(config_file), stage, product])
            m: dict[str, Any] = r.pop("result")
            row = {"stage": stage, "product": product, **r}
            if "cpu_seconds" in m:
                row |= {"stage_wall_s": round(m["wall_seconds"], 2), "stage_cpu_s": round(m["cpu_seconds"], 2)}
            rows.append(row)
            print(f"  {stage:<11} {product:<10} {row.get('stage_wall_s', r['process_wall_s']):8.2f} s wall "
                  f"{row.get('stage_cpu_s', r['process_cpu_s']):8.2f} s CPU {r['peak_rss_bytes'] / 2**30:6.2f} GB "
                  f"peak (process {r['process_wall_s']:.1f} s)", flush=True)
    return {"run_dir": str(run_dir), "stages": wanted, "steps": rows}


def _exp(a: float, b: float, n1: int, n2: int) -> float | None:
    return round(math.log(b / a) / math.log(n2 / n1), 3) if a > 0 and b > 0 else None


def _power(v: float, e: float | None, n: int) -> float | None:
    """``v`` measured at ``n`` persons carried to the nation as ``n**e`` (e floored at 0)."""
    return None if e is None else v * (NATION / n) ** max(e, 0.0)


def _affine(v1: float, v2: float, n1: int, n2: int) -> float:
    """The line through (n1, v1), (n2, v2) at the nation (a fixed cost plus a per-person cost; slope floored
    at 0)."""
    slope = max((v2 - v1) / (n2 - n1), 0.0)
    return v2 + slope * (NATION - n2)


def scaling(runs: list[dict[str, Any]], baseline: int) -> dict[str, Any]:
    """Exponents between consecutive sizes, per step, and the power-law extrapolation to the nation from the
    last two sizes (``baseline``: the interpreter's RSS, subtracted before fitting RSS and added back)."""
    pairs = []
    for r1, r2 in itertools.pairwise(runs):
        n1, n2 = r1["persons"], r2["persons"]
        by1 = {(s["stage"], s["product"]): s for s in r1["steps"]}
        rows = []
        for s2 in r2["steps"]:
            s1 = by1[(s2["stage"], s2["product"])]
            cpu = "stage_cpu_s" if "stage_cpu_s" in s2 else "process_cpu_s"
            wall = "stage_wall_s" if "stage_wall_s" in s2 else "process_wall_s"
            e_cpu, e_wall = _exp(s1[cpu], s2[cpu], n1, n2), _exp(s1[wall], s2[wall], n1, n2)
            rss1, rss2 = s1["peak_rss_bytes"] - baseline, s2["peak_rss_bytes"] - baseline
            e_rss = _exp(rss1, rss2, n1, n2)
            x_cpu, x_wall = _power(s2[cpu], e_cpu, n2), _power(s2[wall], e_wall, n2)
            x_rss = _power(rss2, e_rss, n2)
            a_cpu = _affine(s1[cpu], s2[cpu], n1, n2)
            a_rss = _affine(s1["peak_rss_bytes"], s2["peak_rss_bytes"], n1, n2)
            rows.append({"stage": s2["stage"], "product": s2["product"], "cpu_exponent": e_cpu,
                         "wall_exponent": e_wall, "rss_exponent": e_rss,
                         "extrapolated_cpu_s": None if x_cpu is None else round(x_cpu),
                         "extrapolated_wall_s": None if x_wall is None else round(x_wall),
                         "extrapolated_peak_rss_gb": None if x_rss is None else round((x_rss + baseline) / 2**30, 1),
                         "affine_cpu_s": round(a_cpu), "affine_peak_rss_gb": round(a_rss / 2**30, 1)})
        e_rel = _exp(r1["release_cpu_s"], r2["release_cpu_s"], n1, n2)
        pairs.append({"from": n1, "to": n2, "release_cpu_exponent": e_rel, "steps": rows})
    if not pairs:
        return {"pairs": []}
    last = pairs[-1]["steps"]
    rel = [s for s in last if s["stage"] != "synth"]
    total_cpu = sum(s["extrapolated_cpu_s"] or 0 for s in rel)
    total_wall = sum(s["extrapolated_wall_s"] or 0 for s in rel)
    rss = max(s["extrapolated_peak_rss_gb"] or 0 for s in rel)
    goal_gb = GOAL_RSS_BYTES / 2**30
    over = [f"{s['stage']} {s['product']}" for s in rel if (s["extrapolated_peak_rss_gb"] or 0) > goal_gb]
    over_affine = [f"{s['stage']} {s['product']}" for s in rel if s["affine_peak_rss_gb"] > goal_gb]
    affine_cpu = sum(s["affine_cpu_s"] for s in rel)
    return {"pairs": pairs, "EXTRAPOLATION_to_persons": NATION,
            "extrapolated_release_cpu_s": round(total_cpu),
            "extrapolated_release_wall_s_serial_stages": round(total_wall),
            "extrapolated_release_wall_s_ideal_2_cores": round(total_cpu / 2),
            "extrapolated_release_peak_rss_gb": rss, "stages_over_16gb": over,
            "affine_release_cpu_s": affine_cpu, "affine_release_wall_s_ideal_2_cores": round(affine_cpu / 2),
            "affine_release_peak_rss_gb": max(s["affine_peak_rss_gb"] for s in rel),
            "affine_stages_over_16gb": over_affine,
            "goal_wall_s": GOAL_WALL_S, "goal_peak_rss_gb": GOAL_RSS_BYTES / 2**30}


def combine(files: list[Path], out: Path | None) -> int:
    """Scaling exponents and extrapolation across the sizes of earlier result files (e.g. one size per session);
    each file's own date and code are what they were: say so wherever the figures are quoted."""
    results = [json.loads(f.read_text()) for f in files]
    runs = sorted((r for res in results for r in res["runs"]), key=lambda r: r["persons"])
    baseline = min(res["interpreter_peak_rss_bytes"] for res in results)
    sc = scaling(runs, baseline)
    for pair in sc["pairs"]:
        print(f"{pair['from']:,} -> {pair['to']:,}: release CPU exponent {pair['release_cpu_exponent']}")
        for s in pair["steps"]:
            print(f"  {s['stage']:<11} {s['product']:<10} exp CPU {s['cpu_exponent']} RSS {s['rss_exponent']}")
    print(f"affine release at 331 M: {sc.get('affine_release_cpu_s')} CPU-s, peak "
          f"{sc.get('affine_release_peak_rss_gb')} GB; power law: {sc.get('extrapolated_release_cpu_s')} CPU-s, peak "
          f"{sc.get('extrapolated_release_peak_rss_gb')} GB (EXTRAPOLATED)")
    if out:
        out.write_text(json.dumps({"benchmark": "national-combined", "files": [str(f) for f in files],
                                   "dates": [res["date"] for res in results], "sizes": [r["persons"] for r in runs],
                                   "scaling": sc}, indent=1) + "\n")
    return 0


def _worker(argv: list[str]) -> None:
    if argv[0] == "synth":
        out = _synth_step(Path(argv[1]), int(argv[2]))
    elif argv[0] == "config":
        out = release_config(Path(argv[1]), int(argv[2]), production=argv[3:] == ["production"])
    elif argv[0] == "dask-measure":
        out = _dask_measure(Path(argv[1]), argv[2], int(argv[3]))
    elif argv[0] == "dask-post":
        out = _dask_post(Path(argv[1]), argv[2], int(argv[3]))
    elif argv[0] == "validation-order":
        from dasflow.config import parse_release_config
        from dasflow.pipeline.stages import validation_order
        out = {"order": validation_order(parse_release_config(json.loads(Path(argv[1]).read_text())))}
    elif argv[0] == "baseline":
        from dasflow.pipeline import stages  # noqa: F401  (the interpreter with a stage's imports)
        from dasflow.release import stage  # noqa: F401
        out = {}
    else:
        out = _stage_step(Path(argv[1]), argv[2], argv[3])
    sys.stdout.flush()
    print(json.dumps(out, default=str), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", default="1e6,3e6", help="comma-separated sizes, e.g. 1e6,3e6")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    ap.add_argument("--keep", action="store_true", help="keep each size's store (else deleted after the size)")
    ap.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()))
    ap.add_argument("--rerun", type=Path, default=None,
                    help="a kept size's directory (national-N-…/): re-run only --stages on it with this code")
    ap.add_argument("--stages", default="postprocess,release", help="with --rerun: comma-separated stages")
    ap.add_argument("--products", default="", help="with --rerun: only these products (comma-separated)")
    ap.add_argument("--combine", default="",
                    help="comma-separated result files of earlier runs: their sizes' scaling, nothing run")
    ap.add_argument("--production", action="store_true",
                    help="a production release (CSPRNG, no ground-truth twin in the release stage)")
    ap.add_argument("--lanes", type=int, default=1, help="stage processes at a time (validations, product chains)")
    ap.add_argument("--prune-prepared", action="store_true",
                    help="delete a product's prepared frames once its measurements are committed (disk)")
    ap.add_argument("--prune-inputs", action="store_true",
                    help="with --production: delete the synthetic inputs once every product is measured (disk)")
    ap.add_argument("--dask-workers", type=int, default=0,
                    help="run partitioned post-processing parts on a Dask LocalCluster of this many workers")
    ap.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        _worker(args.worker)
        return 0
    if args.combine:
        return combine([Path(f) for f in args.combine.split(",")], args.out)
    if args.rerun:
        out = rerun_stages(args.rerun, args.stages.split(","), [p for p in args.products.split(",") if p])
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(out, indent=1) + "\n")
        return 0
    sizes = [int(float(s)) for s in args.persons.split(",")]
    baseline = _child(["baseline"])["peak_rss_bytes"]  # the interpreter with dasflow imported
    print(f"interpreter + imports: {baseline / 2**20:.0f} MB peak RSS", flush=True)
    runs = []
    for n in sizes:
        print(f"{n:,} persons", flush=True)
        runs.append(run_size(n, args.workdir, args.keep, production=args.production, lanes=args.lanes,
                             prune_prepared=args.prune_prepared, dask_workers=args.dask_workers,
                             prune_inputs=args.prune_inputs))
        print(f"  release: {runs[-1]['release_cpu_s']:.1f} CPU-s, {runs[-1]['release_wall_s']:.1f} s wall "
              f"(stage functions), {runs[-1]['release_elapsed_s']:.1f} s elapsed on {args.lanes} lane(s), "
              f"peak RSS {runs[-1]['release_peak_rss_bytes'] / 2**30:.2f} GB", flush=True)
    result = {"benchmark": "national", "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
              "machine": {"cpus": os.cpu_count(), "cpu_model": cpu_model(), "platform": platform.platform(),
                          "python": platform.python_version()},
              "products": [s["product"] for s in runs[0]["steps"] if s["stage"] == "preprocess"] if runs else [],
              "seed": SEED,
              "interpreter_peak_rss_bytes": baseline, "runs": runs,
              "children_peak_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
              "scaling": scaling(runs, baseline)}
    text = json.dumps(result, indent=1)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    sc = result["scaling"]
    if sc["pairs"]:
        print("EXTRAPOLATION to 331 M persons (power law from the two largest sizes):")
        for s in sc["pairs"][-1]["steps"]:
            print(f"  {s['stage']:<11} {s['product']:<10} exp CPU {s['cpu_exponent']} RSS {s['rss_exponent']} -> "
                  f"{s['extrapolated_cpu_s']} CPU-s, {s['extrapolated_peak_rss_gb']} GB; "
                  f"affine {s['affine_cpu_s']} CPU-s, "
                  f"{s['affine_peak_rss_gb']} GB")
        print(f"  affine (fixed + per-person) release: {sc['affine_release_cpu_s']} CPU-s, peak "
              f"{sc['affine_release_peak_rss_gb']} GB; "
              f"over 16 GB: {', '.join(sc['affine_stages_over_16gb']) or 'none'}")
        print(f"  release: {sc['extrapolated_release_cpu_s']} CPU-s, peak {sc['extrapolated_release_peak_rss_gb']} GB;"
              f" over 16 GB: {', '.join(sc['stages_over_16gb']) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
