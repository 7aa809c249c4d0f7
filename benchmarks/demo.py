"""Demo benchmark (issue #20 item 6): the five-product ``dasflow demo`` stage by stage, and its release bytes.

Two modes:

``stages`` (default)
    the seeded demo through the stage functions in this process (no Prefect): synth, then per product validate,
    plan, preprocess, measure, post-process, then the release stage; wall and CPU per stage (each stage's
    manifest also carries its own metrics), and the sha256 of every release file (certificate / manifest lines
    naming the code version left out) so that two checkouts' releases can be compared byte for byte.
``cli``
    ``dasflow demo`` as a user runs it (fresh store, fresh ``PREFECT_HOME``), timed from outside.
``server``
    the temporary Prefect server's start on a fresh Prefect home: template off, first start, seeded.
``threads``
    SafeTab-P and TopDown through the stage functions, one after the other and in two plain threads (what two
    product lanes could reach without Prefect), and the largest NMF's Parquet encode with and without text-column
    statistics.

    .venv/bin/python benchmarks/demo.py --seed 7 --out /tmp/demo-after.json
    .venv/bin/python benchmarks/demo.py --mode cli
    .venv/bin/python benchmarks/demo.py --compare /tmp/demo-before.json /tmp/demo-after.json

The load average (1 min) is recorded before and after every run: the machine is shared.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from national import cpu_model  # noqa: E402  (this directory is the script's: first on sys.path)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _timed(rows: list[dict[str, Any]], name: str, fn: Callable[[], Any]) -> Any:
    w0, c0 = time.perf_counter(), _cpu()
    out = fn()
    rows.append({"stage": name, "wall": round(time.perf_counter() - w0, 2), "cpu": round(_cpu() - c0, 2)})
    print(f"  {name:<28} {rows[-1]['wall']:7.2f} s wall {rows[-1]['cpu']:7.2f} s CPU", flush=True)
    return out


def release_digest(rel: str, data: bytes) -> str:
    """sha256 of a release file; the certificate's code-version mention and the manifest's code version (and
    the certificate hashes it lists) are replaced by a placeholder, so two checkouts' releases compare."""
    if rel.startswith("CERTIFICATE"):
        data = re.sub(rb"dasflow-[0-9.]+\+[0-9a-f]+", b"<code version>", data)
    elif rel == "MANIFEST.json":
        doc = json.loads(data)
        doc["code_version"] = "<code version>"
        doc["files"] = {k: v for k, v in doc.get("files", {}).items() if "/CERTIFICATE." not in k}
        data = json.dumps(doc, sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()


def stages_run(persons: int, seed: int) -> dict[str, Any]:
    from dasflow import demo
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config
    from dasflow.release.stage import release_stage

    rows: list[dict[str, Any]] = []
    root = Path(tempfile.mkdtemp(prefix="dasflow-demo-bench-")) / "store"
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    cfg = _timed(rows, "synth + config", lambda: demo.prepare_demo(root, persons, seed))
    ctx = freeze_config(cfg)
    for p in cfg.products:
        _timed(rows, f"validate {p.name}", partial(stages.validate_stage, ctx, p.name))
    _timed(rows, "plan", lambda: stages.plan_stage(ctx))
    for p in cfg.products:
        _timed(rows, f"preprocess {p.name}", partial(stages.preprocess_stage, ctx, p.name))
        _timed(rows, f"measure {p.name}", partial(stages.measure_stage, ctx, p.name))
        _timed(rows, f"postprocess {p.name}", partial(stages.postprocess_stage, ctx, p.name))
    _timed(rows, "release", lambda: release_stage(ctx))
    total = time.perf_counter() - t0
    rel_root = root / "runs" / cfg.release_id / "release"
    files = {p.relative_to(rel_root).as_posix():
             release_digest(p.relative_to(rel_root).as_posix(), p.read_bytes())
             for p in sorted(rel_root.rglob("*")) if p.is_file()}
    return {"mode": "stages", "persons": persons, "seed": seed, "load_before": load0,
            "load_after": os.getloadavg()[0], "total_wall": round(total, 2), "stages": rows, "files": files,
            "store": str(root)}


def topdown_cutoffs(persons: int, seed: int, cutoffs: list[int]) -> dict[str, Any]:
    """TopDown alone on the demo's synthetic census, once per fanout cutoff (the demo config otherwise): measure
    and post-process wall/CPU, post-processing parts and files written (each one an fsync'd store object)."""
    from dasflow import demo
    from dasflow.config import parse_release_config
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    root = Path(tempfile.mkdtemp(prefix="dasflow-demo-td-")) / "store"
    base = demo.demo_config(root, persons, seed)
    demo.prepare_demo(root, persons, seed)
    out: dict[str, Any] = {"mode": "topdown", "persons": persons, "seed": seed, "runs": []}
    td = next(p for p in base.products if p.name == "topdown")
    for cutoff in cutoffs:
        text = json.loads(td.config_text or "{}") | {"fanout_cutoff": cutoff}
        raw = base.model_dump(mode="json", exclude_none=True)
        raw["release_id"] = f"td-cutoff{cutoff}"
        raw["inputs"] = {k: v for k, v in raw["inputs"].items() if k.startswith("topdown")}
        raw["products"] = [{"name": "topdown", "config_text": json.dumps(text), "source": "bench"}]
        raw.pop("account", None)
        ctx = freeze_config(parse_release_config(raw, source="bench"))
        rows: list[dict[str, Any]] = []
        load0 = os.getloadavg()[0]
        stages.validate_stage(ctx, "topdown")
        stages.plan_stage(ctx)
        stages.preprocess_stage(ctx, "topdown")
        _timed(rows, f"cutoff {cutoff} measure", partial(stages.measure_stage, ctx, "topdown"))
        _timed(rows, f"cutoff {cutoff} postprocess", partial(stages.postprocess_stage, ctx, "topdown"))
        post = root / "runs" / raw["release_id"] / "postprocessed" / "topdown"
        out["runs"].append({"cutoff": cutoff, "stages": rows, "load": load0,
                            "files": sum(1 for p in post.rglob("*") if p.is_file())})
        print(f"  cutoff {cutoff}: {out['runs'][-1]['files']} post-processing files (load {load0:.1f})", flush=True)
    return out


def cli_run(persons: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="dasflow-demo-cli-"))
    env = {**os.environ, "PREFECT_HOME": str(tmp / "prefect")}
    env.pop("PREFECT_API_URL", None)
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("dasflow")), "demo", "--store", str(tmp / "s"),
                           "--persons", str(persons)], env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    log = proc.stdout + proc.stderr
    (tmp / "demo.log").write_text(log)
    first = re.search(r"^(\d\d):(\d\d):(\d\d\.\d+) \| INFO .*Beginning flow run", log, re.M)
    start = time.localtime(time.time() - wall)
    flow_at = None
    if first:  # seconds from the command's start to the first flow run (imports, synthetic census, Prefect start)
        h, m, sec = int(first[1]), int(first[2]), float(first[3])
        flow_at = round((h - start.tm_hour) * 3600 + (m - start.tm_min) * 60 + sec - start.tm_sec
                        - (time.time() - wall) % 1, 1)
    return {"mode": "cli", "persons": persons, "rc": proc.returncode, "load_before": load0,
            "load_after": os.getloadavg()[0], "total_wall": round(wall, 2), "first_flow_run_at": flow_at,
            "cpu": round(ru.ru_utime + ru.ru_stime, 2), "log_tail": log[-3000:]}  # (the log's temp path: not kept)


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def server_start() -> dict[str, Any]:
    """The temporary Prefect server's start on a fresh Prefect home (``dasflow.flows.temporary_api``), wall to
    healthy and the server process's CPU: template off, then a first start on an empty template cache (Prefect's
    migrations, template saved), then a start seeded from the cached template."""
    from dasflow.flows import temporary_api

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # as the CLI sets it
    cache = tempfile.mkdtemp(prefix="dasflow-bench-cache-")
    rows = []
    for case, switch in (("template off", "0"), ("first start (migrate, save)", "1"), ("seeded", "1")):
        saved = {k: os.environ.get(k) for k in ("PREFECT_HOME", "DASFLOW_CACHE_DIR", "DASFLOW_PREFECT_DB_TEMPLATE")}
        os.environ.update(PREFECT_HOME=tempfile.mkdtemp(prefix="dasflow-bench-home-"), DASFLOW_CACHE_DIR=cache,
                          DASFLOW_PREFECT_DB_TEMPLATE=switch)
        os.environ.pop("PREFECT_API_URL", None)
        c0, w0 = _children_cpu(), time.perf_counter()
        api = temporary_api.launch()
        assert api is not None
        url = api.wait(180)
        wall = time.perf_counter() - w0
        api.stop()
        rows.append({"case": case, "healthy": url is not None, "wall": round(wall, 2),
                     "server_cpu": round(_children_cpu() - c0, 2), "load": os.getloadavg()[0]})
        print(f"  {case:<30} {rows[-1]['wall']:6.2f} s to healthy, {rows[-1]['server_cpu']:6.2f} CPU-s", flush=True)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return {"mode": "server", "runs": rows}


def _planned_demo(persons: int) -> Any:
    from dasflow import demo
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    root = Path(tempfile.mkdtemp(prefix="dasflow-demo-threads-")) / "store"
    ctx = freeze_config(demo.prepare_demo(root, persons, None))
    for p in ctx.config.products:
        stages.validate_stage(ctx, p.name)
    stages.plan_stage(ctx)
    return ctx


def two_products(persons: int, names: tuple[str, ...] = ("safetab-p", "topdown")) -> dict[str, Any]:
    """The demo's two largest products (preprocess -> measure -> post-process through the stage functions, no
    Prefect, production randomness), one after the other and then in two plain threads of one process, each on
    a fresh demo release: what the flow's two product lanes could reach. Then the Parquet encode of the largest
    NMF with column statistics on every column and on numeric columns only (``encode_nmf``)."""
    import threading

    import pyarrow as pa
    import pyarrow.parquet as pq

    from dasflow.pipeline import stages

    def run(ctx: Any, name: str, walls: dict[str, float]) -> None:
        t0 = time.perf_counter()
        stages.preprocess_stage(ctx, name)
        stages.measure_stage(ctx, name)
        stages.postprocess_stage(ctx, name)
        walls[name] = round(time.perf_counter() - t0, 2)

    out: dict[str, Any] = {"mode": "threads", "persons": persons, "products": list(names)}
    for how in ("one after the other", "two threads"):
        ctx = _planned_demo(persons)
        walls: dict[str, float] = {}
        load0, c0, w0 = os.getloadavg()[0], _cpu(), time.perf_counter()
        if how == "two threads":
            threads = [threading.Thread(target=run, args=(ctx, n, walls)) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        else:
            for n in names:
                run(ctx, n, walls)
        out[how] = {"wall": round(time.perf_counter() - w0, 2), "cpu": round(_cpu() - c0, 2), "products": walls,
                    "load": load0}
        print(f"  {how:<22} {out[how]['wall']:6.2f} s wall {out[how]['cpu']:6.2f} CPU-s {walls}", flush=True)
        nmfs = Path(ctx.store.local_path(f"runs/{ctx.release_id}/measurements/safetab-p"))
    table = pq.read_table(max(nmfs.rglob("*.parquet"), key=lambda p: p.stat().st_size))
    numeric = [f.name for f in table.schema if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]
    encode: dict[str, float] = {}
    for label, stats in (("statistics on every column", True), ("numeric columns only", numeric)):
        best = float("inf")
        for _ in range(3):
            c0 = _cpu()
            pq.write_table(table, io.BytesIO(), compression="lz4", write_statistics=stats)
            best = min(best, _cpu() - c0)
        encode[label] = round(best, 3)
    out["largest_nmf_encode_cpu"] = {"rows": table.num_rows, **encode}
    print(f"  largest NMF ({table.num_rows} rows) encode, best of 3: {encode}", flush=True)
    return out


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    diff = sorted(k for k in set(a["files"]) | set(b["files"]) if a["files"].get(k) != b["files"].get(k))
    print(f"{len(a['files'])} vs {len(b['files'])} release files; differing: {diff or 'none'}")
    before = {r["stage"]: r for r in a["stages"]}
    for r in b["stages"]:
        old = before.get(r["stage"], {})
        print(f"  {r['stage']:<28} {old.get('wall', float('nan')):7.2f} -> {r['wall']:7.2f} s wall   "
              f"{old.get('cpu', float('nan')):7.2f} -> {r['cpu']:7.2f} s CPU")
    cpu = [sum(r["cpu"] for r in x["stages"]) for x in (a, b)]
    print(f"  {'total':<28} {a['total_wall']:7.2f} -> {b['total_wall']:7.2f} s wall   "
          f"{cpu[0]:7.2f} -> {cpu[1]:7.2f} s CPU "
          f"(load {a['load_before']:.1f}/{a['load_after']:.1f} vs {b['load_before']:.1f}/{b['load_after']:.1f})")
    return 1 if diff else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=("stages", "cli", "topdown", "server", "threads"), default="stages")
    ap.add_argument("--cutoffs", type=int, nargs="+", default=[8, 12, 16])
    ap.add_argument("--persons", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.mode in ("topdown", "server", "threads"):
        result = topdown_cutoffs(args.persons, args.seed, args.cutoffs) if args.mode == "topdown" else \
            server_start() if args.mode == "server" else two_products(args.persons)
        if args.out:
            Path(args.out).write_text(json.dumps(result, indent=1))
        return 0
    result = stages_run(args.persons, args.seed) if args.mode == "stages" else cli_run(args.persons)
    result["cpu_model"] = cpu_model()  # runs on different machines differ ≈ 2× in CPU seconds: say which
    print(f"total {result['total_wall']} s wall (load {result['load_before']:.1f} -> {result['load_after']:.1f})")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
