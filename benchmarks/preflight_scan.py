"""The preflight's scan of delimited inputs (``check_delimited``), this tree against another checkout, side by side.

    .venv/bin/python benchmarks/national.py --persons 10e6 --production --keep --workdir <kept-run dir>
    git worktree add --detach <worktree> <rev>
    .venv/bin/python benchmarks/preflight_scan.py --workdir <kept-run dir> --other <worktree> --repeat 3

Each run is a fresh interpreter (``side_by_side``) that checks the ``--files`` largest SafeTab-P person files of
the kept run (pipe-delimited, its required header) in turn. Reported: user and system CPU seconds, the bytes
scanned and CPU nanoseconds per byte, and whether both trees return the same result (delimiter, header, rows;
only that boolean is kept, no count of the inputs).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

CHILD = r'''
import glob, hashlib, json, os, resource, sys
tree, workdir, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, tree)
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
from dasflow.products.safetab_p.records import PERSON_COLUMNS
from dasflow.validation.preflight import check_delimited
files = sorted(glob.glob(workdir + "/national-*/store/confidential/synth/safetab_p_states/person-records/*.txt"),
               key=os.path.getsize)[-count:]
size = sum(os.path.getsize(f) for f in files)
results = hashlib.sha256()
r0 = resource.getrusage(resource.RUSAGE_SELF)
for f in files:
    results.update(json.dumps(check_delimited(f, PERSON_COLUMNS, "|")).encode())
r1 = resource.getrusage(resource.RUSAGE_SELF)
user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
print(json.dumps({"files": len(files), "bytes": size, "user": round(user, 2), "sys": round(system, 2),
                  "ns_per_byte": round((user + system) / size * 1e9, 2), "result": results.hexdigest()}))
'''


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--workdir", type=Path, required=True, help="a national.py --keep workdir")
    ap.add_argument("--files", type=int, default=6)
    args = ap.parse_args()
    result = side_by_side.compare(
        "preflight_scan", args.other, args.repeat,
        lambda tree: side_by_side.child(CHILD, str(tree), str(args.workdir), str(args.files)))
    runs = [r for rs in result["runs"].values() for r in rs]
    result["identical"] = len({r["result"] for r in runs}) == 1
    for r in runs:  # a digest of row counts of the inputs is not kept
        r.pop("result")
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
