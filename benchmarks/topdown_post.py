"""TopDown post-processing CPU per person: this tree against another checkout of dasflow, on the same measurements.

    git worktree add /tmp/old 8f61320
    .venv/bin/python benchmarks/topdown_post.py --persons 1000000 3000000 --other /tmp/old [--json out.json]
    .venv/bin/python benchmarks/topdown_post.py --persons 3000000 --other /tmp/old --modes parts measure

One seeded multi-state synthetic release (dasflow.synth; the scale-out benchmark's states and invariants: total,
state populations, structural zeros) is validated, preprocessed and measured once per size with this tree. Then
the post-processing runs in a fresh process per (tree, mode, repeat), so each has its own peak RSS and the code
of the tree under test only:

``single``
    ``Product.postprocess`` on all measurements at once (the estimator, one process).
``parts``
    ``postprocess_stage(force=True)``: every part of every step (combine, root, per-state levels) computed and
    stored in this one process, then combined — the work the release's mapped tasks do, without a task runner.

Reported per run: CPU seconds (user + system of the process; ``single`` after loading the measurements, ``parts``
the whole stage call, whose combine part loads them), wall seconds, peak
RSS, CPU µs per person, and a digest of every estimate table (diagnostics without their timing columns), which
must agree between the trees: the seeded release is byte-identical. The minimum CPU over ``--repeat`` runs is
the figure (the machine is shared).
``measure``
    ``measure_stage`` on a store validated, planned and preprocessed by the same tree (a copy of one generated
    census per run; the stages before it are not timed): every key's noise drawn and every NMF written. Its
    digest is that of every decoded NMF table, which must agree between the trees (seeded: the same draws).

For ``single`` and ``parts`` each run also reports the estimates' L1 error against the true histograms of every
level (the preprocessed counts): when an estimator change alters the bytes, this says whether accuracy moved.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
STATES = "10,11,23,30,33,38,44,50"

# Runs inside a fresh interpreter with the tree under test first on sys.path (argv: tree, store, mode).
CHILD = r'''
import hashlib, io, json, resource, shutil, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from dasflow.pipeline import stages
from dasflow.pipeline.run import open_run
store, mode = sys.argv[2], sys.argv[3]
shutil.rmtree(Path(store) / "runs/td-post/postprocessed", ignore_errors=True)
ctx = open_run("td-post", store)
if mode == "measure":
    import glob
    import pyarrow.parquet as pq
    stages.validate_stage(ctx, "topdown"); stages.plan_stage(ctx); stages.preprocess_stage(ctx, "topdown")
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    stages.measure_stage(ctx, "topdown")
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    root = Path(store) / "runs/td-post/measurements"
    h = hashlib.sha256()
    for f in sorted(glob.glob(str(root / "**/*.parquet"), recursive=True)):
        t = pq.read_table(f).replace_schema_metadata(None)
        buf = io.BytesIO(); pq.write_table(t, buf); h.update(f[len(str(root)):].encode()); h.update(buf.getvalue())
    print(json.dumps({"cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "sys": r1.ru_stime - r0.ru_stime,
                      "wall": wall, "peak_rss_mb": r1.ru_maxrss / 1024, "digest": {"nmf": h.hexdigest()[:16]}}))
    sys.exit(0)
plugin = ctx.plugin("topdown") if hasattr(ctx, "plugin") else ctx.adapter("topdown")
cfg = ctx.product_config("topdown")
public = ctx.post_public("topdown")
measurements = stages.load_measurements(ctx, "topdown") if mode == "single" else None
r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
if mode == "single":
    est = plugin.product(cfg).postprocess(measurements, public)
else:
    rec = stages.postprocess_stage(ctx, "topdown", force=True)
    est = {o["name"]: ctx.post_store().get_parquet(k) for k, o in rec["outputs"].items()}
wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
def digest(frame):
    frame = frame.drop(columns=[c for c in ("seconds", "cpu_seconds") if c in frame.columns])
    buf = io.BytesIO(); frame.reset_index(drop=True).to_parquet(buf, index=False)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:16]
import glob
import numpy as np, pandas as pd
l1 = {}
for name, frame in est.items():  # L1 error of every level's estimates against its true histogram
    if not name.startswith("internal/"):
        continue
    level = name.removeprefix("internal/")
    files = glob.glob(f"{store}/runs/td-post/prepared/topdown/part=*/hist/{level}.parquet")
    true = pd.concat([pd.read_parquet(f) for f in files]).groupby(["UNIT", "CELL"])["COUNT"].sum()
    frame = frame if isinstance(frame, pd.DataFrame) else pd.concat([t.to_pandas() for t in frame()])
    l1[level] = int(np.abs(frame.set_index(["UNIT", "CELL"])["COUNT"].sub(true, fill_value=0)).sum())
print(json.dumps({"cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime, "sys": r1.ru_stime - r0.ru_stime,
                  "wall": wall, "peak_rss_mb": r1.ru_maxrss / 1024, "l1": l1,
                  "digest": {k: digest(v) for k, v in sorted(est.items())}}))
'''


def prepare(root: Path, persons: int, seed: int, measured: bool = True) -> None:
    """Synthetic census, public TopDown files and a measured seeded release ``td-post`` under ``root`` (only
    the census and the frozen config unless ``measured``)."""
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE / "benchmarks"))
    from scale_out import build

    from dasflow.config import parse_release_config
    from dasflow.io.store import LocalStore
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    raw = build(root, persons, STATES.split(","), seed) | {"release_id": "td-post"}
    ctx = freeze_config(parse_release_config(raw), LocalStore(root))
    if not measured:
        return
    stages.validate_stage(ctx, "topdown")
    stages.plan_stage(ctx)
    stages.preprocess_stage(ctx, "topdown")
    stages.measure_stage(ctx, "topdown")


def commit(tree: Path) -> str:
    """A checkout's commit (``+dirty`` with uncommitted changes), to name it in the report without a path of
    this machine."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if git("status", "--porcelain") else "")


def run(tree: Path, store: Path, mode: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(store), mode], check=True,
                         capture_output=True, text=True, cwd=str(tree))
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, nargs="+", default=[1_000_000])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--other", type=Path, help="another dasflow checkout to compare (e.g. a git worktree)")
    ap.add_argument("--modes", nargs="+", default=["single", "parts"], choices=["single", "parts", "measure"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--prepare", type=Path, help=argparse.SUPPRESS)  # internal: build one store and exit
    ap.add_argument("--census-only", action="store_true", help=argparse.SUPPRESS)  # internal: with --prepare
    args = ap.parse_args()
    if args.prepare:
        prepare(args.prepare, args.persons[0], args.seed, measured=not args.census_only)
        return 0
    trees = {"this": HERE} | ({"other": args.other.resolve()} if args.other else {})
    report: dict[str, Any] = {"load_before": os.getloadavg(), "trees": {k: commit(v) for k, v in trees.items()},
                              "runs": []}
    for persons in args.persons:
        work = Path(tempfile.mkdtemp(prefix="dasflow-td-post-"))
        try:
            # in a child process: this one stays small, and a child's ru_maxrss starts from its parent's RSS
            if {"single", "parts"} & set(args.modes):
                subprocess.run([sys.executable, __file__, "--prepare", str(work), "--persons", str(persons),
                                "--seed", str(args.seed)], check=True, cwd=str(HERE))
            if "measure" in args.modes:
                subprocess.run([sys.executable, __file__, "--prepare", str(work / "census"), "--persons",
                                str(persons), "--seed", str(args.seed), "--census-only"], check=True, cwd=str(HERE))
            for mode in args.modes:
                best: dict[str, dict[str, Any]] = {}
                for _ in range(args.repeat):
                    for name, tree in trees.items():
                        if mode == "measure":  # a fresh copy of the census, taken up to measurement by this tree
                            shutil.rmtree(work / "measured", ignore_errors=True)
                            shutil.copytree(work / "census", work / "measured")
                            r = run(tree, work / "measured", mode)
                        else:
                            r = run(tree, work, mode)
                        if name not in best or r["cpu"] < best[name]["cpu"]:
                            best[name] = r
                row: dict[str, Any] = {"persons": persons, "mode": mode}
                for name, r in best.items():
                    row[name] = {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()
                                 if k != "digest"} | {"cpu_us_per_person": round(1e6 * r["cpu"] / persons, 2)}
                if "other" in best:
                    row["identical"] = best["this"]["digest"] == best["other"]["digest"]
                    row["cpu_ratio_other_over_this"] = round(best["other"]["cpu"] / best["this"]["cpu"], 2)
                print(json.dumps(row), flush=True)
                report["runs"].append(row)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    report["load_after"] = os.getloadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r.get("identical", True) for r in report["runs"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
