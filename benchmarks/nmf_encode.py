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

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

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


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--workdir", type=Path, required=True, help="a national.py --keep workdir")
    args = ap.parse_args()
    result = side_by_side.compare("nmf_encode", args.other, args.repeat,
                                  lambda tree: side_by_side.child(CHILD, str(tree), str(args.workdir)))
    result["same_bytes"] = all(r["same_bytes"] for rs in result["runs"].values() for r in rs)
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
