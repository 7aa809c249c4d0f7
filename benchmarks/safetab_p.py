"""SafeTab-P benchmark on the project's synthetic census (``dasflow.synth``, SafeTab-P text format), with the
real 2020 iteration files and the 2020 production config: the in-memory path at 1 M and 10 M persons, the
partitioned (per-state files) path at 10 M and 30 M, Tumult Analytics 0.21 on the same flat map + group-by
count, and a full-US estimate from measured scaling.

Usage::

    .venv/bin/python benchmarks/safetab_p.py                      # everything below, writes results JSON
    .venv/bin/python benchmarks/safetab_p.py --runs mem:1000000 --tumult-persons 0
    .venv/bin/python benchmarks/safetab_p.py --runs "" --tumult-persons 1000000

Data (``--workdir``, default ``/tmp/safetab_p_bench``; reused when present): ``synth.generate(...,
formats=("safetab_p",))`` writes ``person-records.txt`` + ``GRF-C.txt`` for all 52 state equivalents (seed 1).
The split input of the partitioned path is generated state by state (``synth.generate(states=[s],
persons=apportion(N)[s])`` — by synth's determinism contract the same persons as the national file) into
``person-records/<SS>.txt`` with the states' GRF-C rows concatenated.

Each run is a fresh subprocess (its own peak RSS). A run does what the product does: ``load_public`` (GRF-C,
geography), the person path (in memory: read the file, ``encode_persons`` = validate + encode, then
``PersonCounts`` per region type; partitioned: ``product.person_counts`` over the files, i.e. read + validate +
encode + count one state at a time, then merge), then per (region type, level) — one key at a time, as the DAG
does — ``tabulate_level`` (flat map), ``measure_stage1``, ``measure_stage2`` (reads stage 1) and the
post-processing. CPU seconds (user+sys of the process) are recorded next to wall seconds: the machine is shared.

Full-US estimate (331 M persons, all production US levels): per-person cost of the person path (read +
validate + encode + count + flat map) from the largest run's per-person CPU/wall (and the 1 M → 10 M slope);
per-population-group cost (noise, stage 2, post-processing) from the largest run divided by its number of
groups, times the full-US group count (1 USA, 51 states, 3,143 counties, 84,414 tracts, 31,908 places,
700 AIANNH areas — approximate 2020 counts — × the real iteration counts).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dasflow import synth  # noqa: E402
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
from dasflow.products.safetab_p.plan import level_of, plan  # noqa: E402
from dasflow.products.safetab_p.product import PERSON_DIR, load_inputs, load_public, person_counts  # noqa: E402
from dasflow.products.safetab_p.records import GRFC_FILE, PERSON_COLUMNS, PERSON_FILE, encode_persons  # noqa: E402
from dasflow.products.safetab_p.regions import iteration_set  # noqa: E402
from dasflow.products.safetab_p.tabulate import PersonCounts, group_totals, tabulate_level  # noqa: E402

SEED = 1
FULL_US_REGIONS = {"USA": 1, "STATE": 51, "COUNTY": 3143, "TRACT": 84414, "PLACE": 31908, "AIANNH": 700}
FULL_US_PERSONS = 331_000_000
RESULTS = ROOT / "benchmarks" / "results"
DEFAULT_RUNS = "mem:1000000,mem:10000000,split:10000000,split:30000000"


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _vm(field: str) -> float:
    """VmRSS / VmHWM of this process in MB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def single_data(n: int, work: Path) -> Path:
    """``dasflow.synth`` SafeTab-P files (one person-records.txt) for n persons, all 52 state equivalents."""
    root = work / f"single-{n}"
    if not (root / "manifest.json").is_file():
        shutil.rmtree(root, ignore_errors=True)
        synth.generate(root, persons=n, seed=SEED, formats=("safetab_p",))
    return root / "safetab_p"


def split_data(n: int, work: Path) -> Path:
    """The same persons as :func:`single_data` split per state: person-records/<SS>.txt + one GRF-C."""
    root = work / f"split-{n}"
    done = root / "DONE"
    if done.is_file():
        return root
    shutil.rmtree(root, ignore_errors=True)
    (root / PERSON_DIR).mkdir(parents=True)
    shares = synth.apportion(n, synth.parse_states(None))
    with (root / GRFC_FILE).open("wb") as grfc:
        for k, (st, m) in enumerate(shares.items()):  # over states, not records
            tmp = root / f".gen-{st}"
            synth.generate(tmp, persons=m, seed=SEED, states=[st], formats=("safetab_p",))
            os.replace(tmp / "safetab_p" / PERSON_FILE, root / PERSON_DIR / f"{st}.txt")
            with (tmp / "safetab_p" / GRFC_FILE).open("rb") as g:
                header = g.readline()
                if k == 0:
                    grfc.write(header)
                shutil.copyfileobj(g, grfc)
            shutil.rmtree(tmp)
    done.write_text("ok\n")
    return root


def _load(data: Path) -> tuple[Any, Any, dict[str, Any]]:
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    public = load_public(PACKAGED_DIR, data, "US", cfg)
    return cfg, public["iterations"], public


def run_one(kind: str, n: int, data: Path) -> dict[str, Any]:
    """One dasflow run (see the module docstring); timings in s, CPU = user+sys of this process."""
    c0, t0 = _cpu(), time.perf_counter()
    cfg, index, public = _load(data)
    geo = public["geography"]
    out: dict[str, Any] = {"kind": kind, "persons": n, "public_s": time.perf_counter() - t0,
                           "public_cpu_s": _cpu() - c0, "load_avg_start": os.getloadavg()}
    tab = cfg.tabulated("US")
    rts = list(dict.fromkeys(rt for rt, _ in tab))
    counts: dict[str, PersonCounts] = {}
    c0, t0 = _cpu(), time.perf_counter()
    inputs = load_inputs(data)
    if kind == "mem":  # the file read whole, then validated/encoded/counted in slices by the product's code
        out["read_s"], out["read_cpu_s"] = time.perf_counter() - t0, _cpu() - c0
        c1, t1 = _cpu(), time.perf_counter()
        counts = dict(person_counts(inputs, public, rts))
        out["encode_count_s"], out["encode_count_cpu_s"] = time.perf_counter() - t1, _cpu() - c1
        del inputs
    else:
        out["files"] = len(inputs["person_files"])
        counts = dict(person_counts(inputs, public, rts))
    out["person_path_s"], out["person_path_cpu_s"] = time.perf_counter() - t0, _cpu() - c0
    out["count_rows"] = {rt: c.rows for rt, c in counts.items()}
    out["rss_after_person_path_mb"] = _vm("VmRSS")
    out["peak_rss_person_path_mb"] = _vm("VmHWM")
    specs = {s.key: s for s in plan(cfg, index, geo)}
    g = rng_mod.seeded(2020)
    keys: list[dict[str, Any]] = []
    for rt in rts:
        for lv in (lv for r, lv in tab if r == rt):
            level = level_of(cfg, index, rt, lv)  # the region granularity rule (issue 23)
            its = iteration_set(rt, cfg.ignore_region_granularity)
            c0, t0 = _cpu(), time.perf_counter()
            sparse = tabulate_level(counts[rt], level)
            t_flat, cpu_flat = time.perf_counter() - t0, _cpu() - c0
            prepared = {
                sparse_key("US", rt, lv): sparse,
                regions_key("US", rt): pd.DataFrame({"REGION_ID": geo.region_ids[rt]}),
                iterations_key(lv, its): pd.DataFrame({"ITERATION_CODE": level.iteration_codes.astype(object),
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
            cpu = _cpu() - c0
            keys.append({"region_type": rt, "level": lv, "groups": len(geo.region_ids[rt]) * level.n_iterations,
                         "sparse_rows": len(sparse), "stage2_rows": len(m2.table), "t1_rows": len(est["t1"]),
                         "t2_rows": len(est["t2"]), "flatmap_s": t_flat, "flatmap_cpu_s": cpu_flat,
                         "stage1_s": t_s1, "stage2_s": t_s2, "post_s": t_post, "key_cpu_s": cpu})
            del sparse, prepared, m1, m2, est
        del counts[rt]
    out["keys"] = keys
    out["regions"] = {rt: len(geo.region_ids[rt]) for rt in rts}
    out["peak_rss_mb"] = _rss_mb()
    out["load_avg_end"] = os.getloadavg()
    return out


def dasflow_peer_key(n: int, data: Path, rt: str = "STATE", lv: int = 2) -> dict[str, Any]:
    """The Tumult-comparable piece: read + validate/encode the person file, flat map + group-by count +
    discrete Gaussian noise over the full public (region × iteration) domain of one (region type, level)."""
    cfg, index, public = _load(data)
    geo = public["geography"]
    c0, t0 = _cpu(), time.perf_counter()
    table = load_inputs(data)["persons"]
    read_s, read_cpu = time.perf_counter() - t0, _cpu() - c0
    persons = encode_persons(table, geo, index, cfg.max_race_codes, cfg.state_filter_us, "person-records.txt")
    sparse = tabulate_level(PersonCounts(persons, rt), index.levels[lv])
    n_groups = len(geo.region_ids[rt]) * index.levels[lv].n_iterations
    totals = group_totals(sparse, n_groups)
    noisy = totals + samplers.discrete_gaussian(Fraction(9, 2) / Fraction("2.134"), n_groups, rng_mod.seeded(1))
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    return {"persons": n, "wall_s": wall, "cpu_s": cpu, "read_s": read_s, "read_cpu_s": read_cpu,
            "groups": n_groups, "sum": int(noisy.sum()), "true_sum": int(totals.sum()),
            "load_avg": os.getloadavg()}


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


def run_tumult(n: int, data: Path, workdir: Path) -> dict[str, Any]:
    """Tumult Analytics 0.21 (separate venv, benchmarks/tumult_env.py): flat map + group-by count with noise
    for (STATE, level 2) over the same synthetic persons (the columns it needs, as Parquet)."""
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

    from dasflow.products.safetab_p.records import read_pipe_file

    table = read_pipe_file(data / PERSON_FILE, PERSON_COLUMNS)
    cols = ["TABBLKST", *[f"QRACE{i}" for i in range(1, 9)], "QSPAN"]
    pq.write_table(table.select(cols), workdir / "persons.parquet")
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    out = tumult_env.run_script(TUMULT_SCRIPT, {
        "persons": str(workdir / "persons.parquet"), "map": str(map_path), "rho": "2.134", "s": 9,
        "states": list(cfg.state_filter_us), "iterations": [str(c) for c in level.iteration_codes]},
        timeout=3600)
    out["load_avg"] = os.getloadavg()
    return out


def estimate_full_us(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Measured scaling → full US (see the module docstring)."""
    index = packaged_iterations()
    cfg = load_config(PACKAGED_DIR / "production-config.json")
    full_groups = sum(FULL_US_REGIONS[rt] * index.levels[lv].n_iterations for rt, lv in cfg.tabulated("US"))
    big = max(runs, key=lambda r: (r["persons"], r["kind"] == "split"))
    out: dict[str, Any] = {"full_us_groups": full_groups, "from_run": f"{big['kind']}:{big['persons']}"}
    for unit in ("wall", "cpu"):
        sfx = "_s" if unit == "wall" else "_cpu_s"
        flat = sum(k["flatmap" + sfx] for k in big["keys"])
        per_person = (big["person_path" + sfx] + flat) / big["persons"]
        if unit == "wall":
            per_group = sum(k["stage1_s"] + k["stage2_s"] + k["post_s"] for k in big["keys"])
        else:
            per_group = sum(k["key_cpu_s"] - k["flatmap_cpu_s"] for k in big["keys"])
        per_group /= sum(k["groups"] for k in big["keys"])
        est = {"person_path_s": per_person * FULL_US_PERSONS, "measure_post_s": per_group * full_groups,
               "public_s": big["public" + sfx] * 1.0}
        est["total_s"] = sum(est.values())
        out[unit] = est
    mem = sorted((r for r in runs if r["kind"] == "mem"), key=lambda r: r["persons"])
    if len(mem) >= 2:
        a, b = mem[0], mem[-1]
        dn = b["persons"] - a["persons"]

        def pp(r: dict[str, Any]) -> float:
            return float(r["person_path_cpu_s"] + sum(k["flatmap_cpu_s"] for k in r["keys"]))

        out["cpu_person_path_slope_s"] = (pp(b) - pp(a)) / dn * FULL_US_PERSONS
    return out


def _subprocess(args: list[str]) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--one", default=None, help="internal: KIND:N:DATA_DIR, one run in this process")
    p.add_argument("--peer", default=None, help="internal: N:DATA_DIR")
    p.add_argument("--runs", default=DEFAULT_RUNS, help="comma-separated mem:N / split:N ('' to skip)")
    p.add_argument("--tumult-persons", type=int, default=1_000_000)
    p.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "safetab_p_bench"))
    a = p.parse_args(argv)
    if a.one is not None:
        kind, n, data = a.one.split(":", 2)
        print(json.dumps(run_one(kind, int(n), Path(data))))
        return 0
    if a.peer is not None:
        n, data = a.peer.split(":", 1)
        print(json.dumps(dasflow_peer_key(int(n), Path(data))))
        return 0
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    out_path = RESULTS / "safetab_p.json"
    result: dict[str, Any] = json.loads(out_path.read_text()) if out_path.exists() else {}
    result.update({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": os.uname().nodename,
                   "cpus": os.cpu_count(), "data": "dasflow.synth (safetab_p format), seed 1, all 52 states"})

    def save() -> None:  # partial results survive an interrupted run
        out_path.write_text(json.dumps(result, indent=1))

    runs = [r.split(":") for r in a.runs.split(",")] if a.runs else []
    if runs:
        done = {(r["kind"], r["persons"]): r for r in result.get("runs", []) if "kind" in r}
        for kind, n_text in runs:
            done.pop((kind, int(float(n_text))), None)
        result["runs"] = sorted(done.values(), key=lambda r: (r["kind"] != "mem", r["persons"]))
        for kind, n_text in runs:
            n = int(float(n_text))
            c0, t0 = time.perf_counter(), os.getloadavg()
            data = single_data(n, work) if kind == "mem" else split_data(n, work)
            print(f"data {kind}:{n} ready ({time.perf_counter() - c0:.0f} s, load {t0[0]:.1f})", file=sys.stderr)
            r = _subprocess(["--one", f"{kind}:{n}:{data}"])
            result["runs"].append(r)
            print(f"run {kind}:{n}: person path {r['person_path_s']:.1f} s wall / {r['person_path_cpu_s']:.1f} s "
                  f"CPU, peak {r['peak_rss_mb']:.0f} MB", file=sys.stderr)
            save()
        result["runs"].sort(key=lambda r: (r["kind"] != "mem", r["persons"]))
        result["full_us_estimate"] = estimate_full_us(result["runs"])
        save()
    if a.tumult_persons > 0:
        data = single_data(a.tumult_persons, work)
        result["peer_dasflow"] = _subprocess(["--peer", f"{a.tumult_persons}:{data}"])
        save()
        with tempfile.TemporaryDirectory() as d:
            result["tumult"] = run_tumult(a.tumult_persons, data, Path(d))
        result["speedup_vs_tumult"] = result["tumult"]["tumult_s"] / result["peer_dasflow"]["wall_s"]
        # tumult_env's cpu_s: user+system CPU of the venv interpreter and its Spark JVM (whole child tree)
        result["cpu_ratio_vs_tumult"] = result["tumult"]["cpu_s"] / result["peer_dasflow"]["cpu_s"]
        save()
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
