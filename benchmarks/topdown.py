"""TopDown end to end on a synthetic state (dasflow.synth): spine optimisation, measurement and estimation per
level, peak RSS, and a scipy relaxed-QP baseline on a subset of the same parents in the same run.

    .venv/bin/python benchmarks/topdown.py --persons 5000000 --state 01 --seed 7 [--json out.json]

Invariants as the 2020 DAS held them: the total and the state population (``invariants.json``), and the
structural zeros of the public block facts (housing units and GQ facilities per major type per block).

The baseline solves the *same* continuous per-family problem (WLS over the family's active variables with
x ≥ 0 and Σ_c x_c = t per cell) with scipy.optimize.minimize(method="SLSQP"), then our exact integer allocation,
on the first ``--baseline-parents`` multi-child families of the chosen level with at most
``--baseline-max-vars`` variables (SLSQP is dense, O(n³) per iteration); our solver runs on exactly those
families too (estimate_families on the subset), and the ratio and objective gap are reported.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import sys
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasflow import synth
from dasflow.privacy import rng
from dasflow.products.topdown.batch import _Ops, estimate_families
from dasflow.products.topdown.model import EstimatorOptions, GroupAnswers, Histogram
from dasflow.products.topdown.product import TopDown, TopDownConfig, l1_report
from dasflow.products.topdown.solvers import allocate_integer
from dasflow.products.topdown.spine import preset
from dasflow.products.topdown.strategy import PL94_GEOLEVEL_SHARES, make_strategy


def note(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg} (peak RSS {peak_rss_mb():.0f} MB)", file=sys.stderr, flush=True)


class Clock:
    """Wall and CPU (process) time of a phase: the machine is shared, so CPU time is the robust figure."""

    def __init__(self) -> None:
        self.w = time.perf_counter()
        self.c = time.process_time()

    def read(self) -> dict[str, float]:
        return {"wall_s": time.perf_counter() - self.w, "cpu_s": time.process_time() - self.c}


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def build_inputs(state: str, persons: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Block geography (with GQ-type presence, an invariant from the unit file), person records and the public
    block facts (housing units and GQ facilities per major type per block, counted from the unit file exactly
    as ``invariants.build_block_facts`` does, by bincount per chunk)."""
    ctx = synth.state_context(state, persons, seed)
    geo = ctx.geo
    county = geo.county_fips[geo.tract_county][geo.block_tract].astype(np.int64)
    tract = geo.tract_code[geo.block_tract].astype(np.int64)
    geoid = pd.Series([state] * geo.n_blocks) + pd.Series(county).map("{:03d}".format) + \
        pd.Series(tract).map("{:06d}".format) + pd.Series(geo.block_code.astype(np.int64)).map("{:04d}".format)
    gq_bits = np.zeros((geo.n_blocks, 7), dtype=np.int8)
    unit_counts = np.zeros(geo.n_blocks * 8, dtype=np.int64)
    parts = []
    for _, chunk in synth.iter_state_chunks(state, persons, seed):
        ub = chunk.unit_block.astype(np.int64)
        hh = chunk.unit_hhgq.astype(np.int64)
        unit_counts += np.bincount(ub * 8 + hh, minlength=unit_counts.size)
        gq = hh > 0
        gq_bits[ub[gq], hh[gq] - 1] = 1
        pu = chunk.person_unit
        parts.append(pd.DataFrame({
            "BLOCK": ub[pu], "HHGQ": hh[pu].astype(np.int8),
            "VOTINGAGE": (chunk.qage >= 18).astype(np.int8),
            "HISPANIC": (chunk.cenhisp - 1).astype(np.int8), "CENRACE": (chunk.cenrace - 1).astype(np.int8),
        }))
    people = pd.concat(parts, ignore_index=True)
    gq_str = pd.Series(["".join(map(str, r)) for r in gq_bits.tolist()])
    blocks = pd.DataFrame({
        "GEOID": geoid.to_numpy(),
        "AIANNHCE": pd.Series(geo.block_aiannh.astype(np.int64)).map("{:04d}".format).to_numpy(),
        "PLACEFP": pd.Series(geo.block_place.astype(np.int64)).map("{:05d}".format).to_numpy(),
        "COUSUBFP": pd.Series(geo.block_cousub.astype(np.int64)).map("{:05d}".format).to_numpy(),
        "GQ_TYPES": gq_str.to_numpy(),
    })
    people.insert(0, "GEOID", blocks["GEOID"].to_numpy()[people.pop("BLOCK").to_numpy()])
    counts = unit_counts.reshape(geo.n_blocks, 8)
    facts = pd.DataFrame({"GEOID": blocks["GEOID"].to_numpy(), "HU": counts[:, 0],
                          **{f"GQ{t}": counts[:, t] for t in range(1, 8)}})
    return blocks, people, facts


def baseline(td: TopDown, sp: Any, ms: dict[str, Any], est: dict[str, pd.DataFrame], level: str,
             n_parents: int, max_vars: int, cons: Any = None) -> dict[str, Any]:
    """scipy SLSQP relaxed QP + exact allocation vs our solver, on the same families (structural zeros are
    excluded from the variables of both)."""
    from scipy.optimize import minimize

    st = td.config.strategy
    l = sp.levels.index(level)
    ph = est[f"internal/{sp.levels[l - 1]}"]
    parent_hist = Histogram(ph["UNIT"].to_numpy(), ph["CELL"].to_numpy(), ph["COUNT"].to_numpy())
    groups = []
    for g in st.per_level[l].groups:
        t = ms[f"topdown/{level}/{g.name}"].table
        groups.append(GroupAnswers(g.name, g.row_index(st.schema), g.n_rows(st.schema), t["UNIT"].to_numpy(),
                                   np.stack(t["NOISY"].to_list()),
                                   np.array([float(v) for v in t["VARIANCE"]]),
                                   set(g.keep) == set(st.schema.names)))
    fan = sp.fanout(l - 1)
    cand = np.flatnonzero(fan > 1)
    cand = cand[np.isin(cand, parent_hist.unit)]
    size = np.bincount(parent_hist.unit, minlength=fan.size)[cand] * fan[cand]
    cand = cand[size <= max_vars][:n_parents]   # SLSQP is dense O(n³): cap the family size
    c0 = time.process_time()
    ours = estimate_families(sp, l, cand, parent_hist, groups, constraints=cons)
    t_ours = time.process_time() - c0
    t_base = 0.0
    gaps = []
    fails = 0
    for p in cand:
        kids = np.flatnonzero(sp.parent[l] == p)
        sel = parent_hist.unit == p
        cells, tvals = parent_hist.cell[sel], parent_hist.count[sel]
        C, K = kids.size, cells.size
        var_child = np.repeat(kids, K)
        var_cell = np.tile(cells, C)
        ok = (cons.allowed_cells(l, var_child, var_cell) if cons is not None
              else np.ones(var_child.size, dtype=bool))
        var_child, var_cell = var_child[ok], var_cell[ok]
        row_of = np.tile(np.arange(K), C)[ok]
        nv = int(ok.sum())
        weights = [1.0 / g.variance[g.position(var_child)] for g in groups]
        ops = _Ops(var_child, var_cell, groups, weights)
        A_eq = np.zeros((K, nv))
        A_eq[row_of, np.arange(nv)] = 1.0
        n_ok = np.bincount(row_of, minlength=K)
        x0 = (tvals[row_of] / np.maximum(n_ok[row_of], 1)).astype(float)
        c1 = time.process_time()
        res = minimize(lambda v, o=ops: 0.5 * o.objective(v), x0, jac=ops.grad, method="SLSQP",
                       bounds=[(0, None)] * nv,
                       constraints=[{"type": "eq", "fun": lambda v, a=A_eq, tv=tvals: a @ v - tv,
                                     "jac": lambda v, a=A_eq: a}],
                       options={"maxiter": 500, "ftol": 1e-9})
        full = np.zeros(C * K)
        full[ok] = res.x
        sw = np.ones(C * K)
        sw[ok] = np.sum(weights, axis=0)
        X = allocate_integer(full.reshape(C, K).T, sw.reshape(C, K).T, tvals.astype(np.int64),
                             ok.reshape(C, K).T)
        t_base += time.process_time() - c1
        if not res.success:
            fails += 1
        mine = np.zeros((C, K))
        m = np.isin(ours.hist.unit, kids)
        ci = np.searchsorted(kids, ours.hist.unit[m])
        ki = np.searchsorted(cells, ours.hist.cell[m])
        mine[ci, ki] = ours.hist.count[m]
        obj_base = ops.objective(X.T.ravel()[ok].astype(float))
        obj_ours = ops.objective(mine.ravel()[ok])
        gaps.append((obj_ours - obj_base) / max(abs(obj_base), 1e-9))
    return {"level": level, "parents": int(cand.size), "max_vars": max_vars,
            "vars_total": int((np.bincount(parent_hist.unit, minlength=fan.size)[cand] * fan[cand]).sum()),
            "ours_cpu_s": t_ours, "scipy_slsqp_cpu_s": t_base,
            "speedup": t_base / max(t_ours, 1e-9), "baseline_failures": fails,
            "median_rel_objective_gap_ours_minus_base": float(np.median(gaps)) if gaps else None,
            "max_rel_objective_gap": float(np.max(gaps)) if gaps else None}


def national_state_family(seed: int, rho: Fraction, states: int = 52, persons: int = 330_000_000,
                          zero_states: int = 5) -> dict[str, Any]:
    """The US root's family at national scale on synthetic answers: ``states`` states, each split into an AIAN
    and a non-AIAN unit (2·states children), PL94 schema (2,016 cells) and default query groups with the PL94
    state share β; the parent is the true national histogram, each state's total is held (coupled projection
    + controlled rounding) and ``zero_states`` states have no GQ of types 5–7 (structural zeros). Times
    ``estimate_families`` on that one family."""
    from dasflow.privacy import samplers
    from dasflow.products.topdown.model import Constraints
    from dasflow.products.topdown.spine import Spine
    from dasflow.products.topdown.strategy import Schema

    gen = np.random.default_rng(seed)   # synthetic truth only; the noise comes from the exact samplers
    schema = Schema()
    n_cells = schema.n_cells
    C = 2 * states
    share = gen.dirichlet(np.full(states, 2.0))
    unit_share = np.repeat(share, 2) * np.tile([0.02, 0.98], states)
    cell_p = gen.dirichlet(np.full(n_cells, 0.5))   # dense: nearly every national cell is non-zero
    code = np.unravel_index(np.arange(n_cells), schema.shape)[0]
    allowed = np.full(C, 0xFF, dtype=np.int64)
    allowed[: 2 * zero_states] = 0xFF & ~(0b111 << 5)
    ok = ((allowed[:, None] >> code[None, :]) & 1).astype(bool)
    p = unit_share[:, None] * cell_p[None, :] * ok
    truth = gen.multinomial(persons, (p / p.sum()).ravel()).reshape(C, n_cells).astype(np.int64)
    beta = list(PL94_GEOLEVEL_SHARES)
    levels = ("US", "state")
    st = make_strategy(preset("pl94_persons", beta, 12).levels, beta, rho)
    par = [np.array([-1], dtype=np.int64), np.zeros(C, dtype=np.int64)]
    sp = Spine(levels=levels, parent=par, gamma_num=[np.array([1]), np.ones(C, dtype=np.int64)], denominator=1,
               labels=[np.array(["US"], dtype=object), np.array([f"S{i}" for i in range(C)], dtype=object)],
               block_geoid=np.array([f"{i:02d}" + "0" * 13 for i in range(C)], dtype=object),
               block_source_row=np.arange(C, dtype=np.int64), beta=(Fraction(0), Fraction(1)),
               privacy_rule="zcdp")
    g = rng.seeded(seed)
    groups = []
    for q in st.per_level[1].groups:
        rows = q.row_index(schema)
        R = q.n_rows(schema)
        true = np.zeros((C, R), dtype=np.int64)
        np.add.at(true, (np.repeat(np.arange(C), n_cells), np.tile(rows, C)), truth.ravel())
        s2 = 1 / (rho * beta[1] * q.alpha)
        noisy = true + np.asarray(samplers.discrete_gaussian(s2, C * R, g), dtype=np.int64).reshape(C, R)
        groups.append(GroupAnswers(q.name, rows, R, np.arange(C, dtype=np.int64), noisy, np.full(C, float(s2)),
                                   set(q.keep) == set(schema.names)))
    parent = Histogram.from_dense(np.zeros(1, dtype=np.int64), truth.sum(axis=0)[None, :])
    totals = truth.reshape(states, 2, n_cells).sum(axis=(1, 2))
    cons = Constraints(state_level=1, state_of_unit=np.arange(C, dtype=np.int64) // 2,
                       state_labels=tuple(f"{i:02d}" for i in range(states)), state_totals=totals,
                       cell_code=code.astype(np.int64), allowed=(np.array([0xFF]), allowed))
    ck = Clock()
    res = estimate_families(sp, 1, np.array([0]), parent, groups, EstimatorOptions(), constraints=cons)
    t = ck.read()
    h = res.hist
    got = np.bincount(h.unit // 2, weights=h.count, minlength=states).astype(np.int64)
    dense = h.dense(C, n_cells)
    return {"states": states, "children": C, "parent_cells": int(parent.cell.size),
            "variables": int(ok[:, parent.cell].sum()), "persons": persons, "rho": str(rho), **t,
            "status": res.status, "fista_iterations": res.iterations,
            "state_totals_exact": bool(np.array_equal(got, totals)),
            "children_sum_to_parent": bool(np.array_equal(dense.sum(axis=0), truth.sum(axis=0))),
            "structural_zero_violations": int(dense[~ok].sum()),
            "l1_vs_truth": int(np.abs(dense - truth).sum()), "peak_rss_mb": peak_rss_mb()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--persons", type=int, default=5_000_000)
    ap.add_argument("--state", default="01")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--rho", default="63/25")
    ap.add_argument("--baseline-parents", type=int, default=40)
    ap.add_argument("--baseline-level", default="block")
    ap.add_argument("--baseline-max-vars", type=int, default=400)
    ap.add_argument("--json")
    ap.add_argument("--national-state-family", action="store_true",
                    help="only time the US root's family (52 states × AIAN split, coupled state totals)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s", stream=sys.stderr)
    if args.national_state_family:
        res = national_state_family(args.seed, Fraction(args.rho))
        text = json.dumps(res, indent=1, default=str)
        print(text)
        if args.json:
            Path(args.json).write_text(text)
        return 0
    out: dict[str, Any] = {"persons": args.persons, "state": args.state, "seed": args.seed, "rho": args.rho,
                           "cpu_count": psutil.cpu_count(), "date": time.strftime("%Y-%m-%d %H:%M UTC",
                                                                                     time.gmtime())}
    ck = Clock()
    blocks, persons, facts = build_inputs(args.state, args.persons, args.seed)
    out["synth"] = ck.read()
    note("synth " + str(out["synth"]))
    out["blocks"] = len(blocks)
    beta = list(PL94_GEOLEVEL_SHARES)
    sc = preset("pl94_persons", beta, 12)
    st = make_strategy(sc.levels, beta, Fraction(args.rho))
    td = TopDown(TopDownConfig(spine=sc, strategy=st, options=EstimatorOptions()))
    all_ck = Clock()
    ck = Clock()
    sp = td.spine({"blocks": blocks})
    out["spine"] = ck.read()
    note("spine " + str(out["spine"]))
    out["spine_levels"] = sp.diagnostics["levels"]
    osed = sp.diagnostics["osed"]
    out["osed_max_before_after"] = [int(osed["OSED_BEFORE"].max()), int(osed["OSED_AFTER"].max())]
    out["osed_mean_before_after"] = [float(osed["OSED_BEFORE"].mean()), float(osed["OSED_AFTER"].mean())]
    pub = {"spine": sp, "block_facts": facts,
           "invariants": {"total": len(persons), "state": {args.state: len(persons)}}}
    ck = Clock()
    cons = td.constraints(pub)
    out["constraints"] = ck.read()
    out["structural_zero_blocks"] = {"no_housing_units": int((facts["HU"] == 0).sum()),
                                     "no_units_at_all": int((facts.iloc[:, 1:].sum(axis=1) == 0).sum())}
    ck = Clock()
    specs = td.plan(td.config, pub)
    out["plan"] = ck.read()
    ck = Clock()
    prep = td.prepare({"persons": persons}, pub)
    out["prepare"] = ck.read()
    note("prepare " + str(out["prepare"]))
    del persons
    g = rng.seeded(args.seed)
    ms = {}
    per_level_measure: dict[str, float] = {}
    per_level_measure_wall: dict[str, float] = {}
    for s in specs:
        ck = Clock()
        ms[s.key] = td.measure(prep, s, g)
        r = ck.read()
        per_level_measure[s.level] = per_level_measure.get(s.level, 0.0) + r["cpu_s"]
        per_level_measure_wall[s.level] = per_level_measure_wall.get(s.level, 0.0) + r["wall_s"]
    out["measure_cpu_s_per_level"] = per_level_measure
    out["measure_wall_s_per_level"] = per_level_measure_wall
    note("measure " + str(per_level_measure))
    out["noisy_answers"] = int(sum(s.cells for s in specs))
    ck = Clock()
    est = td.postprocess(ms, pub)
    out["estimate"] = ck.read()
    note("estimate " + str(out["estimate"]))
    ck = Clock()
    tables = td.tables(est)
    out["tables"] = ck.read()
    note("tables " + str(out["tables"]))
    out["end_to_end"] = all_ck.read()
    diag = est["diagnostics"]
    out["estimate_per_level"] = diag.to_dict(orient="records")
    out["l1_per_level_test_mode"] = l1_report(est, prep, sp.levels)
    out["table_rows"] = {k: len(v) for k, v in tables.items()}
    out["peak_rss_mb_before_baseline"] = peak_rss_mb()
    out["invariant_violations_per_level"] = dict(zip(diag["level"], diag["invariant_violations"].astype(int),
                                                      strict=True))
    out["baseline"] = baseline(td, sp, ms, est, args.baseline_level, args.baseline_parents,
                               args.baseline_max_vars, cons)
    note("baseline " + str(out["baseline"]))
    # full-US extrapolation from per-unit costs (serial, one core): scale each level by US/state units
    us_blocks = 8_132_968
    scale = us_blocks / len(blocks)
    per_level_cost = {r["level"]: r["cpu_seconds"] for r in out["estimate_per_level"]}
    meas_scaled = sum(per_level_measure.values()) * scale
    est_scaled = sum(v * (1 if k == "US" else scale) for k, v in per_level_cost.items())
    sp_s = out["spine"]["cpu_s"] * scale
    rest = (out["prepare"]["cpu_s"] + out["tables"]["cpu_s"]) * scale
    out["us_extrapolation_serial_cpu_s"] = {"spine": sp_s, "measure": meas_scaled, "estimate": est_scaled,
                                            "prepare_tables": rest,
                                            "total": sp_s + meas_scaled + est_scaled + rest}
    out["peak_rss_mb"] = peak_rss_mb()
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
