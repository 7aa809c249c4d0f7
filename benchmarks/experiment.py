"""Benchmark of the accuracy experiment: 20 seeded runs of the demo-sized census (every demo product).

The demo's synthetic census (``dasflow.demo.prepare_demo``: 20,000 persons, every US state; PHSafe, SafeTab-P
and group sizes with the demo configs) is generated into a scratch store, then ``run_experiment`` runs each
product ``--runs`` times per budget scale. Reported: wall time and CPU time of the whole experiment, the
one-time confidential part (prepare + ground truth) and the per-run cost per product, peak RSS, and the
pooled RMSE of the published tables per product and scale (a sanity figure, not a target).

Run: ``.venv/bin/python benchmarks/experiment.py [--persons 20000] [--runs 20] [--budget-scale 1]``; writes
``benchmarks/results/experiment.md`` (and the experiment's own files under ``--out``).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasflow.demo import prepare_demo
from dasflow.experiment import run_experiment
from dasflow.experiment.metrics import ALL_BIN
from dasflow.experiment.record import write_outputs
from dasflow.experiment.report import pooled
from dasflow.experiment.scaling import parse_scales

RESULTS = Path(__file__).resolve().parent / "results" / "experiment.md"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--persons", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--budget-scale", default="1")
    ap.add_argument("--seed", type=int, default=2020)
    ap.add_argument("--out", default=None, help="experiment output directory (default: a temporary one)")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="dasflow-bench-experiment-"))
    t0 = time.perf_counter()
    config = prepare_demo(scratch / "store", args.persons, seed=args.seed)
    synth = time.perf_counter() - t0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    exp = run_experiment(config, runs=args.runs, scales=parse_scales(args.budget_scale), seed=args.seed)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    out = Path(args.out) if args.out else scratch / "out"
    write_outputs(exp, out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2
    load = os.getloadavg()
    lines = [
        "# Accuracy experiment (`benchmarks/experiment.py`)", "",
        f"`.venv/bin/python benchmarks/experiment.py --persons {args.persons} --runs {args.runs} "
        f"--budget-scale {args.budget_scale}` — {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
        f"{load[0]:.1f} / {load[1]:.1f} (1 / 5 min).", "",
        f"- synthetic census ({args.persons:,} persons, demo layout): {synth:.1f} s (not part of the experiment)",
        f"- experiment: **{wall:.1f} s wall**, {cpu:.1f} CPU-s, peak RSS {peak:.2f} GB, "
        f"{len(exp.metrics)} metric rows", "",
        "| step | seconds |", "|---|---|",
        *(f"| {k} | {v:.1f} |" for k, v in exp.meta["seconds"].items()), "",
        "Pooled RMSE of the published tables (all cells, all tables of the product) per geolevel:", "",
        "| product | geolevel | budget scale | RMSE |", "|---|---|---|---|",
    ]
    overall = pooled(exp.metrics[exp.metrics["pop_bin"] == ALL_BIN], ["product", "geolevel", "budget_scale"])
    lines += [f"| {r.product} | {r.geolevel} | {r.budget_scale:g} | {r.rmse:.2f} |"
              for r in overall.itertuples()]
    RESULTS.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"\nwritten: {RESULTS}; experiment files: {out}")


if __name__ == "__main__":
    main()
