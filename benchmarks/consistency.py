"""The release stage's TopDown consistency check at national-like size (issue #20 item 2): CPU and peak RSS of
the check streamed from the store (``topdown_consistency`` on ``ReleaseFiles``, this tree; ``streamed``: one pair
of levels after the other; ``threads``: the pairs side by side on the machine's cores) against the whole tables as
pandas string frames through ``hierarchy_check`` (the code before ``bdc6fd5``), side by side; CPU and wall.

    .venv/bin/python benchmarks/consistency.py [--blocks 2400000] [--ways streamed threads] [--out FILE]

Synthetic published TopDown tables (no census data: GEOIDs of ``--blocks`` blocks under 51 states, ten block
groups per tract, a few nonzero cells per block of HHGQ × VOTINGAGE × HISPANIC codes, Poisson counts; every
coarser level the exact sum, so every check compares the full parent table and finds 0 differences) are written
pipe-delimited into a local store as the release stage writes them. Then each way runs in a fresh process: CPU
seconds and peak RSS above the interpreter with the imports (``ru_maxrss`` before and after the call; the tables
are written by another child, so no process starts from a large parent's high-water mark). The two ways must give
the same rows.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

CHILD = r'''
import itertools, json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import pandas as pd
from dasflow.io.store import LocalStore
from dasflow.products.reporting import hierarchy_check
from dasflow.products.topdown.reporting import TOPDOWN_LEVELS, topdown_consistency
from dasflow.release.accuracy import ReleaseFiles


def whole(files):
    """The check before bdc6fd5: every level read whole as string frames, hierarchy_check on them."""
    rows = []
    present = [(n, w) for n, w in TOPDOWN_LEVELS if f"topdown_{n}.csv" in files]
    for (pname, pw), (cname, _) in itertools.pairwise(present):
        parent, child = files[f"topdown_{pname}.csv"], files[f"topdown_{cname}.csv"]
        attrs = [c for c in child.columns if c not in ("GEOID", "COUNT")]
        geo = child["GEOID"].astype(str)
        link = pd.DataFrame({"GEOID": (geo.str[:pw] if pw else pd.Series(["US"] * len(child))).to_numpy()})
        c, d, m = hierarchy_check(parent.assign(GEOID=parent["GEOID"].astype(str)), child, ["GEOID"], link, attrs)
        rows.append({"product": "topdown", "check": f"{pname} = Σ {cname}", "cells": c, "inconsistent": d,
                     "max_abs_diff": m})
    return rows


files = ReleaseFiles(LocalStore(sys.argv[2]), "release/topdown/")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
t, w = time.process_time(), time.perf_counter()
way = sys.argv[3]
if way == "whole":
    rows = whole(files)
elif way == "streamed":  # one pair of levels after the other
    rows = topdown_consistency(files, workers=1)
else:  # "threads": the pairs side by side on the machine's cores
    rows = topdown_consistency(files)
cpu, wall = time.process_time() - t, time.perf_counter() - w
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"way": way, "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
                  "peak_above_imports_bytes": peak - base, "imports_bytes": base, "rows": rows}))
'''


def write_tables(store: Path, blocks: int, seed: int = 11) -> dict[str, int]:
    """The six TopDown tables (US … block) of ``blocks`` synthetic blocks, pipe-delimited; rows per table."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    states = np.sort(rng.choice(np.arange(1, 57), size=51, replace=False))
    state = states[np.sort(rng.integers(0, 51, size=blocks))]
    block_no = np.arange(blocks)
    tract = block_no // 40
    def digits(values: Any, width: int) -> pd.Series:
        return pd.Series(values).astype(str).str.zfill(width)

    geoid = (digits(state, 2) + digits((tract // 25) % 1000, 3) + digits(tract % 1_000_000, 6)
             + digits((block_no % 40) // 14 + 1, 1) + digits(block_no % 40, 3))  # 3 block groups per tract
    cells = rng.integers(1, 11, size=blocks)  # ≈ 5.5 nonzero cells per block, as a TopDown release has
    idx = np.repeat(np.arange(blocks), cells)
    frame = pd.DataFrame({"GEOID": geoid.to_numpy()[idx], "HHGQ": rng.integers(0, 8, idx.size),
                          "VOTINGAGE": rng.integers(0, 2, idx.size), "HISPANIC": rng.integers(0, 2, idx.size),
                          "COUNT": rng.poisson(3, idx.size) + 1})
    keys = ["GEOID", "HHGQ", "VOTINGAGE", "HISPANIC"]
    frame = pd.DataFrame(frame.groupby(keys, as_index=False)["COUNT"].sum())
    out = store / "release" / "topdown"
    out.mkdir(parents=True, exist_ok=True)
    sizes = {}
    for name, width in (("block", 15), ("block_group", 12), ("tract", 11), ("county", 5), ("state", 2), ("US", 0)):
        level = frame.assign(GEOID=frame["GEOID"].str[:width] if width else "US")
        level = pd.DataFrame(level.groupby(keys, as_index=False)["COUNT"].sum())
        level.to_csv(out / f"topdown_{name}.csv", sep="|", index=False)
        sizes[name] = len(level)
    return sizes


def run(store: Path, way: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(REPO), str(store), way], check=True,
                         capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=2_400_000, help="blocks (≈ 2.4 M at 100 M persons)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--ways", nargs="+", choices=("whole", "streamed", "threads"),
                    default=["whole", "streamed", "threads"])
    ap.add_argument("--write", type=Path, default=None, help=argparse.SUPPRESS)  # internal: write the tables
    args = ap.parse_args()
    if args.write:
        print(json.dumps(write_tables(args.write, args.blocks)))
        return 0
    with tempfile.TemporaryDirectory(prefix="consistency-") as tmp:
        store = Path(tmp)
        # written by a child: a child's ru_maxrss starts at its parent's high-water mark (Linux keeps it across
        # fork and exec), so this parent must never hold the tables
        sizes = json.loads(subprocess.run([sys.executable, __file__, "--write", str(store), "--blocks",
                                           str(args.blocks)], check=True, capture_output=True,
                                          text=True).stdout.strip().splitlines()[-1])
        print(f"tables (rows): {sizes}", flush=True)
        results = [run(store, way) for way in args.ways]
    for r in results:
        print(f"  {r['way']:<9} {r['cpu_s']:7.2f} CPU-s {r['wall_s']:7.2f} s wall  peak "
              f"{r['peak_above_imports_bytes'] / 2**20:8.0f} MB above the imports", flush=True)
    if any(r["rows"] != results[0]["rows"] for r in results):
        raise SystemExit("the ways give different rows")
    if args.out:
        args.out.write_text(json.dumps({"blocks": args.blocks, "rows": sizes, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
