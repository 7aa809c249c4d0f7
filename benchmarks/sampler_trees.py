"""The exact samplers of this tree against another checkout, side by side, at the noise scales a release draws.

    git worktree add --detach <worktree> <rev>
    .venv/bin/python benchmarks/sampler_trees.py --other <worktree> --repeat 3 \\
        --out benchmarks/results/sampler_trees_session23.json

Each run is a fresh interpreter (``side_by_side``) drawing, from the production CSPRNG, the 10 M-person national
benchmark's mix of discrete Gaussian noise (``--samples`` in all, in calls of ``--call`` samples as a measurement
segment asks for them): TopDown's block-level σ² = 4099/66 (80 % of its answers), its other levels' 8198/99 and
20495/2512, and SafeTab-P's two scales (σ² = 500/15.9 and 4500/15.9, as rationals), plus two-sided geometric
noise at scales 3 and 305 (``--mix release``); or TopDown's block-level scale alone (``--mix topdown-block``).
Reported: user and system CPU seconds of the draws (the tables are built before the clock starts), and a digest
of the same draws from a seeded generator, which must agree between the trees when a change is meant to keep
every sample.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

CHILD = r'''
import hashlib, json, resource, sys
from fractions import Fraction
tree, total, call, mix = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
sys.path.insert(0, tree)
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
from dasflow.privacy import rng, samplers
MIX = [("g", Fraction(4099, 66), 0.80), ("g", Fraction(8198, 99), 0.06), ("g", Fraction(20495, 2512), 0.04),
       ("g", Fraction(5000, 159), 0.03), ("g", Fraction(45000, 159), 0.03), ("l", Fraction(3), 0.02),
       ("l", Fraction(305), 0.02)] if mix == "release" else [("g", Fraction(4099, 66), 1.0)]
def draw(kind, p, n, g):
    return samplers.discrete_gaussian(p, n, g) if kind == "g" else samplers.two_sided_geometric(p, n, g)
for kind, p, _ in MIX:  # tables built before the clock starts
    draw(kind, p, 10, rng.seeded(0))
digest = hashlib.sha256()
for kind, p, _ in MIX:
    digest.update(draw(kind, p, 200_000, rng.seeded(7)).tobytes())
g = rng.csprng()
r0 = resource.getrusage(resource.RUSAGE_SELF)
for kind, p, share in MIX:
    left = int(total * share)
    while left > 0:
        n = min(call, left)
        draw(kind, p, n, g)
        left -= n
r1 = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"samples": total, "user": round(r1.ru_utime - r0.ru_utime, 2),
                  "sys": round(r1.ru_stime - r0.ru_stime, 2), "digest": digest.hexdigest()}))
'''


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--samples", type=int, default=100_000_000)
    ap.add_argument("--call", type=int, default=2_016 * 5_000, help="samples per sampler call")
    ap.add_argument("--mix", choices=("release", "topdown-block"), default="release")
    args = ap.parse_args()
    result = side_by_side.compare(
        "sampler_trees", args.other, args.repeat,
        lambda tree: side_by_side.child(CHILD, str(tree), str(args.samples), str(args.call), args.mix))
    runs = result["runs"]
    result |= {"samples": args.samples, "call": args.call, "mix": args.mix,
               "identical": len({r["digest"] for rs in runs.values() for r in rs}) == 1}
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
