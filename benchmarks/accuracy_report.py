"""The release stage of the demo's test release, this tree against another checkout, side by side.

    git worktree add --detach <worktree> <rev>
    .venv/bin/python benchmarks/accuracy_report.py --other <worktree> --repeat 2 \\
        --out benchmarks/results/accuracy_report_session25.json

In one fresh process per (tree, repeat), with the code of the tree under test only, the demo's release
(``prepare_demo`` at ``--persons`` 1000, seed 3: every product, TEST mode) is made through the stage functions in
a temporary store (untimed: each tree's stage records are its own code version's), then:

* ``accuracy``: CPU of ``write_accuracy_report`` (a test release's report: every product's ground-truth twin,
  the comparisons and the plots), and whether the report's bytes agree between the trees (``identical``);
* ``resume``: CPU of ``release_stage`` on that release, already finished: what a resumed or re-run demo pays at
  its end.

The demo's census is synthetic; still, only "identical" is kept, no digest.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

# argv: tree, store directory, persons, seed
CHILD = r'''
import hashlib, json, os, resource, sys
tree, root, persons, seed = sys.argv[1:5]
sys.path.insert(0, tree)
os.environ["DASFLOW_TEST_MODE"] = "1"
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
from dasflow import demo
from dasflow.pipeline import stages
from dasflow.pipeline.run import freeze_config
from dasflow.release.stage import release_stage, write_accuracy_report

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, r.ru_utime, r.ru_stime

from pathlib import Path
cfg = demo.prepare_demo(Path(root), int(persons), int(seed))  # the demo's release with this tree's code (untimed)
ctx = freeze_config(cfg)
for p in cfg.products:
    stages.validate_stage(ctx, p.name)
stages.plan_stage(ctx)
for p in cfg.products:
    stages.preprocess_stage(ctx, p.name)
    stages.measure_stage(ctx, p.name)
    stages.postprocess_stage(ctx, p.name)
release_stage(ctx)
t0, u0, s0 = cpu()
write_accuracy_report(ctx)
t1, u1, s1 = cpu()
release_stage(ctx)  # the release is finished: what a resumed demo pays at its end
t2, _, _ = cpu()
page = ctx.store.get(f"runs/{cfg.release_id}/release/ACCURACY.html")
print(json.dumps({"user": round(u1 - u0, 2), "sys": round(s1 - s0, 2), "resume_cpu": round(t2 - t1, 2),
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "digest": hashlib.sha256(page).hexdigest()}))
'''


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--persons", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=3)
    args = ap.parse_args()

    def run(tree: Path) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="dasflow-accuracy-bench-") as tmp:
            return side_by_side.child(CHILD, str(tree), tmp, str(args.persons), str(args.seed))

    result = side_by_side.compare("accuracy_report", args.other, args.repeat, run)
    runs = result["runs"]
    result |= {"persons": args.persons, "seed": args.seed,
               "identical": len({r["digest"] for rs in runs.values() for r in rs}) == 1,
               "resume_cpu": {label: min(r["resume_cpu"] for r in rs) for label, rs in runs.items()}}
    for r in (r for rs in runs.values() for r in rs):
        r.pop("digest")
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
