"""A product's partitioned preprocess on a kept national run, this tree against another checkout, side by side.

    .venv/bin/python benchmarks/national.py --persons 10e6 --production --lanes 2 --dask-workers 2 --keep \\
        --workdir <kept-run dir>
    git worktree add --detach <worktree> <rev>
    .venv/bin/python benchmarks/kept_prepare.py --workdir <kept-run dir> --other <worktree> --product safetab-p \\
        --repeat 2 --out benchmarks/results/kept_prepare_safetab_p_session22.json

Every partition of the product (``plugin.partitions``) is read and prepared again (``partition_inputs`` then
``prepare``, as ``preprocess_stage`` does) in one fresh process per (tree, repeat), in partition order, with the
code of the tree under test only; nothing is written. Reported per run: user and system CPU seconds and wall
seconds of the partitions (the context and the public inputs are built before the clock starts), and a digest
of every prepared frame (name, columns, dtypes and values, in partition order), which must agree between the
trees when a change is meant to keep the prepared data (only "identical" is kept: a digest of exact counts is
confidential-derived, so it is dropped from the result). The least CPU over ``--repeat`` runs is the figure.

``--grfc-persons N`` (SafeTab-P's geography at national size, no kept run needed): the synthetic census's
public GRF-C of the 50 states and DC at N persons (≈ 8.1 M blocks at 331.4 M) is written once; per tree, a
fresh process builds the run's ``LazyGeography`` (its region IDs: ``region_ids_cpu``; every SafeTab-P process
builds it) and then, on the clock, takes every state's partition geography (``part``) in turn, as the
partitions of one SafeTab-P preprocess do; digest of every partition's block keys and region indices.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE))

from benchmarks import side_by_side  # noqa: E402  (after the repository is on the path)

# Runs inside a fresh interpreter with the tree under test first on sys.path (argv: tree, workdir, product).
CHILD = r'''
import glob, hashlib, json, resource, sys, time
from pathlib import Path
tree, workdir, product = sys.argv[1:4]
sys.path.insert(0, tree); sys.path.insert(0, tree + "/benchmarks")
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
import national
import pandas as pd
run = glob.glob(workdir + "/national-*")[0]
ctx = national._context(Path(run, "config.json"))
plugin, cfg = ctx.plugin(product), ctx.product_config(product)
public = ctx.post_public(product)
parts = plugin.partitions(ctx.store, ctx.config.inputs, public, cfg)
digest = hashlib.sha256()
r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
for part in parts:
    prepared = plugin.product(cfg).prepare(plugin.partition_inputs(ctx.store, ctx.config.inputs, cfg, part), public)
    for name, frame in prepared.items():
        digest.update(f"{part}/{name}/{list(frame.columns)}/{list(map(str, frame.dtypes))}".encode())
        digest.update(pd.util.hash_pandas_object(frame, index=False).to_numpy().tobytes())
    del prepared
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
print(json.dumps({"run": Path(run).name, "partitions": len(parts), "user": round(r1.ru_utime - r0.ru_utime, 2),
                  "sys": round(r1.ru_stime - r0.ru_stime, 2), "wall": round(wall, 2),
                  "peak_rss_bytes": r1.ru_maxrss * 1024, "digest": digest.hexdigest()}))
'''

# argv: tree, GRF-C path
GEOGRAPHY = r'''
import hashlib, json, resource, sys, time
tree, grfc = sys.argv[1:3]
sys.path.insert(0, tree)
import dasflow
assert dasflow.__file__.startswith(tree), dasflow.__file__
import numpy as np
from dasflow.products.safetab_p.records import LazyGeography
b0 = resource.getrusage(resource.RUSAGE_SELF)
geo = LazyGeography(grfc, "US", ())  # the region IDs: every SafeTab-P process builds this
b1 = resource.getrusage(resource.RUSAGE_SELF)
states = sorted(int(k) for k in geo.region_ids["STATE"])
digest = hashlib.sha256()
r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
blocks = 0
for state in states:
    part = geo.part([state])
    blocks += len(part.block_keys)
    digest.update(part.block_keys.tobytes())
    for rt in sorted(part.region_of):
        digest.update(rt.encode() + np.asarray(part.region_of[rt], dtype=np.int64).tobytes())
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - w0
print(json.dumps({"run": "grfc", "partitions": len(states), "blocks": blocks,
                  "region_ids_cpu": round(b1.ru_utime + b1.ru_stime - b0.ru_utime - b0.ru_stime, 2),
                  "user": round(r1.ru_utime - r0.ru_utime, 2), "sys": round(r1.ru_stime - r0.ru_stime, 2),
                  "wall": round(wall, 2), "peak_rss_bytes": r1.ru_maxrss * 1024, "digest": digest.hexdigest()}))
'''


def write_grfc(path: Path, persons: int, seed: int = 2020) -> None:
    """The synthetic census's GRF-C of the 50 states and DC at ``persons`` (as the census writes it)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    sys.path.insert(0, str(HERE))
    from dasflow.synth.dataset import apportion
    from dasflow.synth.geography import build_state_geography
    from dasflow.synth.reference import states
    from dasflow.synth.writers import grfc_columns

    nation = [s for s in sorted(states()) if s != "72"]
    per = apportion(persons, nation)
    table = pa.concat_tables([pa.table(grfc_columns(build_state_geography(s, per[s], seed))) for s in nation])
    with path.open("wb") as fh:  # the header unquoted, as the census writes it
        fh.write(("|".join(table.column_names) + "\n").encode())
        pacsv.write_csv(table, fh, pacsv.WriteOptions(delimiter="|", quoting_style="none", include_header=False))


def main() -> int:
    ap = side_by_side.parser(__doc__ or "")
    ap.add_argument("--workdir", type=Path, required=True,
                    help="a national.py --keep workdir (with --grfc-persons: where the GRF-C is written)")
    ap.add_argument("--product", default="safetab-p", help="a partitioned product (safetab-p, phsafe, topdown, …)")
    ap.add_argument("--grfc-persons", type=float, default=0,
                    help="time SafeTab-P's partition geographies on a GRF-C of this many persons instead")
    args = ap.parse_args()
    grfc = None
    if args.grfc_persons:
        grfc = args.workdir / f"GRF-C-{int(args.grfc_persons)}.txt"
        if not grfc.exists():
            write_grfc(grfc, int(args.grfc_persons))

    def run(tree: Path) -> dict[str, Any]:
        if grfc:
            return side_by_side.child(GEOGRAPHY, str(tree), str(grfc))
        return side_by_side.child(CHILD, str(tree), str(args.workdir), args.product)

    result = side_by_side.compare("kept_prepare", args.other, args.repeat, run)
    runs = result["runs"]
    result |= {"product": args.product, "kept_run": runs["this"][0]["run"],  # the kept run by name, no path
               "grfc_persons": int(args.grfc_persons) or None,
               "identical": len({r["digest"] for rs in runs.values() for r in rs}) == 1}
    for r in (r for rs in runs.values() for r in rs):  # a digest of exact (confidential) counts is not kept
        r.pop("digest")
    return side_by_side.finish(result, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
