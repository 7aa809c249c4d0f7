"""Bytes each stage hashes (``LocalStore.sha256``), this tree against another checkout, on a seeded synthetic census.

    git worktree add /tmp/old 623ae63
    .venv/bin/python benchmarks/stage_hashing.py --persons 3000000 --other /tmp/old --json out.json

Per tree, in a fresh process: the national benchmark's census (``benchmarks/national.py``: all five products,
every input format, production mode) is generated in a temporary store, then validate (each product), plan,
preprocess and measure run through the stage functions, each stage in a fresh run context as a stage process has
(a context hashes each input prefix at most once); TopDown's measurement batches run in one context, as one Dask
worker runs them. Reported per stage: bytes hashed, objects hashed and CPU seconds, and the total against the
confidential inputs' size — the number of full passes over the inputs a release makes. Hashing is ≈ 1.6 GB/s per
core here (SHA-256), and at national size the inputs (≈ 48 GB) do not fit in the page cache, so every pass is
also read from disk. The byte counts are exact and do not depend on the machine's load; the CPU seconds do.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

CHILD = r'''
import json, os, sys, time
from pathlib import Path
tree, work, persons = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
sys.path[:0] = [str(tree), str(tree / "benchmarks")]
import national as nat
from dasflow.io.store import LocalStore
from dasflow.pipeline import stages
count = {"bytes": 0, "objects": 0}
sha256 = LocalStore.sha256
def counting(self, key):
    count["bytes"] += os.path.getsize(self.local_path(key))
    count["objects"] += 1
    return sha256(self, key)
LocalStore.sha256 = counting
store = work / "store"
store.mkdir(parents=True)
nat._synth_step(store, persons)
raw = nat.release_config(store, persons, production=True)
config = work / "config.json"
config.write_text(json.dumps(raw))
products = [p["name"] for p in raw["products"]]
out = {}
def run(name, fn):
    count["bytes"] = count["objects"] = 0
    t = time.process_time()
    fn()
    out[name] = {"bytes_hashed": count["bytes"], "objects_hashed": count["objects"],
                 "cpu_s": round(time.process_time() - t, 2)}
def batches(p):
    ctx = nat._context(config)
    for b in stages.measure_batches(ctx, p):
        stages.measure_batch(ctx, p, b)
for p in products:
    run(f"validate {p}", lambda p=p: stages.validate_stage(nat._context(config), p))
run("plan", lambda: stages.plan_stage(nat._context(config)))
for p in products:
    run(f"preprocess {p}", lambda p=p: stages.preprocess_stage(nat._context(config), p))
    if stages.measured_in_batches(nat._context(config), p):
        run(f"measure-batches {p} (one worker)", lambda p=p: batches(p))
    run(f"measure {p}", lambda p=p: stages.measure_stage(nat._context(config), p))
inputs = sum(f.stat().st_size for f in (store / "confidential").rglob("*") if f.is_file())
print(json.dumps({"stages": out, "confidential_input_bytes": inputs}))
'''


def commit(tree: Path) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")  # a worktree's .venv link is not a change
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if dirty else "")


def measure(tree: Path, persons: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="dasflow-hashing-") as work:
        done = subprocess.run([sys.executable, "-c", CHILD, str(tree), work, str(persons)], check=True,
                              capture_output=True, text=True, cwd=str(tree))
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    total = sum(s["bytes_hashed"] for s in result["stages"].values())
    return {"tree": commit(tree), "total_bytes_hashed": total,
            "passes_over_inputs": round(total / result["confidential_input_bytes"], 2), **result}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--persons", type=float, default=3e6)
    ap.add_argument("--other", type=Path, default=None, help="another checkout of dasflow to compare against")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    runs = [measure(t, int(args.persons)) for t in ([args.other] if args.other else []) + [here]]
    for r in runs:
        print(f"{r['tree']}: {r['total_bytes_hashed'] / 1e9:.2f} GB hashed, {r['passes_over_inputs']} passes over "
              f"{r['confidential_input_bytes'] / 1e9:.3f} GB of confidential inputs")
        for name, s in r["stages"].items():
            print(f"  {name:<38} {s['bytes_hashed'] / 1e6:10.1f} MB {s['objects_hashed']:6d} objects "
                  f"{s['cpu_s']:7.2f} CPU-s")
    if args.json:
        args.json.write_text(json.dumps({"benchmark": "stage_hashing", "persons": int(args.persons), "runs": runs},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
