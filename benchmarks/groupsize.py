"""Runtime benchmark of the group-size post-processors (Census-like k = 1,000, |R| = 3,197; spec C1, C2).

Every (method, ε, window, k) run is a fresh subprocess (timeout, address-space cap, own peak RSS, own CPU
seconds, the 1-minute load average at its start), all in one invocation, so the figures are side by side on the
same machine:

    .venv/bin/python benchmarks/groupsize.py --out benchmarks/results/groupsize.md

Sections: (A) full-scale runtime of every method -- M_DP, M_DPC, M_DPC*, M_DPC*-R, TopDown and the relaxed-QP
baseline M_H-R (Clarabel interior point, KKT certificate) -- at ε in {1, 0.5, 0.1} with the paper's window
m = 1 x Var, plus noise-scale windows (m = 4 sd and 10 sd, still exact through widening) for M_DP and M_DPC;
(B) the cumulative relaxed QP M_HC-R, whose sparse factorisation fill grows superlinearly in k, on growing
subsets k in {10, 30, 100} (full |R| and n) beside M_DPC, M_DP and M_H-R, with a power-law extrapolation to
k = 1,000; (C) scaling of one bottom-up pass with the window size d (Algorithm 1, expected ~ d log d) and of
the chain table DP (expected ~ d).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

L = 3


def _data(k: int, n: int, seed: int) -> Any:
    from dasflow.products.groupsize.synthetic import census_like

    return census_like(seed, n=n, k=k)


def _noisy(data: Any, query: str, eps: Fraction, seed: int) -> tuple[list[np.ndarray], list[float]]:
    from dasflow.privacy import accounting, samplers
    from dasflow.privacy import rng as prng
    from dasflow.products.groupsize.mechanisms import query_sensitivity, true_query

    g = prng.seeded(seed).spawn(f"{query}/{eps}")
    noisy, var = [], []
    for l, c in enumerate(data.counts):
        sens = query_sensitivity(query, data.shape.sizes[l], "l1")  # type: ignore[arg-type]
        scale = accounting.geometric_scale(eps / L, sens)
        t = true_query(c, query)  # type: ignore[arg-type]
        noisy.append(t + samplers.two_sided_geometric(scale, t.shape, g.spawn(str(l))))
        a = math.exp(-1.0 / float(scale))
        var.append(2 * a / (1 - a) ** 2)
    return noisy, var


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measured run (inside the subprocess)."""
    from dasflow.products.groupsize.mechanisms import MECHANISM_QUERY, postprocess
    from dasflow.products.groupsize.metrics import validity

    data = _data(spec["k"], spec["n"], spec["seed"])
    eps = Fraction(spec["eps"])
    mech = spec["method"]
    noisy, var = _noisy(data, MECHANISM_QUERY[mech], eps, spec["seed"])
    mult = spec["multiplier"]
    if isinstance(mult, str) and mult.endswith("sd"):  # noise-scale window: m = c standard deviations
        mult = float(mult[:-2]) / math.sqrt(var[-1])
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    res = postprocess(mech, data.shape, noisy, data.n, var, window_multiplier=float(mult),
                      qp_time_limit=spec.get("qp_limit"), qp_solver=spec.get("qp_solver", "clarabel"))
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    v = validity(data.shape, res.levels, data.n)
    return {"seconds": res.seconds, "cpu": cpu, "note": res.note, "valid": v.ok, "cv": v.violations,
            "rss_before_mb": rss0 / 1024, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "window_multiplier": float(mult), "radius_leaf": math.ceil(float(mult) * var[-1])}


def run(spec: dict[str, Any], timeout: float, mem_gb: float) -> dict[str, Any]:
    def limit() -> None:
        cap = int(mem_gb * 1024**3)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    t0 = time.perf_counter()
    spec = {**spec, "load": os.getloadavg()[0]}
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True,
                           text=True, timeout=timeout, preexec_fn=limit, check=False)
    except subprocess.TimeoutExpired:
        return {**spec, "status": f"timeout > {timeout:.0f} s", "wall": time.perf_counter() - t0}
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["?"])[-1][:160]
        return {**spec, "status": f"failed (rc {p.returncode}: {tail})", "wall": time.perf_counter() - t0}
    out = json.loads(p.stdout.strip().splitlines()[-1])
    return {**spec, **out, "status": "ok", "wall": time.perf_counter() - t0}


def scaling() -> list[str]:
    """C1: one bottom-up pass (Algorithm 1) vs window size d; chain table DP vs d."""
    from dasflow.postprocess.chain_dp import build_chain, solve_chain_tables
    from dasflow.postprocess.tree_dp import LevelCost, column_root_tables

    data = _data(20, 117_630, 3)
    rng = np.random.default_rng(0)
    noisy = [c + rng.integers(-3, 4, size=c.shape) for c in data.counts]
    lines = ["| Algorithm 1 bottom-up, 3,197 regions x 20 columns: leaf radius m | d = 2m+1 | seconds | "
             "s / (d log2 d) x 1e3 |", "|---|---|---|---|"]
    for m in (50, 100, 200, 400):
        costs = [LevelCost(x, m) for x in noisy]
        t0 = time.perf_counter()
        column_root_tables(data.shape, costs, np.arange(20))
        s = time.perf_counter() - t0
        d = 2 * m + 1
        lines.append(f"| {m} | {d} | {s:.3f} | {1e3 * s / (d * math.log2(d)):.4f} |")
    from dasflow.postprocess.tree_dp import TreeShape

    shape = TreeShape((np.zeros(4, dtype=np.int64), np.repeat(np.arange(4), 4).astype(np.int64)))
    chain = build_chain(shape, 6)
    tg = np.cumsum(rng.integers(0, 50, size=chain.level.size))
    lines += ["", "| chain table DP (N = 127 nodes): radius m | seconds | s / d x 1e6 |", "|---|---|---|"]
    for m in (250, 500, 1000, 2000):
        t0 = time.perf_counter()
        solve_chain_tables(chain, tg, int(tg[-1]) + 100, m)
        s = time.perf_counter() - t0
        lines.append(f"| {m} | {s:.3f} | {1e6 * s / (2 * m + 1):.2f} |")
    return lines


def extrapolate(rows: list[dict[str, Any]]) -> list[str]:
    """CPU seconds and peak RSS of M_HC-R at k = 1,000 from t(k) = t(100) (k / 100)^alpha, alpha fitted on
    k = 30 -> 100 (per ε); M_DPC's full-scale CPU seconds beside it for the ratio."""
    out = ["| ε | CPU s k=30 | CPU s k=100 | alpha (CPU) | extrapolated CPU s k=1000 | RSS MB k=100 | beta (RSS) | "
           "extrapolated RSS GB k=1000 | M_DPC CPU s k=1000 | ratio |", "|---|---|---|---|---|---|---|---|---|---|"]
    for eps in ("1", "1/2", "1/10"):
        got = {r["k"]: r for r in rows if r["method"] == "M_HC-R" and r["eps"] == eps and "cpu" in r}
        dpc = [r for r in rows if r["method"] == "M_DPC" and r["eps"] == eps and r["k"] == 1000 and "cpu" in r
               and r["multiplier"] == 1.0]
        if 30 not in got or 100 not in got:
            out.append(f"| {Fraction(eps)} | missing runs | | | | | | | | |")
            continue
        a, b = got[30], got[100]
        alpha = math.log(b["cpu"] / a["cpu"]) / math.log(100 / 30)
        beta = math.log(b["peak_rss_mb"] / a["peak_rss_mb"]) / math.log(100 / 30)
        t1000 = b["cpu"] * 10**alpha
        m1000 = b["peak_rss_mb"] * 10**beta / 1024
        d = dpc[0]["cpu"] if dpc else float("nan")
        out.append(f"| {Fraction(eps)} | {a['cpu']:.1f} | {b['cpu']:.1f} | {alpha:.2f} | {t1000:,.0f} | "
                   f"{b['peak_rss_mb']:.0f} | {beta:.2f} | {m1000:.1f} | {d:.2f} | {t1000 / d:,.0f}x |")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--child")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/groupsize.md"))
    ap.add_argument("--n", type=int, default=117_630_445)
    ap.add_argument("--timeout", type=float, default=420.0)
    ap.add_argument("--mem-gb", type=float, default=3.5)
    ap.add_argument("--qp-limit", type=float, default=600.0, help="Clarabel time limit per QP solve (s)")
    ap.add_argument("--qp-mem-gb", type=float, default=4.5,
                    help="address-space cap of a QP run (virtual; its peak RSS is reported and must stay < 4 GB)")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    started = time.ctime()
    rows: list[dict[str, Any]] = []

    def go(spec: dict[str, Any], timeout: float, mem: float) -> None:
        rows.append(run(spec, timeout, mem))
        print(rows[-1], flush=True)

    qp_timeout = args.qp_limit + 180
    base = {"k": 1000, "n": args.n, "seed": args.seed}
    for eps in ("1", "1/2", "1/10"):
        for m in ("M_DP", "M_DPC", "M_DPC*", "M_DPC*-R", "TopDown"):
            go({**base, "method": m, "eps": eps, "multiplier": 1.0}, args.timeout, args.mem_gb)
        for m in ("M_DP", "M_DPC"):
            for w in ("4sd", "10sd"):
                go({**base, "method": m, "eps": eps, "multiplier": w}, args.timeout, args.mem_gb)
        go({**base, "method": "M_H-R", "eps": eps, "multiplier": 1.0, "qp_limit": args.qp_limit}, qp_timeout,
           args.qp_mem_gb)
    for eps in ("1", "1/2", "1/10"):
        for k in (10, 30, 100):
            for m in ("M_DP", "M_H-R", "M_DPC", "M_HC-R") if k != 30 else ("M_DPC", "M_HC-R"):
                go({"k": k, "n": args.n, "seed": args.seed, "method": m, "eps": eps, "multiplier": 1.0,
                    "qp_limit": args.qp_limit}, qp_timeout, args.qp_mem_gb)
    scal = scaling()
    lines = [
        "# Group-size post-processing benchmark", "",
        f"Machine: {platform.platform()}, 2 cores / 24 GB shared with other engineers' jobs (timings noisy); "
        f"started {started}, finished {time.ctime()}.",
        f"Command: `.venv/bin/python benchmarks/groupsize.py` (timeout {args.timeout:.0f} s and address-space cap "
        f"{args.mem_gb} GB per DP run; QP runs: Clarabel time limit {args.qp_limit:.0f} s, cap {args.qp_mem_gb} GB "
        f"virtual). Data: Census-like generator, seed {args.seed}, n = {args.n:,} groups, 1 + 52 + 3,144 = 3,197 "
        "regions; noise: exact two-sided geometric, ε/3 per level. Runtime = post-processing only: wall seconds "
        "and CPU seconds (user + sys of the run's process); load = 1-minute load average when the run started.",
        "",
        "| k | ε | method | window multiplier (leaf radius) | status | post-proc. wall s | CPU s | peak RSS MB | "
        "load | valid | #CV | solver |", "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sec = f"{r['seconds']:.2f}" if "seconds" in r else "—"
        cpu = f"{r['cpu']:.2f}" if "cpu" in r else "—"
        mem = f"{r['peak_rss_mb']:.0f}" if "peak_rss_mb" in r else "—"
        wm = f"{r.get('window_multiplier', r['multiplier'])}"
        if "radius_leaf" in r:
            wm = f"{float(wm):.3g} ({r['radius_leaf']})"
        lines.append(f"| {r['k']} | {Fraction(r['eps'])} | {r['method']} | {wm} | {r['status']} | {sec} | {cpu} | "
                     f"{mem} | {r['load']:.1f} | {r.get('valid', '—')} | {r.get('cv', '—')} | {r.get('note', '')} |")
    lines += ["", "## M_HC-R extrapolation to k = 1,000 (power law through the k = 30 and k = 100 runs)", "",
              *extrapolate(rows)]
    lines += ["", "## Scaling with the domain size d (C1)", "", *scal, ""]
    Path(args.out).write_text("\n".join(lines) + "\n")
    Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
