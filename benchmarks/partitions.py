"""Partitioned preprocessing (issue #20 item 2): PHSafe's preprocess stage on one national pair of input files
vs one folder per state, peak memory against the number of states.

    .venv/bin/python benchmarks/partitions.py [--persons 1000000 3000000] [--out benchmarks/results/partitions.json]

For each total of persons and each state set (the 8 most populous states; all 51), one synthetic census is
generated in both PHSafe layouts (``phsafe``: national ``persons.csv`` / ``units.csv``; ``phsafe_states``: one
folder per state) and hard-linked into one store per layout. Validation runs in its own process (not
measured); the preprocess stage then runs in a fresh process per layout, and its stage manifest's metrics give
wall, CPU, the process RSS before the stage and its peak (``ru_maxrss``). Reported with the persons of the
largest state, which bounds the partitioned peak: the national layout's peak grows with the total, the
partitioned one's with the largest state. Prepared tables are checked identical between the layouts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: the 8 most populous states (2020): CA TX FL NY PA IL OH GA
EIGHT = ["06", "48", "12", "36", "42", "17", "39", "13"]


def release_config(store_dir: Path, layout: str, states: list[str]) -> dict[str, Any]:
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath("phsafe-us-config.json").read_text())
    return {"release_id": "bench", "universe": "US", "store": str(store_dir),
            "inputs": {"phsafe": f"confidential/synth/{layout}/", "phsafe_geo": "public/phsafe/"},
            "products": [{"name": "phsafe", "config_text": json.dumps(cfg)}], "cap": {"rho": "2"},
            "rng": {"mode": "test", "seed": 1}}


def child(mode: str, config_path: str) -> None:
    """In a fresh process: ``validate`` (not measured) or ``preprocess`` (prints its stage manifest)."""
    from dasflow.config import parse_release_config
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    ctx = freeze_config(parse_release_config(json.loads(Path(config_path).read_text())))
    if mode == "validate":
        stages.validate_stage(ctx, "phsafe")
        return
    manifest = stages.preprocess_stage(ctx, "phsafe")
    prepared = stages.load_prepared(ctx, "phsafe")
    digest = {name: int(prepared[name]["COUNT"].astype("int64").sum()) for name in prepared}
    print(json.dumps({"metrics": manifest["metrics"], "partitions": len(manifest.get("partitions", [])),
                      "counts": digest}))


def run_child(mode: str, config_path: Path) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", mode, str(config_path)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.splitlines()[-1]) if mode == "preprocess" else {}


def one(persons: int, states: list[str], work: Path) -> dict[str, Any]:
    from dasflow import synth

    census = work / "census"
    manifest = synth.generate(census, persons=persons, seed=7, states=states, formats=("phsafe", "phsafe_states"))
    per_state = {s: int(v["persons"]) for s, v in manifest.data["states"].items()}
    result: dict[str, Any] = {"persons": persons, "states": len(states)}
    counts = {}
    for layout in ("phsafe", "phsafe_states"):
        store = work / layout
        root = store / "confidential/synth"
        root.mkdir(parents=True)
        os.link(census / "manifest.json", root / "manifest.json")
        shutil.copytree(census / layout, root / layout, copy_function=os.link,
                        ignore=shutil.ignore_patterns("geo.csv"))
        (store / "public/phsafe").mkdir(parents=True)
        os.link(census / layout / "geo.csv", store / "public/phsafe/geo.csv")
        cfg = work / f"{layout}.json"
        cfg.write_text(json.dumps(release_config(store, layout, states)))
        run_child("validate", cfg)
        rec = run_child("preprocess", cfg)
        m = rec["metrics"]
        counts[layout] = rec["counts"]
        result[layout] = {"partitions": rec["partitions"], "wall_s": round(m["wall_seconds"], 2),
                          "cpu_s": round(m["cpu_seconds"], 2), "rss_start_mb": round(m["rss_start_bytes"] / 2**20),
                          "peak_rss_mb": round(m["peak_rss_bytes"] / 2**20),
                          "stage_peak_mb": round((m["peak_rss_bytes"] - m["rss_start_bytes"]) / 2**20)}
        shutil.rmtree(store)
    result["largest_state_persons"] = max(per_state.values())
    result["prepared_identical_totals"] = counts["phsafe"] == counts["phsafe_states"]
    shutil.rmtree(census)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=int, nargs="+", default=[1_000_000, 3_000_000])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results/partitions.json")
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
                row = one(persons, states, Path(tmp))
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
