"""Group-size experiment (spec hierarchical-groupsize.md §3; requirements E1, E2): Table 7-style grid.

For each dataset (seeded Census-like / Taxi-like generators, manifests recorded), each ε and each repetition,
one noisy draw per *query* (counts, per-region cumulative, chain vector with the corrected |R_l| calibration, and
the chain vector with the paper's Δ = 1 calibration, which is NOT differentially private and is reported only to
show what the paper's accuracy would rest on) is post-processed by every method sharing that query. Per level we
record the L1 error (mean over regions of sum_j |hat - true|), #CV and the post-processing runtime.

    .venv/bin/python benchmarks/groupsize_experiment.py --reps 10 --out docs/groupsize.md

Writes the markdown report (with the claims check), PNG plots next to it and a JSON of all raw figures.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dasflow.privacy import accounting, samplers  # noqa: E402
from dasflow.privacy import rng as prng  # noqa: E402
from dasflow.products.groupsize.mechanisms import postprocess, query_sensitivity, true_query  # noqa: E402
from dasflow.products.groupsize.metrics import consistency_violations, l1_error, validity  # noqa: E402
from dasflow.products.groupsize.synthetic import GroupSizeData, census_like, taxi_like  # noqa: E402

#: method -> (query, post-processing mechanism)
METHODS: dict[str, tuple[str, str]] = {
    "M_H-R": ("counts", "M_H-R"),
    "M_DP": ("counts", "M_DP"),
    "M_HC-R": ("cumulative", "M_HC-R"),
    "M_DPC": ("cumulative", "M_DPC"),
    "M_DPC*": ("chain", "M_DPC*"),
    "M_DPC*-R": ("cumulative", "M_DPC*-R"),
    "M_DPC* (paper Δ=1; not DP)": ("chain_paper", "M_DPC*"),
    "TopDown": ("counts", "TopDown"),
}
L = 3


def geometric_variance(scale: Fraction) -> float:
    a = math.exp(-1.0 / float(scale))
    return 2 * a / (1 - a) ** 2


def draw(data: GroupSizeData, query: str, eps: Fraction, g: Any) -> tuple[list[np.ndarray], list[float]]:
    """One noisy measurement per level for ``query`` at ε/L per level (two-sided geometric, exact sampler)."""
    noisy, var = [], []
    for l, c in enumerate(data.counts):
        q = "chain" if query == "chain_paper" else query
        sens = 1 if query == "chain_paper" else query_sensitivity(q, data.shape.sizes[l], "l1")  # type: ignore[arg-type]
        scale = accounting.geometric_scale(eps / L, sens)
        t = true_query(c, q)  # type: ignore[arg-type]
        noisy.append(t + samplers.two_sided_geometric(scale, t.shape, g.spawn(f"level{l}")))
        var.append(geometric_variance(scale))
    return noisy, var


def run_method(method: str, data: GroupSizeData, noisy: list[np.ndarray], var: list[float],
               multiplier: float, qp_limit: float) -> dict[str, Any]:
    _, mech = METHODS[method]
    res = postprocess(mech, data.shape, noisy, data.n, var, window_multiplier=multiplier, qp_time_limit=qp_limit)
    v = validity(data.shape, res.levels, data.n)
    return {
        "l1": l1_error(res.levels, data.counts),
        "cv": consistency_violations(data.shape, res.levels),
        "seconds": res.seconds,
        "valid": v.ok,
        "faithful": v.faithful,
        "note": res.note,
    }


def make_dataset(name: str, seed: int, args: argparse.Namespace) -> GroupSizeData:
    if name == "census":
        return census_like(seed, n=args.census_n, k=args.census_k)
    return taxi_like(seed, taxis=args.taxis, k=args.taxi_k, mean_pickups=args.taxi_mean)


def replace_methods(args: argparse.Namespace) -> int:
    """Re-run the selected methods on the stored grid's datasets/ε/reps and swap their runs into --json."""
    old = json.loads(Path(args.json).read_text())
    methods = [m for m in args.methods.split(",") if m]
    tmp = Path(args.json).with_suffix(".partial.json")
    sub = ["--json", str(tmp), "--methods", ",".join(methods), "--reps", str(args.reps), "--eps", args.eps,
           "--datasets", args.datasets, "--qp-reps", str(args.qp_reps), "--qp-time-limit", str(args.qp_time_limit)]
    for key in ("seed", "census_n", "census_k", "taxis", "taxi_k", "taxi_mean", "window_multiplier"):
        if old["args"][key] != getattr(args, key):
            raise SystemExit(f"--replace needs the stored grid's {key} ({old['args'][key]})")
    main([*sub, "--seed", str(args.seed)])
    new = json.loads(tmp.read_text())
    for ds, entry in new["datasets"].items():
        kept = [r for r in old["datasets"][ds]["runs"] if r["method"] not in methods]
        old["datasets"][ds]["runs"] = kept + entry["runs"]
    old.setdefault("replaced", []).append({"methods": methods, "args": new["args"], "machine": new["machine"],
                                           "started": new["started"], "finished": new["finished"]})
    Path(args.json).write_text(json.dumps(old, indent=1))
    tmp.unlink()
    return 0


def _repo_relative(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (as recorded in committed results)."""
    repo = Path(__file__).resolve().parents[1]
    try:
        return Path(path).resolve().relative_to(repo).as_posix()
    except ValueError:
        return Path(path).name


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--eps", default="0.1,0.5,1")
    ap.add_argument("--datasets", default="census,taxi")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seed", type=int, default=20260101)
    ap.add_argument("--census-n", type=int, default=117_630)
    ap.add_argument("--census-k", type=int, default=10)
    ap.add_argument("--taxis", type=int, default=13_282)
    ap.add_argument("--taxi-k", type=int, default=100)
    ap.add_argument("--taxi-mean", type=float, default=24_489_743 / 13_282 / 100)
    ap.add_argument("--window-multiplier", type=float, default=1.0)
    ap.add_argument("--qp-time-limit", type=float, default=20.0)
    ap.add_argument("--qp-reps", type=int, default=3, help="repetitions for the slow relaxed-QP baselines")
    ap.add_argument("--json", default=str(ROOT / "benchmarks/results/groupsize_experiment.json"))
    ap.add_argument("--replace", action="store_true",
                    help="re-run only --methods and replace their runs in the existing --json (same seeds, so the "
                         "same noise draws as the kept methods)")
    args = ap.parse_args(argv)
    if args.replace:
        return replace_methods(args)
    eps_list = [Fraction(e) for e in args.eps.split(",")]
    methods = [m for m in args.methods.split(",") if m]
    recorded = {**vars(args), "json": _repo_relative(args.json)}  # no path of this machine in the results
    results: dict[str, Any] = {"args": recorded, "machine": platform.platform(), "started": time.ctime(),
                               "datasets": {}}
    for ds in args.datasets.split(","):
        data = make_dataset(ds, args.seed, args)
        entry: dict[str, Any] = {"manifest": data.manifest, "runs": []}
        results["datasets"][ds] = entry
        for eps in eps_list:
            for rep in range(args.reps):
                base = prng.seeded(args.seed).spawn(f"{ds}/{eps}/{rep}")
                cache: dict[str, tuple[list[np.ndarray], list[float]]] = {}
                for method in methods:
                    if method in ("M_H-R", "M_HC-R") and rep >= args.qp_reps:
                        continue
                    query = METHODS[method][0]
                    if query not in cache:
                        cache[query] = draw(data, query, eps, base.spawn(query))
                    noisy, var = cache[query]
                    r = run_method(method, data, noisy, var, args.window_multiplier, args.qp_time_limit)
                    r.update({"eps": str(eps), "rep": rep, "method": method})
                    entry["runs"].append(r)
                    print(ds, eps, rep, method, f"{r['seconds']:.2f}s", [round(x, 1) for x in r["l1"]],
                          r["cv"], r["note"], flush=True)
                Path(args.json).write_text(json.dumps(results, indent=1))
    results["finished"] = time.ctime()
    Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
