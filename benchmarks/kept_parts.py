"""TopDown's post-processing parts on a kept national run, this tree against another checkout, side by side.

    .venv/bin/python benchmarks/national.py --persons 10e6 --production --lanes 1 --dask-workers 2 --keep \\
        --workdir <kept-run dir>
    git worktree add --detach <worktree> <rev>
    .venv/bin/python benchmarks/kept_parts.py --workdir <kept-run dir> --other <worktree> --repeat 2 \\
        --out benchmarks/results/kept_parts_session20.json

Every part of every wave of the kept run (its national geography, its committed NMFs) is computed again in one
fresh process per (tree, repeat), in wave order, with the code of the tree under test only, as a worker computes
its batches (measurements dropped after each batch). Reported per run: user and system CPU seconds and wall
seconds of the parts (the run context and task plan are built before the clock starts), and a digest of every
part's outputs in the tree's own parts directory (keyed by its code version; paths relative to it) except
its timing file (``run.parquet``: iterations and seconds), which must agree between the trees when an
estimator change is meant to keep the estimates. The least CPU over ``--repeat`` runs is the figure.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

# Runs inside a fresh interpreter with the tree under test first on sys.path (argv: tree, workdir).
CHILD = r'''
import glob, hashlib, json, resource, sys, time
from pathlib import Path
tree = sys.argv[1]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
import national
from dasflow.pipeline import stages
run = glob.glob(sys.argv[2] + "/national-*")[0]
ctx = national._context(Path(run, "config.json"))
waves = stages.postprocess_waves(ctx, "topdown", 2)
split = stages.partitioner(ctx, "topdown")
parts = stages.stored_parts(ctx, "topdown")
public = ctx.post_public("topdown")
r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
n = 0
for wave in waves:
    for batch in wave:
        for step, part in batch:
            stages._compute_part(split, parts, step, part, public, force=True)
            n += 1
        parts.drop_measurements()
        split.drop_held()
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
# this tree's own parts only: the parts directory is keyed by the code version, so each tree writes its own
mine = Path(run, "store", parts.prefix)
digest = hashlib.sha256()
for f in sorted(mine.glob("**/*.parquet")):
    if f.name != "run.parquet":
        digest.update(str(f.relative_to(mine)).encode() + f.read_bytes())
print(json.dumps({"run": Path(run).name, "parts": n, "user": round(r1.ru_utime - r0.ru_utime, 2),
                  "sys": round(r1.ru_stime - r0.ru_stime, 2),
                  "wall": round(wall, 2), "digest": digest.hexdigest()}))
'''


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--workdir", type=Path, required=True, help="a national.py --keep workdir")
    args = ap.parse_args()
    result = side_by_side.compare("kept_parts", args.other, args.repeat,
                                  lambda tree: side_by_side.child(CHILD, str(tree), str(args.workdir)))
    runs = result["runs"]
    result |= {"kept_run": runs["this"][0]["run"],  # the kept run by name: no path of this machine
               "identical": len({r["digest"] for rs in runs.values() for r in rs}) == 1}
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
