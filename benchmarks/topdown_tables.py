"""TopDown's release-table aggregation: the string group-by per level against integer-keyed level sums
(``dasflow.products.topdown.product._level_sums``), side by side on the same block rows.

    .venv/bin/python benchmarks/topdown_tables.py --rows 1400000 --repeat 3 \\
        --out benchmarks/results/topdown_tables_session21.json

Block rows as one chunk of ``table_chunks`` holds them (GEOID, cell, count; sorted by GEOID then cell, 15-digit
GEOIDs with several rows per block and several blocks per tract), ``--rows`` of them over ``rows / 4.7`` blocks
(the 10 M national run's block table has 1.41 M rows). Both sides aggregate every standard level below the
nation (state, county, tract, block group, block); their frames must be equal (values, order, dtypes).
Process CPU seconds, the least over ``--repeat``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from dasflow.products.topdown.product import STANDARD_LEVELS, _level_sums

N_CELLS = 2016  # HHGQ 8 × VOTINGAGE 2 × HISPANIC 2 × CENRACE 63


def block_rows(rows: int, seed: int = 21) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    blocks = np.sort(rng.integers(10**13, 6 * 10**13, max(1, int(rows / 4.7))))
    geo, cells = np.sort(rng.choice(blocks, rows)), rng.integers(0, N_CELLS, rows)
    order = np.lexsort((cells, geo))
    return pd.DataFrame({"GEOID": pd.array([f"{g:015d}" for g in geo[order]], dtype="string"),
                         "CELL": cells[order], "COUNT": rng.integers(1, 5, rows)})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_400_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    b = block_rows(args.rows)
    cells, counts = b["CELL"].to_numpy(np.int64), b["COUNT"].to_numpy(np.int64)
    widths = [w for _, w in STANDARD_LEVELS if w]
    best = {"group_by": float("inf"), "level_sums": float("inf")}
    equal = True
    for _ in range(args.repeat):
        t0 = time.process_time()
        grouped = {w: pd.DataFrame({"GEOID": b["GEOID"].str[:w], "CELL": cells, "COUNT": counts})
                   .groupby(["GEOID", "CELL"], sort=True, as_index=False).sum() for w in widths}
        t1 = time.process_time()
        sums = _level_sums(b["GEOID"], cells, counts, N_CELLS)
        t2 = time.process_time()
        equal &= sums is not None and all(grouped[w].equals(sums[w]) and
                                          (grouped[w].dtypes == sums[w].dtypes).all() for w in widths)
        best["group_by"] = min(best["group_by"], round(t1 - t0, 3))
        best["level_sums"] = min(best["level_sums"], round(t2 - t1, 3))
    out = {"benchmark": "topdown_tables", "rows": args.rows, "repeat": args.repeat, "cpu_s": best,
           "ratio_group_by_over_level_sums": round(best["group_by"] / best["level_sums"], 2), "equal": equal}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
