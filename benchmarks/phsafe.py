"""PHSafe benchmark: dasflow vs Tumult Analytics 0.21 on the same synthetic census (results/phsafe.md).

For each size (default 1 M and 10 M persons, all 50 states + DC) it

1. generates the data once with ``dasflow.synth`` (PHSafe CSV writers) under ``.bench/phsafe/p<N>/phsafe``;
2. runs the FULL dasflow private PHSafe (read + phase 1–2 validation, plan, truncate_and_join for 6 join
   tables, 3 unit tables, exact discrete-Gaussian noise on all 10,608 cells, derivations, release files) in a
   child process, timing every stage and sampling the peak RSS;
3. runs dasflow on PH7 alone (τ = 10 truncated join, iterated by householder, counted by tenure; 6 levels);
4. runs the same PH7 tabulation with Tumult Analytics 0.21 (``join_private`` with ``DropExcess(10)`` /
   ``DropNonUnique``, ``RhoZCDPBudget`` per level, the production ρ) in its own virtualenv
   (:mod:`benchmarks.tumult_env`), timing Spark start, session build and the six queries.

Usage: ``.venv/bin/python benchmarks/phsafe.py [--persons 1000000 10000000] [--skip-tumult] [--repeat 5]``.
Noise comes from the seeded TEST generator (benchmarks only); timings are wall-clock on a shared machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

import tumult_env  # noqa: E402

BENCH = ROOT / ".bench" / "phsafe"
RESULTS = ROOT / "benchmarks" / "results" / "phsafe.md"
US_CONFIG = ROOT / "tests" / "phsafe" / "data" / "us_config.json"
PYTHON = ROOT / ".venv" / "bin" / "python"

PH7_BUDGETS = {"usa_*": "0.002619", "usa_A-G": "0.002619", "usa_H,I": "0.002619",
               "state_*": "0.016371", "state_A-G": "0.141622", "state_H,I": "0.016371"}

TUMULT_PH7 = r'''
import json, time
args = tumult_env_args()
t0 = time.perf_counter()
spark = tumult_spark(args.get("driver_memory", "2500m"), 2)
import pyspark.sql.functions as F
from pyspark.sql.types import StringType, StructField, StructType
from tmlt.analytics import (AddMaxRows, AddOneRow, KeySet, QueryBuilder, RhoZCDPBudget, Session,
                            TruncationStrategy)
t_spark = time.perf_counter()
root = args["data"]
def read(name, cols):
    schema = StructType([StructField(c, StringType()) for c in cols])
    return spark.read.csv(f"{root}/{name}.csv", sep="|", header=True, schema=schema)
P = ["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]
U = ["RTYPE", "MAFID", "FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"]
G = ["RTYPE", "MAFID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK", "TABBLKGRPCE", "REGIONCE",
     "DIVISIONCE", "PLACEFP", "AIANNHCE"]
states = sorted(args["states"])
persons = (read("persons", P).where("RTYPE = '3' AND CAST(RELSHIP AS INT) < 37")
           .select(F.col("MAFID").cast("long").alias("MAFID"), F.col("QAGE").cast("int").alias("QAGE"),
                   F.col("CENHISP").cast("int").alias("CENHISP"),
                   F.col("CENRACE").cast("int").alias("CENRACE"),
                   F.col("RELSHIP").cast("int").alias("RELSHIP")))
geo = (read("geo", G).where("RTYPE NOT IN ('4', '5')").where(F.col("TABBLKST").isin(states))
       .select(F.col("MAFID").cast("long").alias("MAFID"), F.col("TABBLKST").alias("STATE")))
units = (read("units", U).where("RTYPE = '2' AND HHT != '0'")
         .select(F.col("MAFID").cast("long").alias("MAFID"), F.col("HHRACE").cast("int").alias("R"),
                 F.col("HHSPAN").cast("int").alias("S"), F.col("TEN").cast("int").alias("TEN"))
         .join(geo, "MAFID")
         .select("MAFID", "STATE", F.lit("1").alias("USA"), F.lit("*").alias("ITER_STAR"),
                 F.expr("CASE WHEN R >= 7 THEN 'G' ELSE substring('ABCDEF', R, 1) END").alias("ITER_AG"),
                 F.expr("CASE WHEN S = 2 THEN 'H' WHEN R = 1 AND S = 1 THEN 'I' ELSE 'none' END")
                 .alias("ITER_HI"),
                 F.expr("CASE WHEN TEN = 1 THEN 2 WHEN TEN = 2 THEN 3 ELSE 4 END").alias("PH7_CELL")))
budgets = args["budgets"]
session = (Session.Builder().with_privacy_budget(RhoZCDPBudget(sum(float(v) for v in budgets.values())))
           .with_private_dataframe("persons", persons, protected_change=AddOneRow())
           .with_private_dataframe("units", units, protected_change=AddMaxRows(2))
           .build())
t_session = time.perf_counter()
iters = {"*": ("ITER_STAR", ["*"]), "A-G": ("ITER_AG", list("ABCDEFG")), "H,I": ("ITER_HI", ["H", "I"])}
rows, per_level = 0, {}
for level, rho in budgets.items():
    geo_level, it = level.split("_", 1)
    gcol, gvals = ("USA", ["1"]) if geo_level == "usa" else ("STATE", states)
    icol, ivals = iters[it]
    q = (QueryBuilder("persons")
         .join_private("units", truncation_strategy_left=TruncationStrategy.DropExcess(args["tau"]),
                       truncation_strategy_right=TruncationStrategy.DropNonUnique(), join_columns=["MAFID"])
         .groupby(KeySet.from_dict({gcol: gvals, icol: ivals, "PH7_CELL": [2, 3, 4]}))
         .count())
    t = time.perf_counter()
    rows += len(session.evaluate(q, RhoZCDPBudget(float(rho))).collect())
    per_level[level] = time.perf_counter() - t
t_end = time.perf_counter()
print(json.dumps({"rows": rows, "spark_start_s": t_spark - t0, "session_build_s": t_session - t_spark,
                  "queries_s": t_end - t_session, "per_level_s": per_level, "total_s": t_end - t0}))
'''


def worker(data: str, mode: str, out: str) -> dict[str, Any]:
    """Runs inside a child process: one dasflow PHSafe execution with stage timings."""
    from dasflow.privacy import rng
    from dasflow.products.phsafe import load_config, outputs
    from dasflow.products.phsafe import planning as plan_mod
    from dasflow.products.phsafe.inputs import read_inputs
    from dasflow.products.phsafe.product import PHSAFE, levels_of, measure_all
    from dasflow.products.phsafe.tabulate import build_universe, tabulate

    t: dict[str, float] = {}
    t0 = time.perf_counter()
    config = load_config(US_CONFIG)
    inputs = read_inputs(data)
    t["read_validate_s"] = time.perf_counter() - t0
    specs = plan_mod.plan(config)
    if mode == "ph7":
        specs = [s for s in specs if s.detail["table"] == "PH7"]
    t1 = time.perf_counter()
    uni = build_universe(inputs.persons, inputs.units, inputs.geo, config.state_filter,
                         min_tau=min(config.tau.values()))
    prepared = tabulate(uni, levels_of(specs), dict(config.tau), config.state_filter)
    t["prepare_s"] = time.perf_counter() - t1
    t2 = time.perf_counter()
    measurements = measure_all(prepared, specs, rng.seeded(2020), plan_mod.total(specs))
    t["measure_s"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    frames = PHSAFE.tables(PHSAFE.postprocess(measurements))
    outputs.write_tables(frames, out)
    t["postprocess_write_s"] = time.perf_counter() - t3
    t["total_s"] = time.perf_counter() - t0
    return {**t, "cells": sum(len(m.table) for m in measurements.values()), "measurements": len(specs),
            "persons": len(inputs.persons["MAFID"])}


def run_dasflow(data: Path, mode: str) -> dict[str, Any]:
    """The worker in a fresh child process, with its peak RSS sampled (same method as the Tumult side)."""
    with tempfile.TemporaryDirectory() as out:
        code = (f"import json, sys; sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); "
                f"sys.path.insert(0, {str(ROOT)!r}); import phsafe; "
                f"print(json.dumps(phsafe.worker({str(data)!r}, {mode!r}, {out!r})))")
        cmd = [str(PYTHON), "-c", code]
        load_before = os.getloadavg()[0]
        rc, stdout, stderr, wall, peak, cpu = tumult_env._watch(cmd, dict(os.environ), 3600.0)
        load_after = os.getloadavg()[0]
    if rc != 0:
        raise RuntimeError(f"dasflow worker failed:\n{stderr[-4000:]}")
    result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
    result["wall_s"] = wall
    result["peak_rss_mb"] = peak / 2**20
    result["cpu_s"] = cpu
    result["load_1min"] = [round(load_before, 2), round(load_after, 2)]
    return result


def ensure_data(persons: int) -> Path:
    """Synthetic PHSafe CSVs for the 51 US state equivalents (generated once, reused)."""
    root = BENCH / f"p{persons}"
    if not (root / "manifest.json").exists():
        from dasflow.products.phsafe.tables import US_STATE_CODES
        from dasflow.synth.dataset import generate
        generate(root, persons, 2020, states=sorted(US_STATE_CODES), formats=("phsafe",))
    return root / "phsafe"


def run_tumult(data: Path) -> dict[str, Any]:
    from dasflow.products.phsafe.tables import US_STATE_CODES
    return tumult_env.run_script(TUMULT_PH7, {"data": str(data), "states": sorted(US_STATE_CODES),
                                              "budgets": PH7_BUDGETS, "tau": 10}, timeout=7200.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--persons", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--skip-tumult", action="store_true")
    ap.add_argument("--json", type=Path, default=BENCH / "results.json")
    ap.add_argument("--reuse-tumult", type=Path, default=None,
                    help="take the Tumult runs from an earlier results JSON (same data and script)")
    ap.add_argument("--markdown", type=Path, default=None, help="also write the results table here")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run each dasflow case this many times; the run with the median CPU is reported")
    args = ap.parse_args(argv)
    reused: dict[str, Any] = {}
    if args.reuse_tumult is not None:
        old = json.loads(args.reuse_tumult.read_text())
        reused = {n: r["tumult_ph7"] for n, r in old["runs"].items() if "tumult_ph7" in r}
    results: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                               "machine": f"{platform.machine()}, {os.cpu_count()} cores",
                               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "runs": {}}
    if not args.skip_tumult:
        tumult_env.ensure(quiet=True)
        results["tumult_versions"] = json.loads(tumult_env.versions_json())
    for n in args.persons:
        data = ensure_data(n)
        run: dict[str, Any] = {}
        for mode in ("full", "ph7"):
            print(f"[{n:,} persons] dasflow {mode} ...", flush=True)
            runs = sorted((run_dasflow(data, mode) for _ in range(max(args.repeat, 1))), key=lambda r: r["cpu_s"])
            run[f"dasflow_{mode}"] = {**runs[len(runs) // 2], "cpu_s_all": [round(r["cpu_s"], 2) for r in runs],
                                      "wall_s_all": [round(r["wall_s"], 2) for r in runs]}
            print(json.dumps(run[f"dasflow_{mode}"]), flush=True)
        if str(n) in reused:
            run["tumult_ph7"] = {**reused[str(n)], "reused_from": str(args.reuse_tumult)}
        elif not args.skip_tumult:
            print(f"[{n:,} persons] Tumult Analytics PH7 ...", flush=True)
            run["tumult_ph7"] = run_tumult(data)
            print(json.dumps(run["tumult_ph7"]), flush=True)
        results["runs"][str(n)] = run
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    if args.markdown is not None:
        args.markdown.write_text(markdown(results))
    return 0


def markdown(results: dict[str, Any]) -> str:
    """The results as a Markdown table (one row per size and engine) plus the ratios."""
    lines = [f"Measured {results['date']} on {results['machine']}; command `{results['command']}`.", "",
             "| persons | run | wall s | CPU s | read+validate s | prepare s | measure s | peak RSS MB "
             "| load before → after |",
             "|---|---|---|---|---|---|---|---|---|"]
    for n, run in results["runs"].items():
        for name in ("dasflow_full", "dasflow_ph7"):
            r = run[name]
            every = r.get("cpu_s_all", [])
            spread = f" (of {', '.join(f'{c:.1f}' for c in every)})" if len(every) > 1 else ""
            lines.append(f"| {int(n):,} | {name} | {r['wall_s']:.1f} | {r.get('cpu_s', float('nan')):.2f}{spread} | "
                         f"{r['read_validate_s']:.1f} | {r['prepare_s']:.1f} | {r['measure_s']:.2f} | "
                         f"{r['peak_rss_mb']:.0f} | {' → '.join(str(x) for x in r.get('load_1min', []))} |")
        if "tumult_ph7" in run:
            t = run["tumult_ph7"]
            lines.append(f"| {int(n):,} | tumult_ph7 | {t['wall_s']:.1f} | {t.get('cpu_s', float('nan')):.1f} | "
                         f"(lazy) | (Spark start {t['spark_start_s']:.0f}, session {t['session_build_s']:.0f}) | "
                         f"queries {t['queries_s']:.1f} | {t['peak_rss_mb']:.0f} | "
                         f"{' → '.join(str(x) for x in t.get('load_1min', [])) or 'see text'} |")
    lines += ["", "| persons | PH7 speed-up, wall (Tumult / dasflow) | PH7 speed-up, CPU | "
              "PH7 speed-up, Tumult queries only / dasflow total |", "|---|---|---|---|"]
    for n, run in results["runs"].items():
        if "tumult_ph7" not in run:
            continue
        t, d = run["tumult_ph7"], run["dasflow_ph7"]
        cpu = (f"{t['cpu_s'] / d['cpu_s']:.0f}x" if "cpu_s" in t and "cpu_s" in d else "n/a")
        lines.append(f"| {int(n):,} | {t['wall_s'] / d['wall_s']:.0f}x | {cpu} | "
                     f"{t['queries_s'] / d['total_s']:.0f}x |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
