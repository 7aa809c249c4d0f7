"""Benchmark of the synthetic census generator (dasflow.synth): persons/s per core to Parquet, peak memory.

Each measurement runs in a fresh subprocess (so the peak RSS is that run's own). Reported side by side:

* ``generate``  : generation only (all states, chunks built and dropped, nothing written);
* ``write-only``: the peer floor: writing the very same Arrow tables to Parquet with the same settings
                  (pyarrow alone, no generation), on one 2 M-person chunk, scaled per person;
* ``parquet``   : the full ``dasflow.synth.generate(..., formats=("parquet",))`` run, manifest and hashes included;
* ``census``    : the Census text formats (PHSafe + SafeTab-P), for reference.

Throughput per core = persons / CPU seconds of the process (the machine is shared, so wall time is noisy and
reported separately). Usage::

    .venv/bin/python benchmarks/synth.py                       # 1 M and 10 M persons, full-US extrapolation
    .venv/bin/python benchmarks/synth.py --sizes 1e6 --full    # also a measured full-US run (~331 M persons)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

FULL_US = 331_449_281


def _measure(kind: str, persons: int, workdir: str) -> dict[str, Any]:
    import pyarrow.parquet as pq

    from dasflow import synth
    from dasflow.synth.tables import geo_table, persons_table, units_table

    out = Path(workdir) / f"{kind}-{persons}"
    c0, w0 = time.process_time(), time.perf_counter()
    rows = persons
    if kind == "generate":
        for st, n in synth.apportion(persons, synth.parse_states(None)).items():
            for _ctx, _c in synth.iter_state_chunks(st, n, 1):
                pass
    elif kind == "write-only":
        ((ctx, c),) = list(synth.iter_state_chunks("06", persons, 1, chunk_persons=persons + 1))
        tables = [persons_table(c), units_table(c), geo_table(c, ctx.geo)]
        c0, w0 = time.process_time(), time.perf_counter()
        out.mkdir(parents=True)
        for i, t in enumerate(tables):
            pq.write_table(t, out / f"{i}.parquet", compression="snappy", use_dictionary=False)
    elif kind in ("parquet", "census"):
        formats = ("parquet",) if kind == "parquet" else ("phsafe", "safetab_p")
        synth.generate(out, persons, 1, formats=formats)
    else:
        raise ValueError(kind)
    cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file()) if out.exists() else 0
    shutil.rmtree(out, ignore_errors=True)
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"kind": kind, "persons": rows, "cpu_s": cpu, "wall_s": wall, "persons_per_cpu_s": rows / cpu,
            "peak_rss_gb": peak_kib / 1024**2, "bytes": size, "bytes_per_person": size / rows}


def run_one(kind: str, persons: int, workdir: str) -> dict[str, Any]:
    """Run one measurement in a subprocess and return its JSON result."""
    code = (f"import json,sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import synth as b; "
            f"print(json.dumps(b._measure({kind!r}, {persons}, {workdir!r})))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return dict(json.loads(res.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1e6,1e7", help="comma-separated person counts")
    ap.add_argument("--full", action="store_true", help="also run the full US (~331 M persons) to Parquet")
    ap.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--json", default=None, help="write the raw results here")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    workdir = args.workdir or tempfile.mkdtemp(prefix="synth-bench-")
    results: list[dict[str, Any]] = []
    for n in sizes:
        for kind in ("generate", "parquet"):
            results.append(run_one(kind, n, workdir))
            print(json.dumps(results[-1]), flush=True)
    results.append(run_one("write-only", min(sizes[0], 2_000_000), workdir))
    print(json.dumps(results[-1]), flush=True)
    results.append(run_one("census", sizes[0], workdir))
    print(json.dumps(results[-1]), flush=True)
    if args.full:
        results.append(run_one("parquet", FULL_US, workdir))
        print(json.dumps(results[-1]), flush=True)
    big = max((r for r in results if r["kind"] == "parquet"), key=lambda r: r["persons"])
    extrap = {"persons": FULL_US, "cpu_s": FULL_US / big["persons_per_cpu_s"],
              "wall_s": big["wall_s"] * FULL_US / big["persons"], "from_persons": big["persons"]}
    meta = {"date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.platform(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "command": " ".join(sys.argv)}
    print(json.dumps({"meta": meta, "full_us_extrapolated": extrap}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "results": results, "extrapolated": extrap}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
