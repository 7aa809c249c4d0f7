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
* **encodings** of one TopDown-sized segment (``--units`` × 2,016 noisy int16 answers, a list column): dictionary
  + ZSTD (the ledger's choice), byte-stream-split + ZSTD, plain + ZSTD — encode and decode CPU seconds and bytes.

    .venv/bin/python benchmarks/topdown_setup.py --persons 331e6 --out benchmarks/results/topdown_setup_331m.json
"""

from __future__ import annotations

import argparse
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


def encodings(units: int, cells: int = 2016) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    vals = np.rint(rng.normal(0, 60, (units, cells))).astype(np.int16)
    vals[:, :100] += rng.integers(0, 50, (units, 100)).astype(np.int16)  # a few larger true counts
    offsets = pa.array(np.arange(0, units * cells + 1, cells, dtype=np.int32))
    table = pa.table({"UNIT": np.arange(units, dtype=np.int64),
                      "NOISY": pa.ListArray.from_arrays(offsets, pa.array(vals.reshape(-1)))})
    base = {"compression": {"UNIT": "lz4", "NOISY.list.element": "zstd"}}
    options = {
        "dictionary+zstd (ledger)": {**base, "use_dictionary": ["NOISY.list.element"],
                                     "column_encoding": {"UNIT": "DELTA_BINARY_PACKED"}},
        "byte-stream-split+zstd": {**base, "use_dictionary": False, "column_encoding": {
            "UNIT": "DELTA_BINARY_PACKED", "NOISY.list.element": "BYTE_STREAM_SPLIT"}},
        "plain+zstd": {**base, "use_dictionary": False, "column_encoding": {
            "UNIT": "DELTA_BINARY_PACKED", "NOISY.list.element": "PLAIN"}},
    }
    out: dict[str, Any] = {"units": units, "cells": cells}
    for name, kw in options.items():
        buf = io.BytesIO()
        pq.write_table(table, buf, **kw)
        data = buf.getvalue()
        out[name] = {"encode_cpu_s": _cpu(lambda kw=kw: pq.write_table(table, io.BytesIO(), **kw)),
                     "decode_cpu_s": _cpu(lambda data=data: pq.read_table(io.BytesIO(data))),
                     "bytes": len(data)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--persons", type=float, default=331e6)
    ap.add_argument("--units", type=int, default=25_000, help="units of the encoded segment")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = {"benchmark": "topdown_setup", "persons": int(args.persons), "setup": setup(int(args.persons)),
              "encodings": encodings(args.units)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
