"""SafeTab-P benchmark: dasflow measurement on synthetic persons (1 M, 10 M) with the real 2020 iteration
files,
Tumult Analytics 0.21 on the same flat map + group-by count, and a measured-scaling full-US estimate.

Usage::

    .venv/bin/python benchmarks/safetab_p.py            # everything (1 M, 10 M, Tumult), writes results JSON
    .venv/bin/python benchmarks/safetab_p.py --one N    # one dasflow size in this process (prints JSON)

Synthetic persons: ``dasflow.synth`` was not committed when this benchmark was written, so persons come
from the
small vectorised generator below (documented shape, not a census model): 51 states, 62 counties per state, 2
tracts per county, 8 blocks per tract; half the blocks in a place, 4 % in one of 200 AIANNH areas; 1 race
code for
88 % of persons, 2 for 9 %, 3-8 for 3 %, codes drawn Zipf-like from the real 1,755-code list; 19 % Hispanic
QSPAN.

Each dasflow size runs in its own subprocess (peak RSS per size). Per (region type, level) the benchmark
runs the
product's own functions one key at a time, as the DAG does: flat map + count (``PersonCounts``,
``tabulate_level``), ``measure_stage1``, ``measure_stage2`` (reads stage 1), post-processing.

Full-US estimate (331 M persons, all production levels): per-person costs (validation/encoding and flat map +
count) from the 1 M → 10 M slope; per-population-group costs (noise, stage 2, post-processing) from the 10
M run
divided by its number of groups, times the full-US group count (1 USA, 51 states, 3,143 counties, 84,414
tracts,
31,908 places incl. CDPs, 700 AIANNH areas — approximate 2020 counts — × the real iteration counts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dasflow.privacy import rng as rng_mod  # noqa: E402
from dasflow.privacy import samplers  # noqa: E402
from dasflow.products.safetab_p.config import load_config  # noqa: E402
from dasflow.products.safetab_p.iterations import PACKAGED_DIR, packaged_iterations  # noqa: E402
from dasflow.products.safetab_p.measure import (  # noqa: E402
    iterations_key,
    measure_stage1,
    measure_stage2,
    regions_key,
    sparse_key,
    with_stage1,
)
from dasflow.products.safetab_p.outputs import postprocess  # noqa: E402
from dasflow.products.safetab_p.plan import plan  # noqa: E402
from dasflow.products.safetab_p.records import (  # noqa: E402
    PERSON_COLUMNS,
    encode_persons,
    load_geography,
)
from dasflow.products.safetab_p.tabulate import PersonCounts, group_totals, tabulate_level  # noqa: E402

STATES = ["01", "02", "04", "05", "06", "08", "09", "10", "11", "12", "13", "15", "16", "17", "18", "19", "20",
          "21", "22", "23", "24", "25", "26", "27", "28", "29", "30", "31", "32", "33", "34", "35", "36", "37",
          "38", "39", "40", "41", "42", "44", "45", "46", "47", "48", "49", "50", "51", "53", "54", "55", "56"]
COUNTIES_PER_STATE, TRACTS_PER_COUNTY, BLOCKS_PER_TRACT = 62, 2, 8
FULL_US_REGIONS = {"USA": 1, "STATE": 51, "COUNTY": 3143, "TRACT": 84414, "PLACE": 31908, "AIANNH": 700}
FULL_US_PERSONS = 331_000_000
RESULTS = ROOT / "benchmarks" / "results"


def _lpad(values: np.ndarray, width: int) -> pa.Array:
    return pc.utf8_lpad(pa.array(values).cast(pa.string()), width, "0")


def synth_geography() -> pa.Table:
    """The benchmark's public GRF-C (see the module docstring)."""
    n_st = len(STATES)
    n_blocks = n_st * COUNTIES_PER_STATE * TRACTS_PER_COUNTY * BLOCKS_PER_TRACT
    b = np.arange(n_blocks)
    st = np.array(STATES)[b // (COUNTIES_PER_STATE * TRACTS_PER_COUNTY * BLOCKS_PER_TRACT)]
    cou = (b // (TRACTS_PER_COUNTY * BLOCKS_PER_TRACT)) % COUNTIES_PER_STATE * 2 + 1
    tract = (b // BLOCKS_PER_TRACT) % TRACTS_PER_COUNTY + 1
    blk = b % BLOCKS_PER_TRACT + 1
    rng = np.random.default_rng(99)
    in_place = rng.random(n_blocks) < 0.5
    place = np.where(in_place, (cou // 4) * 10 + 10000, 99999)
    in_aian = rng.random(n_blocks) < 0.04
    aian = np.where(in_aian, rng.integers(1, 201, n_blocks), 9999)
    return pa.table({"TABBLKST": pa.array(st), "TABBLKCOU": _lpad(cou, 3), "TABTRACTCE": _lpad(tract * 100, 6),
                     "TABBLK": _lpad(blk, 4), "PLACEFP": _lpad(place, 5), "AIANNHCE": _lpad(aian, 4)})


def synth_persons(n: int, grfc: pa.Table, seed: int) -> pa.Table:
    """n persons in the benchmark geography, all columns strings as the reader delivers them."""
    rng = np.random.default_rng(seed)
    codes = packaged_iterations().codes.astype(np.int64)
    race_codes = codes[codes // 1000 != 2]
    hisp_codes = codes[codes // 1000 == 2]
    w = 1.0 / np.arange(1, len(race_codes) + 1) ** 1.1
    w /= w.sum()
    k = rng.choice([1, 2, 3, 4, 8], size=n, p=[0.88, 0.09, 0.02, 0.007, 0.003])
    race = rng.choice(race_codes, size=(n, 8), p=w).astype(np.int16)
    # distinct codes within a person: redraw duplicates uniformly (rare)
    race.sort(axis=1)
    dup = np.zeros_like(race, dtype=bool)
    dup[:, 1:] = race[:, 1:] == race[:, :-1]
    race[dup] = rng.choice(race_codes, size=int(dup.sum())).astype(np.int16)
    del dup
    qspan = np.where(rng.random(n) < 0.19, rng.choice(hisp_codes, size=n), 9950)
    blocks = rng.integers(0, grfc.num_rows, size=n)
    cols: dict[str, pa.Array] = {
        "QAGE": _lpad(rng.integers(0, 116, size=n), 3),
        "QSEX": pa.array(rng.integers(1, 3, size=n)).cast(pa.string()),
        "HOUSEHOLDER": pa.array(np.full(n, "True")),
    }
    idx = pa.array(blocks)
    for c in ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"):
        cols[c] = pc.take(grfc.column(c), idx).combine_chunks()
    cols["CENRACE"] = pa.array(np.full(n, "01"))
    for j in range(8):
        s = pa.array(race[:, j]).cast(pa.string())
        cols[f"QRACE{j + 1}"] = pc.if_else(pa.array(j < k), s, "Null")
    cols["QSPAN"] = pa.array(qspan).cast(pa.string())
    return pa.table([cols[c] for c in PERSON_COLUMNS], names=list(PERSON_COLUMNS))


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(n: int) -> dict[str, Any]:
    """One dasflow run at n persons, key by key; returns timings (s), group counts and peak RSS."""
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    index = packaged_iterations()
    grfc = synth_geography()
    geo = load_geography(grfc, "US", cfg.state_filter_us, "GRF-C.txt")
    t0 = time.perf_counter()
    persons_table = synth_persons(n, grfc, seed=n)
    t_synth = time.perf_counter() - t0
    t0 = time.perf_counter()
    c0 = time.process_time()
    persons = encode_persons(persons_table, geo, index, cfg.max_race_codes, cfg.state_filter_us, "synthetic")
    t_encode = time.perf_counter() - t0
    cpu_encode = time.process_time() - c0
    del persons_table
    specs = {s.key: s for s in plan(cfg, index, geo)}
    g = rng_mod.seeded(2020)
    keys: list[dict[str, Any]] = []
    counts_rt = ""
    tab = cfg.tabulated("US")
    ordered = [(rt, lv) for rt in dict.fromkeys(r for r, _ in tab) for lv in (1, 2) if (rt, lv) in tab]
    counts: PersonCounts | None = None
    for rt, lv in ordered:  # region-major: one PersonCounts per region type, shared by its levels (as prepare)
        c0 = time.process_time()
        t0 = time.perf_counter()
        if counts is None or counts_rt != rt:
            counts, counts_rt = None, rt
            counts = PersonCounts(persons, rt)
        sparse = tabulate_level(counts, index.levels[lv])
        t_count = time.perf_counter() - t0
        cpu_count = time.process_time() - c0
        level = index.levels[lv]
        import pandas as pd

        prepared = {
            sparse_key("US", rt, lv): sparse,
            regions_key("US", rt): pd.DataFrame({"REGION_ID": geo.region_ids[rt]}),
            iterations_key(lv): pd.DataFrame({"ITERATION_CODE": level.iteration_codes.astype(object),
                                              "TOTAL_ONLY": level.total_only}),
        }
        s1 = specs[f"safetab-p/US/{rt}/{lv}/stage1"]
        s2 = specs[f"safetab-p/US/{rt}/{lv}/stage2"]
        t0 = time.perf_counter()
        m1 = measure_stage1(prepared, s1, g.spawn(s1.key))
        t_s1 = time.perf_counter() - t0
        t0 = time.perf_counter()
        m2 = measure_stage2(with_stage1(prepared, m1), s2, g.spawn(s2.key))
        t_s2 = time.perf_counter() - t0
        t0 = time.perf_counter()
        est = postprocess({s2.key: m2}, cfg)
        t_post = time.perf_counter() - t0
        cpu = time.process_time() - c0
        n_groups = len(geo.region_ids[rt]) * level.n_iterations
        keys.append({"region_type": rt, "level": lv, "groups": n_groups, "sparse_rows": len(sparse),
                     "stage2_rows": len(m2.table), "t1_rows": len(est["t1"]), "t2_rows": len(est["t2"]),
                     "count_s": t_count, "stage1_s": t_s1, "stage2_s": t_s2, "post_s": t_post,
                     "key_cpu_s": cpu, "count_cpu_s": cpu_count})
        del sparse, prepared, m1, m2, est
    return {"persons": n, "synth_s": t_synth, "encode_s": t_encode, "encode_cpu_s": cpu_encode, "keys": keys,
            "peak_rss_mb": _rss_mb()}


def dasflow_peer_key(n: int, rt: str = "STATE", lv: int = 2) -> dict[str, Any]:
    """The Tumult-comparable piece: flat map + group-by count + discrete Gaussian noise over the full public
    (region × iteration) domain of one (region type, level), on the same persons file Tumult reads."""
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    index = packaged_iterations()
    grfc = synth_geography()
    geo = load_geography(grfc, "US", cfg.state_filter_us, "GRF-C.txt")
    table = synth_persons(n, grfc, seed=n)
    t0 = time.perf_counter()
    c0 = time.process_time()
    persons = encode_persons(table, geo, index, cfg.max_race_codes, cfg.state_filter_us, "synthetic")
    sparse = tabulate_level(PersonCounts(persons, rt), index.levels[lv])
    n_groups = len(geo.region_ids[rt]) * index.levels[lv].n_iterations
    totals = group_totals(sparse, n_groups)
    noisy = totals + samplers.discrete_gaussian(Fraction(9, 2) / Fraction("2.134"), n_groups, rng_mod.seeded(1))
    wall = time.perf_counter() - t0
    return {"persons": n, "wall_s": wall, "cpu_s": time.process_time() - c0, "groups": n_groups,
            "sum": int(noisy.sum())}


TUMULT_SCRIPT = r'''
import json, time
args = tumult_env_args()
from pyspark.sql import types as T
from tmlt.analytics import KeySet, QueryBuilder, Session, RhoZCDPBudget, AddOneRow
spark = tumult_spark()
M = json.load(open(args["map"]))
t0 = time.perf_counter()
df = spark.read.parquet(args["persons"])
def fm(row):
    codes = [row["QRACE%d" % i] for i in range(1, 9) if row["QRACE%d" % i] != "Null"]
    alone = set(M["alone"].get(codes[0], []))
    for c in codes[1:]:
        alone &= set(M["alone"].get(c, []))
    aoic = set()
    for c in codes:
        aoic |= set(M["aoic"].get(c, []))
    its = alone | aoic | set(M["eth"].get(row["QSPAN"], []))
    return [{"ITERATION_CODE": it} for it in sorted(its)]
session = Session.from_dataframe(privacy_budget=RhoZCDPBudget(float(args["rho"])), source_id="persons",
                                 dataframe=df, protected_change=AddOneRow())
keys = KeySet.from_dict({"TABBLKST": args["states"], "ITERATION_CODE": args["iterations"]})
q = (QueryBuilder("persons")
     .flat_map(fm, new_column_types={"ITERATION_CODE": "VARCHAR"}, augment=True, max_rows=int(args["s"]))
     .groupby(keys).count())
out = session.evaluate(q, RhoZCDPBudget(float(args["rho"])))
rows = out.count()
total = out.agg({"count": "sum"}).collect()[0][0]
print(json.dumps({"tumult_s": time.perf_counter() - t0, "rows": rows, "sum": total}))
'''


def run_tumult(n: int, workdir: Path) -> dict[str, Any]:
    """Tumult Analytics 0.21 (separate venv, benchmarks/tumult_env.py): flat map + group-by count with
    noise for
    (STATE, level 2) over the same synthetic persons."""
    from benchmarks import tumult_env

    tumult_env.ensure(quiet=True)
    index = packaged_iterations()
    level = index.levels[2]
    codes = index.codes

    def lists(ptr: np.ndarray, idx: np.ndarray) -> dict[str, list[str]]:
        return {str(codes[c]): [str(level.iteration_codes[i]) for i in idx[ptr[c]:ptr[c + 1]]]
                for c in range(len(codes)) if ptr[c + 1] > ptr[c]}

    mp = {"alone": lists(level.alone_ptr, level.alone_idx), "aoic": lists(level.aoic_ptr, level.aoic_idx),
          "eth": lists(level.eth_ptr, level.eth_idx)}
    map_path = workdir / "map.json"
    map_path.write_text(json.dumps(mp))
    import pyarrow.parquet as pq

    table = synth_persons(n, synth_geography(), seed=n)
    cols = ["TABBLKST", *[f"QRACE{i}" for i in range(1, 9)], "QSPAN"]
    pq.write_table(table.select(cols), workdir / "persons.parquet")
    return tumult_env.run_script(TUMULT_SCRIPT, {
        "persons": str(workdir / "persons.parquet"), "map": str(map_path), "rho": "2.134", "s": 9,
        "states": STATES, "iterations": [str(c) for c in level.iteration_codes]}, timeout=3600)


def estimate_full_us(r1: dict[str, Any], r10: dict[str, Any]) -> dict[str, Any]:
    """Measured scaling → full US (see the module docstring)."""
    dn = r10["persons"] - r1["persons"]
    per_person = (r10["encode_s"] - r1["encode_s"]) / dn
    count_slope = (sum(k["count_s"] for k in r10["keys"]) - sum(k["count_s"] for k in r1["keys"])) / dn
    groups10 = sum(k["groups"] for k in r10["keys"])
    per_group = sum(k["stage1_s"] + k["stage2_s"] + k["post_s"] for k in r10["keys"]) / groups10
    index = packaged_iterations()
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    full_groups = sum(FULL_US_REGIONS[rt] * index.levels[lv].n_iterations for rt, lv in cfg.tabulated("US"))
    est = {"encode_s": per_person * FULL_US_PERSONS, "count_s": count_slope * FULL_US_PERSONS,
           "measure_post_s": per_group * full_groups, "full_us_groups": full_groups}
    est["total_s"] = est["encode_s"] + est["count_s"] + est["measure_post_s"]
    if "encode_cpu_s" in r10 and "count_cpu_s" in r10["keys"][0]:
        enc = (r10["encode_cpu_s"] - r1["encode_cpu_s"]) / dn
        cnt = (sum(k["count_cpu_s"] for k in r10["keys"]) - sum(k["count_cpu_s"] for k in r1["keys"])) / dn
        per_group_cpu = sum(k["key_cpu_s"] - k["count_cpu_s"] for k in r10["keys"]) / groups10
        est["cpu"] = {"encode_s": enc * FULL_US_PERSONS, "count_s": cnt * FULL_US_PERSONS,
                      "measure_post_s": per_group_cpu * full_groups}
        est["cpu"]["total_s"] = sum(est["cpu"].values())
    return est


def _subprocess(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result



def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--one", type=int, default=None)
    p.add_argument("--peer", type=int, default=None)
    p.add_argument("--tumult-persons", type=int, default=1_000_000)
    p.add_argument("--sizes", default="1000000,10000000", help="dasflow sizes ('' to skip)")
    a = p.parse_args(argv)
    if a.one is not None:
        print(json.dumps(run_one(a.one)))
        return 0
    if a.peer is not None:
        print(json.dumps(dasflow_peer_key(a.peer)))
        return 0
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else []
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / "safetab_p.json"
    result: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.update({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": os.uname().nodename,
                   "cpus": os.cpu_count()})

    def save() -> None:  # partial results survive an interrupted run
        out_path.write_text(json.dumps(result, indent=1))

    if sizes:
        result["runs"] = []
        for n in sizes:
            result["runs"].append(_subprocess(["--one", str(n)]))
            save()
        if len(sizes) > 1:
            result["full_us_estimate"] = estimate_full_us(result["runs"][0], result["runs"][-1])
            save()
    if a.tumult_persons > 0:
        result["peer_dasflow"] = _subprocess(["--peer", str(a.tumult_persons)])
        save()
        with tempfile.TemporaryDirectory() as d:
            result["tumult"] = run_tumult(a.tumult_persons, Path(d))
        result["speedup_vs_tumult"] = result["tumult"]["tumult_s"] / result["peer_dasflow"]["wall_s"]
        # tumult_env's cpu_s: user+system CPU of the venv interpreter and its Spark JVM (whole child tree)
        result["cpu_ratio_vs_tumult"] = result["tumult"]["cpu_s"] / result["peer_dasflow"]["cpu_s"]
        save()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
