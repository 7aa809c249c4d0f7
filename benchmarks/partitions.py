"""Partitioned preprocessing (issue #20 item 2): a product's preprocess stage on one national input vs one
partition per state, peak memory against the number of states.

    .venv/bin/python benchmarks/partitions.py [--product phsafe|safetab-p|groupsize|matrix]
        [--persons 1000000 3000000] [--states-only] [--out benchmarks/results/partitions.json]
        (default out: results/partitions.json for phsafe, else results/partitions_<product>.json)

Group sizes and the matrix product read Parquet files: their national layout is every file of the census directly
under the input prefix (one pass), their per-state layout the census's own ``{SS}/`` folders. Each layout's
release is also planned in its own fresh process before the preprocess (``plan``: the process's peak RSS above its
RSS before the stage; the plan reads the products' public inputs). ``--states-only`` runs the per-state layout
only (e.g. the same script on an older checkout: before/after figures).

For each total of persons and each state set (the 8 most populous states; all 51), one synthetic census is
generated in both layouts of the product (PHSafe: ``phsafe``, national ``persons.csv`` / ``units.csv``, vs
``phsafe_states``, one folder per state; SafeTab-P: ``safetab_p``, one ``person-records.txt``, vs
``safetab_p_states``, ``person-records/{SS}.txt``) and hard-linked into one store per layout. Validation runs
in its own process (not measured); the preprocess stage then runs in a fresh process per layout, and its stage
manifest's metrics give wall, CPU, the process RSS before the stage and its peak (``ru_maxrss``). Reported
with the persons of the largest state, which bounds the partitioned peak: the national layout's peak grows with
the total, the partitioned one's with the largest state. Prepared tables are checked identical between the layouts.
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
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the 8 most populous states (2020): CA TX FL NY PA IL OH GA
EIGHT = ["06", "48", "12", "36", "42", "17", "39", "13"]


#: per product: (national layout, per-state layout), its demo config, the public file (census name, store key),
#: the public input's name and the cap
PRODUCTS: dict[str, dict[str, Any]] = {
    "phsafe": {"layouts": ("phsafe", "phsafe_states"), "config": "phsafe-us-config.json",
               "public": ("geo.csv", "public/phsafe/geo.csv"), "public_input": "phsafe_geo", "rho": "2"},
    "safetab-p": {"layouts": ("safetab_p", "safetab_p_states"), "config": "safetab-p-config.json",
                  "public": ("GRF-C.txt", "public/safetab-p/GRF-C.txt"), "public_input": "safetab-p_public",
                  "rho": "100"},
    # Parquet inputs: (census folder, input prefix); the national layout is the same files with no folders
    "groupsize": {"layouts": ("groupsize_flat", "groupsize"), "config": "groupsize-config.json",
                  "parquet": ("groupsize/units", "confidential/synth/groupsize/"),
                  "public_input": "groupsize_public", "public_prefix": "public/groupsize/", "rho": "1"},
    "matrix": {"layouts": ("topdown_flat", "topdown"), "config": "matrix-config.json",
               "parquet": ("topdown/persons", "confidential/synth/topdown/persons/"), "rho": "1"},
}


def release_config(store_dir: Path, layout: str, states: list[str], product: str = "phsafe") -> dict[str, Any]:
    spec = PRODUCTS[product]
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath(spec["config"]).read_text())
    if "parquet" in spec:
        inputs = {product: spec["parquet"][1]}
        if "public_input" in spec:
            inputs[spec["public_input"]] = spec["public_prefix"]
    else:
        inputs = {product: f"confidential/synth/{layout}/",
                  spec["public_input"]: spec["public"][1].rsplit("/", 1)[0] + "/"}
    return {"release_id": "bench", "universe": "US", "store": str(store_dir),
            "inputs": inputs,
            "products": [{"name": product, "config_text": json.dumps(cfg)}], "cap": {"rho": spec["rho"]},
            "rng": {"mode": "test", "seed": 1}}


def child(mode: str, config_path: str) -> None:
    """In a fresh process: ``validate`` (not measured) or ``preprocess`` (prints its stage manifest)."""
    from dasflow.config import parse_release_config
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    if mode == "synth":  # the census, in a child: the parent stays small (a child's ru_maxrss starts at its
        from dasflow import synth  # parent's RSS at the fork, so a large parent would floor every figure)

        persons, states, formats, out = json.loads(config_path)
        synth.generate(Path(out), persons=persons, seed=7, states=states, formats=tuple(formats))
        return
    ctx = freeze_config(parse_release_config(json.loads(Path(config_path).read_text())))
    product = ctx.config.products[0].name
    if mode == "validate":
        if product == "groupsize":  # its public files, derived from the census as the demo derives them
            from dasflow.products.plugin import DemoCensus
            from dasflow.registry import get_plugin

            census = json.loads(ctx.store.get("confidential/synth/manifest.json"))
            get_plugin(product).demo_public(ctx.store, DemoCensus(tuple(census["states"]), census["totals"]))
        stages.validate_stage(ctx, product)
        return
    if mode == "plan":
        start = _rss_bytes()
        t0 = time.process_time()
        stages.plan_stage(ctx)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"cpu_seconds": time.process_time() - t0, "rss_start_bytes": start,
                          "peak_rss_bytes": peak}))
        return
    manifest = stages.preprocess_stage(ctx, product)
    prepared = stages.load_prepared(ctx, product)
    digest = {}
    for name in prepared:
        frame = prepared[name]  # counts: their sum; public domains (no COUNT): their rows
        digest[name] = int(frame["COUNT"].astype("int64").sum()) if "COUNT" in frame else len(frame)
    print(json.dumps({"metrics": manifest["metrics"], "partitions": len(manifest.get("partitions", [])),
                      "counts": digest}))


def _rss_bytes() -> int:
    """The process's resident set now (Linux ``/proc/self/statm``)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_child(mode: str, config_path: Path | str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(config_path)], check=False,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1]) if mode in ("preprocess", "plan") else {}


def link_parquet_store(census: Path, store: Path, product: str, layout: str, states: list[str]) -> None:
    """A store with the product's Parquet files (in their state folders, or all directly under the input prefix,
    renamed ``{SS}-part-*``, with the synthetic manifest listing them so)."""
    src, prefix = PRODUCTS[product]["parquet"]
    manifest = json.loads((census / "manifest.json").read_text())
    root = store / "confidential/synth"
    flat = layout.endswith("_flat")
    if not flat:
        shutil.copytree(census / src, root / src, copy_function=os.link)
    else:
        (store / prefix).mkdir(parents=True)
        rel = prefix[len("confidential/synth/"):]
        for entry in manifest["files"]:
            if entry["path"].startswith(src + "/"):
                folder, name = entry["path"].rsplit("/", 2)[1:]
                os.link(census / entry["path"], store / prefix / f"{folder}-{name}")
                entry["path"] = f"{rel}{folder}-{name}"
    root.mkdir(parents=True, exist_ok=True)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _mb(metrics: dict[str, Any]) -> dict[str, Any]:
    return {"rss_start_mb": round(metrics["rss_start_bytes"] / 2**20),
            "peak_rss_mb": round(metrics["peak_rss_bytes"] / 2**20),
            "stage_peak_mb": round((metrics["peak_rss_bytes"] - metrics["rss_start_bytes"]) / 2**20)}


def one(persons: int, states: list[str], work: Path, product: str = "phsafe",
        states_only: bool = False) -> dict[str, Any]:
    spec = PRODUCTS[product]
    layouts: tuple[str, str] = spec["layouts"]
    census = work / "census"
    formats = (layouts[1],) if "parquet" in spec else layouts
    run_child("synth", json.dumps([persons, states, formats, str(census)]))
    generated = json.loads((census / "manifest.json").read_text())
    per_state = {s: int(v["persons"]) for s, v in generated["states"].items()}
    result: dict[str, Any] = {"product": product, "persons": persons, "states": len(states)}
    counts = {}
    for layout in layouts[1:] if states_only else layouts:
        store = work / layout
        if "parquet" in spec:
            link_parquet_store(census, store, product, layout, states)
        else:
            public_file, public_key = spec["public"]
            root = store / "confidential/synth"
            root.mkdir(parents=True)
            os.link(census / "manifest.json", root / "manifest.json")
            shutil.copytree(census / layout, root / layout, copy_function=os.link,
                            ignore=shutil.ignore_patterns(public_file))
            (store / public_key).parent.mkdir(parents=True)
            os.link(census / layout / public_file, store / public_key)
        cfg = work / f"{layout}.json"
        cfg.write_text(json.dumps(release_config(store, layout, states, product)))
        run_child("validate", cfg)
        plan = run_child("plan", cfg)
        rec = run_child("preprocess", cfg)
        m = rec["metrics"]
        counts[layout] = rec["counts"]
        result[layout] = {"partitions": rec["partitions"], "wall_s": round(m["wall_seconds"], 2),
                          "cpu_s": round(m["cpu_seconds"], 2), **_mb(m),
                          "plan": {"cpu_s": round(plan["cpu_seconds"], 2), **_mb(plan)}}
        shutil.rmtree(store)
    result["largest_state_persons"] = max(per_state.values())
    if not states_only:
        result["prepared_identical_totals"] = counts[layouts[0]] == counts[layouts[1]]
    shutil.rmtree(census)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--product", choices=sorted(PRODUCTS), default="phsafe")
    ap.add_argument("--persons", type=int, nargs="+", default=[1_000_000, 3_000_000])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--states-only", action="store_true", help="the per-state layout only")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    from dasflow.synth.reference import states as all_states

    every = sorted(s for s in all_states() if s != "72")
    rows = []
    for persons in args.persons:
        for states in (EIGHT, every):
            with tempfile.TemporaryDirectory(prefix="dasflow-partitions-") as tmp:
                row = one(persons, states, Path(tmp), args.product, args.states_only)
            print(json.dumps(row), flush=True)
            rows.append(row)
    name = "partitions.json" if args.product == "phsafe" else f"partitions_{args.product.replace('-', '_')}.json"
    out: Path = args.out or Path(__file__).parent / "results" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
