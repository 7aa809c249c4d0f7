"""TopDown's public spine at national size (issue #20 item 2): CPU and peak RSS of reading GRF-C and building the
optimised spine, before and after a change, side by side.

    .venv/bin/python benchmarks/topdown_spine.py [--persons 331.4e6] [--before-tree DIR] [--stored] [--out FILE]

The public block geography of the 50 states and DC (the synthetic census's GRF-C, no persons: ≈ 8.1 M blocks at
331.4 M persons) is written once; then, per code tree, a fresh process reads it as ``public_inputs`` does and
builds the spine of the demo's TopDown config (``TopDown.spine``: AIAN spine, optimised block groups, OSED,
Pareto move), then lists the measurement segments and post-processing parts. Every TopDown process of a release
(validation, preprocess, measure, post-processing workers, release) builds this spine, so its peak is a floor
under every one of them. ``DIR`` holds the code before the change (``git archive d0a62d6 | tar -x -C DIR``).

``--stored``: the plan stage stores the spine it built and every later TopDown process loads it
(``spine_from_bytes``, privacy invariant re-checked) instead of building it; the "loaded" row is such a process,
and its ``copy_cpu_s`` what a plan stage spends to freeze the spine its validation stored instead of building it
(hash, read, hash, write, frozen read: ``stages.validated_derived``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def write_geography(path: Path, persons: int, seed: int = 2020) -> int:
    """The GRF-C of every state at ``persons`` (apportioned as the synthetic census does); its block count."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from dasflow.synth.dataset import apportion
    from dasflow.synth.geography import build_state_geography
    from dasflow.synth.reference import states
    from dasflow.synth.writers import grfc_columns

    nation = [s for s in sorted(states()) if s != "72"]
    per = apportion(persons, nation)
    table = pa.concat_tables([pa.table(grfc_columns(build_state_geography(s, per[s], seed))) for s in nation])
    pacsv.write_csv(table, path, pacsv.WriteOptions(delimiter="|", quoting_style="none"))
    return int(table.num_rows)


def child(path: str, stored: str | None = None, load: bool = False) -> None:
    """In a fresh process (the tree under test first on ``sys.path``): read, build (or ``load`` the spine stored
    at ``stored``, as every stage after the plan does), plan; one JSON line. With ``stored`` and not ``load``: also
    time writing the built spine there (``spine_bytes``, what the plan stage stores)."""
    import io
    import resource
    import time
    from importlib import resources

    import pandas as pd

    from dasflow.products.topdown.partitioned import PartitionedTopDown
    from dasflow.products.topdown.plugin import parse_topdown_config
    from dasflow.products.topdown.product import TopDown
    from dasflow.products.topdown.spine import GEOGRAPHY_COLUMNS

    def peak() -> int:
        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

    text = resources.files("dasflow.demo_data").joinpath("topdown-config.json").read_text()
    cfg = parse_topdown_config(json.loads(text))
    out: dict[str, Any] = {"start_mb": peak()}
    t = time.process_time()
    grfc = pd.read_csv(io.BytesIO(Path(path).read_bytes()), sep="|", dtype=str)
    blocks = grfc[[c for c in grfc.columns if c in GEOGRAPHY_COLUMNS]]
    del grfc
    out.update(read_cpu_s=round(time.process_time() - t, 1), read_peak_mb=peak())
    product = TopDown(cfg)
    t = time.process_time()
    if load:
        import shutil
        import tempfile

        from dasflow.io.store import LocalStore, sha256_bytes
        from dasflow.products.topdown.spine import spine_from_bytes

        # the plan stage's copy of the spine its validation stored (``stages.validated_derived``): the
        # manifest's hash of it, then read, hash, write under derived/ (the write hashes), then the frozen read
        root = tempfile.mkdtemp(prefix="spine-copy-")
        try:
            store = LocalStore(root)
            store.put("validation/spine.npz", Path(str(stored)).read_bytes())
            t = time.process_time()
            store.sha256("validation/spine.npz")
            data = store.get("validation/spine.npz")
            sha256_bytes(data)
            store.put("derived/spine.npz", data)
            del data
            data = store.get("derived/spine.npz")
            sha256_bytes(data)
            out.update(copy_cpu_s=round(time.process_time() - t, 1))
        finally:
            shutil.rmtree(root, ignore_errors=True)
        t = time.process_time()
        sp = product.spine({"blocks": blocks, "spine": spine_from_bytes(data, "spine")})
        del data
    else:
        sp = product.spine({"blocks": blocks})
    out.update(spine_cpu_s=round(time.process_time() - t, 1), spine_peak_mb=peak(),
               units=[sp.n_units(level) for level in range(sp.n_levels)])
    if stored and not load:
        from dasflow.products.topdown.spine import spine_bytes

        t = time.process_time()
        data = spine_bytes(sp)
        Path(stored).write_bytes(data)
        out.update(store_cpu_s=round(time.process_time() - t, 1), stored_mb=round(len(data) / 2**20, 1))
        del data
    t = time.process_time()
    steps = PartitionedTopDown(product).post_steps({"blocks": blocks, "spine": sp})
    out.update(plan_cpu_s=round(time.process_time() - t, 1), segments=len(product.segmentation(sp).ids),
               post_parts=max(len(s.parts) for s in steps), peak_mb=peak())
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--persons", type=float, default=331.4e6)
    ap.add_argument("--before-tree", default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--stored", action="store_true",
                    help="also store the built spine and load it in a further fresh process (as later stages do)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--spine-file", help=argparse.SUPPRESS)
    ap.add_argument("--load", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.environ["DASFLOW_TREE"])
        child(args.child, args.spine_file, args.load)
        return
    sys.path.insert(0, str(REPO))
    trees = {"after": str(REPO)}
    if args.before_tree:
        trees = {"before": str(Path(args.before_tree).resolve()), **trees}
    row: dict[str, Any] = {"persons": int(args.persons)}
    with tempfile.TemporaryDirectory(prefix="td-spine-") as tmp:
        path = Path(tmp) / "GRF-C.txt"
        row["blocks"] = write_geography(path, int(args.persons))
        runs: list[tuple[str, str, list[str]]] = [(mode, tree, []) for mode, tree in trees.items()]
        if args.stored:
            spine_file = str(Path(tmp) / "spine.npz")
            runs[-1] = ("after", str(REPO), ["--spine-file", spine_file])
            runs.append(("loaded", str(REPO), ["--spine-file", spine_file, "--load"]))
        for mode, tree, extra in runs:
            env = {**os.environ, "DASFLOW_TREE": tree, "PYTHONPATH": tree}
            done = subprocess.run([sys.executable, __file__, "--child", str(path), *extra], capture_output=True,
                                  text=True, env=env)
            if done.returncode:
                raise SystemExit(f"{mode}: {done.stderr[-2000:]}")
            row[mode] = json.loads(done.stdout.splitlines()[-1])
            print(mode, json.dumps(row[mode]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"benchmark": "topdown_spine", **row}, indent=1) + "\n")


if __name__ == "__main__":
    main()
