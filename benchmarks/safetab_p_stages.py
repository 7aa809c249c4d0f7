"""SafeTab-P alone through the stage functions (issue #20 item 6): CPU seconds per stage, and the release bytes.

A seeded (test-mode) release of SafeTab-P only, on the demo's synthetic census and the demo's SafeTab-P config
(``dasflow/demo_data/safetab-p-config.json``): validate, plan, preprocess, measure, post-process, then the
release stage (with the accuracy report's ground-truth twin: test mode). Each stage runs in a fresh
subprocess, so its peak RSS (``ru_maxrss`` of the child, interpreter and imports included) is its own; its CPU
is the stage manifest's ``metrics`` when the stage writes one (the stage function alone), else the child's
user + sys time minus its import time. The sha256 of every release file is recorded (the certificate's and
manifest's code-version mentions masked), so two checkouts compare byte for byte:

    .venv/bin/python benchmarks/safetab_p_stages.py --persons 20000 --out /tmp/stp-before.json
    .venv/bin/python benchmarks/safetab_p_stages.py --persons 1000000 --layout states --out /tmp/stp-1m.json
    .venv/bin/python benchmarks/safetab_p_stages.py --compare /tmp/stp-before.json /tmp/stp-after.json

``--layout file`` (default): one ``person-records.txt`` as the demo writes it; ``states``: one person-records
file per state (the partitioned path, as ``benchmarks/national.py`` builds it). ``--store DIR`` reuses a
generated census (the run's folder is removed first). The load average (1 min) is recorded: the box is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.demo import release_digest  # noqa: E402  (after the repository is on the path)

PRODUCT = "safetab-p"
SEED = 7
STAGES = ("validate", "plan", "preprocess", "measure", "postprocess", "release")


def _generate(store_dir: Path, persons: int, layout: str) -> None:
    """The synthetic census in SafeTab-P's layout (the demo's seed; US states) and its public GRF-C."""
    from dasflow import demo, synth
    from dasflow.synth.reference import states as synth_states

    marker = store_dir / f".safetab_p_stages-{persons}-{layout}"
    if marker.exists():
        return
    fmt = "safetab_p" if layout == "file" else "safetab_p_states"
    root = store_dir / demo.SYNTH_ROOT
    shutil.rmtree(root, ignore_errors=True)
    us = [code for code in sorted(synth_states()) if code != "72"]
    synth.generate(root, persons=persons, seed=SEED, states=us, formats=(fmt,))
    public = store_dir / "public" / "safetab-p"
    public.mkdir(parents=True, exist_ok=True)
    os.replace(root / fmt / "GRF-C.txt", public / "GRF-C.txt")
    marker.write_text("")


def _config(store_dir: Path, persons: int, layout: str) -> dict[str, Any]:
    """The demo's seeded config with SafeTab-P only (its inputs moved to the per-state layout if asked)."""
    from dasflow import demo

    raw = demo.demo_config(store_dir, persons, SEED).model_dump(mode="json", exclude_none=True)
    raw["release_id"] = f"safetab-p-{persons}-{layout}"
    raw["products"] = [p for p in raw["products"] if p["name"] == PRODUCT]
    raw["inputs"] = {k: v for k, v in raw["inputs"].items() if k.startswith(PRODUCT)}
    if layout == "states":
        raw["inputs"][PRODUCT] = raw["inputs"][PRODUCT].replace("/safetab_p/", "/safetab_p_states/")
    raw.pop("account", None)
    return dict(raw)


def _child(config_file: str, stage: str) -> None:
    """One stage in this (fresh) process; prints a JSON line with the stage's CPU seconds."""
    t_import = time.process_time()
    from dasflow.config import parse_release_config
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config
    from dasflow.release.stage import release_stage

    raw = json.loads(Path(config_file).read_text())
    ctx = freeze_config(parse_release_config(raw, source="benchmarks/safetab_p_stages.py"))
    c0 = time.process_time()
    if stage == "plan":
        stages.plan_stage(ctx)
    elif stage == "release":
        release_stage(ctx)
    else:
        {"validate": stages.validate_stage, "preprocess": stages.preprocess_stage,
         "measure": stages.measure_stage, "postprocess": stages.postprocess_stage}[stage](ctx, PRODUCT)
    print(json.dumps({"cpu": time.process_time() - c0, "imports_cpu": c0 - t_import}))


def run(persons: int, layout: str, store: str | None) -> dict[str, Any]:
    store_dir = Path(store) if store else Path(tempfile.mkdtemp(prefix="safetab-p-stages-")) / "store"
    store_dir = store_dir.absolute()
    store_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    _generate(store_dir, persons, layout)
    print(f"census ready ({time.perf_counter() - t0:.1f} s wall)", flush=True)
    raw = _config(store_dir, persons, layout)
    shutil.rmtree(store_dir / "runs" / raw["release_id"], ignore_errors=True)
    config_file = store_dir / f"{raw['release_id']}.json"
    config_file.write_text(json.dumps(raw))
    rows: list[dict[str, Any]] = []
    load0 = os.getloadavg()[0]
    for stage in STAGES:
        w0 = time.perf_counter()
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = subprocess.Popen([sys.executable, __file__, "--child", str(config_file), stage],
                                    stdout=out, stderr=err)
            _, status, usage = os.wait4(proc.pid, 0)  # this child's own CPU and peak RSS
            proc.returncode = os.waitstatus_to_exitcode(status)
            wall = time.perf_counter() - w0
            out.seek(0)
            err.seek(0)
            if proc.returncode != 0:
                raise SystemExit(f"{stage} failed:\n{err.read()[-4000:]}")
            child = json.loads(out.read().strip().splitlines()[-1])
        rows.append({"stage": stage, "cpu": round(child["cpu"], 2), "wall": round(wall, 2),
                     "process_cpu": round(usage.ru_utime + usage.ru_stime, 2),
                     "peak_rss_mb": round(usage.ru_maxrss / 1024)})
        print(f"  {stage:<12} {rows[-1]['cpu']:7.2f} CPU-s (stage)  {rows[-1]['process_cpu']:7.2f} CPU-s (process)"
              f"  {wall:7.2f} s wall  peak RSS {rows[-1]['peak_rss_mb']} MB", flush=True)
    rel_root = store_dir / "runs" / raw["release_id"] / "release"
    files = {p.relative_to(rel_root).as_posix():
             release_digest(p.relative_to(rel_root).as_posix(), p.read_bytes())
             for p in sorted(rel_root.rglob("*")) if p.is_file()}
    return {"persons": persons, "layout": layout, "seed": SEED, "load_before": load0,
            "load_after": os.getloadavg()[0], "stages": rows, "files": files, "store": str(store_dir)}


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    diff = sorted(k for k in set(a["files"]) | set(b["files"]) if a["files"].get(k) != b["files"].get(k))
    print(f"{len(a['files'])} vs {len(b['files'])} release files; differing: {diff or 'none'}")
    before = {r["stage"]: r for r in a["stages"]}
    for r in b["stages"]:
        old = before.get(r["stage"], {})
        print(f"  {r['stage']:<12} {old.get('cpu', float('nan')):7.2f} -> {r['cpu']:7.2f} CPU-s")
    print(f"  {'total':<12} {sum(r['cpu'] for r in a['stages']):7.2f} -> {sum(r['cpu'] for r in b['stages']):7.2f}"
          f" CPU-s (load {a['load_before']:.1f}/{a['load_after']:.1f} vs {b['load_before']:.1f}/{b['load_after']:.1f})")
    return 1 if diff else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=int, default=20_000)
    ap.add_argument("--layout", choices=("file", "states"), default="file")
    ap.add_argument("--store", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--compare", nargs=2, default=None)
    ap.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(*args.child)
        return 0
    if args.compare:
        return compare(*args.compare)
    result = run(args.persons, args.layout, args.store)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
