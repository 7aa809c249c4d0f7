"""Streamed validation's distinct-value fold at national cardinality (issue #20, session 16): the person GEOIDs
of a census folded chunk after chunk, ``DistinctFold`` against the ``merge_parts`` fold it replaced, side by side
in one process on the same chunks.

The column is built like the synthetic census's TopDown person files: ``--blocks`` 15-digit block GEOIDs in
state/county order, ``--chunks`` chunks of ``--chunk-rows`` persons, each chunk's persons drawn from a window of
consecutive blocks that moves through the nation (files are written state by state, so a chunk holds the blocks
of one or two states' stretch, and every block appears once the last chunk is in). Reports CPU seconds of each
fold in all and per chunk late in the file, and checks both folds give the same values in the same order.

    .venv/bin/python benchmarks/validation_fold.py --blocks 2440000 --chunks 100      # a 100 M-person census
    .venv/bin/python benchmarks/validation_fold.py --blocks 8070000 --chunks 331 --old-chunks 120
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dasflow.validation.domain import domain_parts, merge_parts  # noqa: E402
from dasflow.validation.stream import DistinctFold  # noqa: E402


def chunks(blocks: int, n_chunks: int, rows: int, seed: int) -> list[pa.Array]:
    rng = np.random.default_rng(seed)
    geoids = np.char.zfill(np.sort(rng.choice(10**14, blocks, replace=False) + 10**14 // 2).astype(str), 15)
    span = blocks / n_chunks
    out = []
    for i in range(n_chunks):
        lo = int(i * span)
        hi = max(lo + 1, int((i + 1) * span))
        idx = np.concatenate([np.arange(lo, hi), rng.integers(lo, hi, max(0, rows - (hi - lo)))])
        out.append(pa.array(geoids[idx].astype(object), type=pa.string()))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--blocks", type=int, default=2_440_000)
    ap.add_argument("--chunks", type=int, default=100)
    ap.add_argument("--chunk-rows", type=int, default=1_000_000)
    ap.add_argument("--old-chunks", type=int, default=None,
                    help="fold only this many chunks the old way (its cost grows with the values seen; the new "
                         "fold always does every chunk), compared on those chunks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    data = chunks(args.blocks, args.chunks, args.chunk_rows, 7)
    new = DistinctFold()
    new_cpu = []
    for c in data:
        t0 = time.process_time()
        new.add(c)
        new_cpu.append(time.process_time() - t0)
    n_old = args.chunks if args.old_chunks is None else args.old_chunks
    old: dict[str, pd.Series] = {}
    old_cpu = []
    for c in data[:n_old]:
        t0 = time.process_time()
        old = merge_parts(old, domain_parts({"v": c}))
        old_cpu.append(time.process_time() - t0)
    if n_old == args.chunks:
        pd.testing.assert_series_equal(new.series(), old["v"].reset_index(drop=True))
    result = {"blocks": args.blocks, "chunks": args.chunks, "chunk_rows": args.chunk_rows,
              "distinct": len(new.series()), "new_cpu_s": round(sum(new_cpu), 2),
              "new_last_chunk_cpu_s": round(new_cpu[-1], 3), "old_chunks": n_old,
              "old_cpu_s": round(sum(old_cpu), 2), "new_cpu_s_same_chunks": round(sum(new_cpu[:n_old]), 2),
              "old_last_chunk_cpu_s": round(old_cpu[-1], 3), "same_values": n_old == args.chunks}
    print(json.dumps(result, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
