"""TopDown's confidential side per state (issue #20, H1): preprocess and measure peak RSS before and after.

    .venv/bin/python benchmarks/topdown_partitions.py --before-tree DIR [--persons 1000000 3000000]
        [--out benchmarks/results/topdown_partitions.json]

``DIR`` holds the code before this change (``git archive 3f576d6 | tar -x -C DIR``: TopDown prepared and
measured the nation in one pass, one dense array per key). Per size, one synthetic census of the 50 states and
DC (``topdown`` format: ``persons/{SS}/part-*.parquet``) and one of the 8 most populous states with the same
persons per state (the 51-state census's persons of those states: the largest state is the same), in one store;
per code version (``before``: one pass, whole keys; ``after``: one state partition at a time, keys below the state
level drawn per state into segmented NMFs) a release of the demo's TopDown config: validate + plan in one process
(not measured), then preprocess and measure each in a fresh process. Reported from the stage manifests'
metrics: CPU seconds, the process's peak RSS (interpreter, imports and the public spine included) and the
stage's own growth above its starting RSS.
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, os.environ.get("DASFLOW_TREE", str(REPO)))

#: the 8 most populous states (2020): CA TX FL NY PA IL OH GA
EIGHT = ["06", "48", "12", "36", "42", "17", "39", "13"]
SEED = 2020


def release_config(store: Path, release_id: str, segment_blocks: int = 1) -> dict[str, Any]:
    """The demo's TopDown config on ``store`` (``segment_blocks`` 1: every county its own segment, the smallest
    measurement segments; a state's partition is still read whole per segment)."""
    cfg = json.loads(resources.files("dasflow.demo_data").joinpath("topdown-config.json").read_text())
    cfg["segment_blocks"] = segment_blocks
    return {"release_id": release_id, "universe": "US", "store": str(store),
            "inputs": {"topdown": "confidential/synth/topdown/persons/", "topdown_public": "public/topdown/"},
            "products": [{"name": "topdown", "config_text": json.dumps(cfg)}], "cap": {"rho": "100"},
            "rng": {"mode": "test", "seed": 1}}


def child(stage: str, config_path: str) -> None:
    """In a fresh process: ``setup`` (validate + plan, not measured), ``preprocess``, ``measure`` or
    ``postprocess`` (every part in this process, in plan order)."""
    from dasflow.config import parse_release_config
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import freeze_config

    ctx = freeze_config(parse_release_config(json.loads(Path(config_path).read_text())))
    if stage == "setup":
        stages.validate_stage(ctx, "topdown")
        stages.plan_stage(ctx)
        return
    record = {"preprocess": stages.preprocess_stage, "measure": stages.measure_stage,
              "postprocess": stages.postprocess_stage}[stage](ctx, "topdown")
    manifest = json.loads(ctx.store.get(f"{ctx.root}/manifests/{stage}/topdown.json"))
    nmfs = [k for k in ctx.store.list(f"{ctx.root}/measurements/") if k.endswith(".parquet")]
    print(json.dumps({"metrics": manifest["metrics"], "partitions": len(manifest.get("partitions", [])),
                      "drawn": record.get("drawn_now"), "objects": len(nmfs)}))


def run_child(stage: str, config_path: Path, tree: str) -> dict[str, Any]:
    env = {**os.environ, "DASFLOW_TREE": tree, "PYTHONPATH": tree}
    out = subprocess.run([sys.executable, __file__, "--child", stage, str(config_path)], capture_output=True,
                         text=True, env=env)
    if out.returncode:
        raise RuntimeError(f"{stage} ({tree}): {out.stderr[-3000:]}")
    return json.loads(out.stdout.splitlines()[-1]) if stage != "setup" else {}


def census(store: Path, persons: int, states: list[str]) -> dict[str, int]:
    from dasflow import synth

    root = store / "confidential/synth"
    manifest = synth.generate(root, persons=persons, seed=SEED, states=states, formats=("topdown",))
    public = store / "public/topdown"
    public.mkdir(parents=True)
    for name in ("GRF-C.txt", "block_facts.csv", "invariants.json"):
        os.replace(root / "topdown/public" / name, public / name)
    return {s: int(v["persons"]) for s, v in manifest.data["states"].items()}


def one(persons: int, states: list[str], trees: dict[str, str], work: Path) -> dict[str, Any]:
    store = work / "store"
    per_state = census(store, persons, states)
    row: dict[str, Any] = {"persons": sum(per_state.values()), "states": len(states),
                           "largest_state_persons": max(per_state.values()), "per_state": per_state}
    for mode, tree in trees.items():
        cfg = work / f"{mode}.json"
        cfg.write_text(json.dumps(release_config(store, mode)))
        run_child("setup", cfg, tree)
        for stage in ("preprocess", "measure"):
            rec = run_child(stage, cfg, tree)
            m = rec["metrics"]
            row[f"{mode}_{stage}"] = {
                "cpu_s": round(m["cpu_seconds"], 2), "wall_s": round(m["wall_seconds"], 2),
                "peak_rss_mb": round(m["peak_rss_bytes"] / 2**20),
                "stage_peak_mb": round((m["peak_rss_bytes"] - m["rss_start_bytes"]) / 2**20),
                **({"partitions": rec["partitions"]} if stage == "preprocess" else {"nmf_objects": rec["objects"]})}
        shutil.rmtree(store / "runs" / mode)
    shutil.rmtree(store)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before-tree", help="a checkout of the code before this change (required)")
    ap.add_argument("--persons", type=int, nargs="+", default=[1_000_000, 3_000_000])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    from dasflow.synth.reference import states as synth_states

    nation = [s for s in sorted(synth_states()) if s != "72"]
    trees = {"before": str(Path(args.before_tree).resolve()), "after": str(REPO)}
    rows = []
    for persons in args.persons:
        with tempfile.TemporaryDirectory(prefix="td-parts-") as tmp:
            row51 = one(persons, nation, trees, Path(tmp))
        print(json.dumps({k: v for k, v in row51.items() if k != "per_state"}), flush=True)
        rows.append(row51)
        # the 8 largest states with the persons they hold in the 51-state census (same persons per state)
        eight = sum(n for s, n in row51.pop("per_state").items() if s in EIGHT)
        with tempfile.TemporaryDirectory(prefix="td-parts-") as tmp:
            row8 = one(eight, EIGHT, trees, Path(tmp))
        row8.pop("per_state")
        print(json.dumps(row8), flush=True)
        rows.append(row8)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "topdown_partitions", "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
