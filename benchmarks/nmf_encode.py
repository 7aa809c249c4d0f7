"""``encode_nmf`` on a kept national run's TopDown NMF segments, this tree against another checkout, side by side.

    .venv/bin/python benchmarks/nmf_encode.py --workdir <national.py --keep workdir> --other <worktree> \\
        --repeat 2 --out benchmarks/results/nmf_encode_session22.json

In one fresh process per (tree, repeat), every stored TopDown segment of the kept run is decoded
(``decode_nmf``: its variance column holds one Fraction object per distinct value, as a measurement's does) and
then, on the clock, encoded again by the tree's ``encode_nmf`` with the segment's own spec, binding and segment
name. Reported: CPU seconds of the encodes (user + system), segments and rows, and whether every encode gives
the stored segment's very bytes (it must, in both trees: the same pyarrow, the same values).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]

# argv: tree, workdir
CHILD = r'''
import glob, io, json, resource, sys
tree, workdir = sys.argv[1:3]
sys.path.insert(0, tree)
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
import pyarrow.parquet as pq
from dasflow.privacy.ledger import decode_nmf, encode_nmf, nmf_binding, spec_from_record
files = sorted(glob.glob(workdir + "/national-*/store/runs/*/measurements/topdown/**/seg=*.parquet", recursive=True))
jobs = []
for f in files:
    data = open(f, "rb").read()
    meta = pq.read_schema(io.BytesIO(data)).metadata
    spec = spec_from_record(json.loads(meta[b"dasflow.spec"]))
    jobs.append((data, decode_nmf(data, spec), spec, nmf_binding(data), meta[b"dasflow.segment"].decode()))
r0 = resource.getrusage(resource.RUSAGE_SELF)
out = [encode_nmf(m, spec, {k: v for k, v in binding.items() if k != "rng_mode"}, segment=segment)
       for _, m, spec, binding, segment in jobs]
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"segments": len(jobs), "rows": sum(len(m.table) for _, m, *_ in jobs),
                  "user": round(r1.ru_utime - r0.ru_utime, 2), "sys": round(r1.ru_stime - r0.ru_stime, 2),
                  "same_bytes": all(o == j[0] for o, j in zip(out, jobs))}))
'''


def _run(tree: Path, workdir: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(workdir)], check=True, capture_output=True,
                         text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = round(result["user"] + result["sys"], 2)
    return result


def _commit(tree: Path) -> str:
    return subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", type=Path, required=True, help="a national.py --keep workdir")
    ap.add_argument("--other", type=Path, required=True, help="another dasflow checkout (e.g. a git worktree)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"this": [], "other": []}
    for _ in range(args.repeat):  # interleaved, so that a change in the machine's load hits both trees
        for name, tree in (("this", HERE), ("other", args.other.resolve())):
            runs[name].append(_run(tree, args.workdir))
            print(name, runs[name][-1], flush=True)
    best = {name: min(rs, key=lambda r: r["cpu"]) for name, rs in runs.items()}
    result = {"benchmark": "nmf_encode", "this_commit": _commit(HERE), "other_commit": _commit(args.other),
              "runs": runs, "best": best,
              "cpu_ratio_other_over_this": round(best["other"]["cpu"] / best["this"]["cpu"], 3),
              "same_bytes": all(r["same_bytes"] for rs in runs.values() for r in rs)}
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
