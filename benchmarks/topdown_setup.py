"""TopDown post-processing's per-task setup on a national spine, and the NMF answer-vector encodings (issue #20,
session 17).

Builds the synthetic census's public block geography alone for ``--persons`` (no persons: ``build_state_geography``
per state, the GRF-C columns the TopDown plugin reads) and the optimised spine from it, then measures, side by side
in one process:

* **partitioner setup**: what a fresh ``PartitionedTopDown`` derives from the spine before it can solve a part
  (parts layout, the combine part's depth, each deep level's segment placement) — the cost every batch of parts paid
  before a worker kept one partitioner per context — against the same calls on the kept object;
* **families**: ``Spine.families(level)`` (children by parent) built, against the memoized call, per level — what
  every solved part paid before the memo;
* **encodings** of one TopDown-sized segment (``--units`` × 2,016 noisy int16 answers, a list column), and of the
  real NMF segments ``--nmf`` names (e.g. a kept national run's block-level segments): delta (DELTA_BINARY_PACKED,
  uncompressed: the ledger's choice since session 20), dictionary + ZSTD (before), byte-stream-split + ZSTD, plain
  + ZSTD — encode and decode CPU seconds (the least of ``--repeat``; decoding single-threaded, as in a worker) and
  bytes. ``--encodings-only`` skips the spine.

    .venv/bin/python benchmarks/topdown_setup.py --persons 331e6 --out benchmarks/results/topdown_setup_331m.json
    .venv/bin/python benchmarks/topdown_setup.py --encodings-only --repeat 5 \
        --nmf '<kept-run dir>/national-*/store/runs/*/measurements/topdown/block/detailed/seg=*.parquet'
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dasflow.products.topdown.partitioned import PartitionedTopDown  # noqa: E402
from dasflow.products.topdown.plugin import GEOGRAPHY_COLUMNS, TopDownPlugin  # noqa: E402
from dasflow.synth.dataset import apportion, parse_states  # noqa: E402
from dasflow.synth.geography import build_state_geography  # noqa: E402
from dasflow.synth.writers import grfc_columns  # noqa: E402

SEED = 20201


def _cpu(fn: Any, repeat: int = 3) -> float:
    """Best of ``repeat`` CPU-second timings of ``fn()``."""
    best = float("inf")
    for _ in range(repeat):
        c0 = time.process_time()
        fn()
        best = min(best, time.process_time() - c0)
    return round(best, 4)


def national_blocks(persons: int) -> pd.DataFrame:
    states = parse_states(None)
    counts = apportion(persons, states)
    frames = []
    for s in states:
        columns = grfc_columns(build_state_geography(s, counts[s], SEED))
        frames.append(pd.DataFrame({k: v.to_pandas() for k, v in columns.items()}))
    blocks = pd.concat(frames, ignore_index=True)
    return blocks[[c for c in blocks.columns if c in GEOGRAPHY_COLUMNS]]


def setup(persons: int) -> dict[str, Any]:
    plugin = TopDownPlugin()
    cfg = plugin.load_config((ROOT / "dasflow/demo_data/topdown-config.json").read_text(), "US")
    product = plugin.product(cfg)
    c0 = time.process_time()
    spine = product.spine({"blocks": national_blocks(persons)})
    built = time.process_time() - c0
    public = {"spine": spine}
    product.segmentation(spine)  # cached on the product (one per worker) before and after the change

    def derive(split: PartitionedTopDown) -> None:
        sp, lay = split._layout(public)
        for level in range(split._whole(sp, lay.a) + 1, sp.n_levels):
            split._placement(sp, lay, level)

    kept = PartitionedTopDown(product)
    derive(kept)
    out: dict[str, Any] = {
        "blocks": int(spine.n_units(spine.n_levels - 1)), "units": [spine.n_units(l) for l in range(spine.n_levels)],
        "spine_cpu_s": round(built, 1),
        "partitioner_fresh_cpu_s": _cpu(lambda: derive(PartitionedTopDown(product))),
        "partitioner_kept_cpu_s": _cpu(lambda: derive(kept)),
        "families": {},
    }
    for level in range(1, spine.n_levels):
        fresh = _cpu(lambda level=level: (spine.__dict__.pop("_family_memo", None), spine.families(level)))
        memo = _cpu(lambda level=level: spine.families(level))
        out["families"][spine.levels[level]] = {"built_cpu_s": fresh, "memoized_cpu_s": memo}
    return out


#: Parquet options per encoding of the answer vectors (``NOISY.list.element``); the other columns as the ledger
#: writes them (``encode_nmf``: LZ4, dictionaries for text, a delta-encoded UNIT)
def _options(columns: list[str]) -> dict[str, dict[str, Any]]:
    lz4 = {c: "lz4" for c in columns if c != "NOISY"}
    text = [c for c in columns if c not in ("NOISY", "UNIT")]
    delta = {"UNIT": "DELTA_BINARY_PACKED"}

    def vec(codec: str, encoding: str | None) -> dict[str, Any]:
        return {"compression": {**lz4, "NOISY.list.element": codec}, "write_statistics": ["UNIT"],
                "use_dictionary": text + ([] if encoding else ["NOISY.list.element"]),
                "column_encoding": {**delta, **({"NOISY.list.element": encoding} if encoding else {})}}

    return {"delta (ledger)": vec("none", "DELTA_BINARY_PACKED"),
            "dictionary+zstd (ledger before session 20)": vec("zstd", None),
            "byte-stream-split+zstd": vec("zstd", "BYTE_STREAM_SPLIT"),
            "plain+zstd": vec("zstd", "PLAIN")}


def _measure(tables: list[pa.Table], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, kw in _options(tables[0].column_names).items():
        datas = []
        for table in tables:
            buf = io.BytesIO()
            pq.write_table(table, buf, **kw)
            datas.append(buf.getvalue())
        out[name] = {
            "encode_cpu_s": _cpu(lambda kw=kw: [pq.write_table(t, io.BytesIO(), **kw) for t in tables], repeat),
            "decode_cpu_s": _cpu(lambda datas=datas: [pq.read_table(io.BytesIO(d), use_threads=False) for d in datas],
                                 repeat),
            "bytes": sum(len(d) for d in datas)}
    return out


def encodings(units: int, cells: int = 2016, repeat: int = 3) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    vals = np.rint(rng.normal(0, 60, (units, cells))).astype(np.int16)
    vals[:, :100] += rng.integers(0, 50, (units, 100)).astype(np.int16)  # a few larger true counts
    offsets = pa.array(np.arange(0, units * cells + 1, cells, dtype=np.int32))
    table = pa.table({"UNIT": np.arange(units, dtype=np.int64),
                      "NOISY": pa.ListArray.from_arrays(offsets, pa.array(vals.reshape(-1)))})
    return {"units": units, "cells": cells, **_measure([table], repeat)}


def nmf_encodings(pattern: str, repeat: int) -> dict[str, Any]:
    """The encodings on real NMF segments (their columns as stored, schema metadata dropped)."""
    files = sorted(glob.glob(pattern))
    if not files:
        raise SystemExit(f"no NMF segment matches {pattern}")
    tables = [pq.read_table(f).replace_schema_metadata(None) for f in files]
    return {"files": len(files), "units": sum(t.num_rows for t in tables),
            "answers": sum(len(t.column("NOISY").combine_chunks().values) for t in tables),
            **_measure(tables, repeat)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=float, default=331e6)
    ap.add_argument("--units", type=int, default=25_000, help="units of the encoded segment")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--nmf", default=None, help="glob of real NMF segment files to encode as well")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--encodings-only", action="store_true", help="skip the spine setup measurements")
    args = ap.parse_args()
    result: dict[str, Any] = {"benchmark": "topdown_setup", "persons": int(args.persons)}
    if not args.encodings_only:
        result["setup"] = setup(int(args.persons))
    result["encodings"] = encodings(args.units, repeat=args.repeat)
    if args.nmf:
        result["nmf_encodings"] = nmf_encodings(args.nmf, args.repeat)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
