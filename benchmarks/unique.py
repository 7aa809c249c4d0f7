"""``dasflow.io.arrays.unique`` against ``np.unique`` (the installed NumPy), side by side, on the shapes the stages
hand it: distinct sorted MAFIDs (a state's units), distinct shuffled keys, keys with repeats, few distinct codes,
and text region IDs.

    .venv/bin/python benchmarks/unique.py [--size 4000000] [--repeat 3] [--out FILE]

CPU seconds of the least of ``--repeat`` calls each; the results are checked equal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dasflow.io.arrays import unique


def _best(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        c0 = time.process_time()
        out = fn()
        best = min(best, time.process_time() - c0)
    return best, out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=float, default=4e6)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    n = int(args.size)
    rng = np.random.default_rng(2020)
    cases = {
        "distinct sorted int64 (MAFIDs)": np.arange(n, dtype=np.int64) * 3 + 100_000_000,
        "distinct shuffled int64": rng.permutation(n).astype(np.int64),
        "int64, each value ~2 times": rng.integers(0, n // 2, n),
        "int64, 1,000 values": rng.integers(0, 1_000, n),
        "text region IDs, n/8 distinct": rng.integers(0, n // 8, n // 4).astype(str),
    }
    rows = []
    for name, values in cases.items():
        t_np, want = _best(lambda v=values: np.unique(v), args.repeat)
        t_ours, got = _best(lambda v=values: unique(v), args.repeat)
        np.testing.assert_array_equal(got, want)
        rows.append({"case": name, "elements": int(values.size), "np_unique_cpu_s": round(t_np, 4),
                     "unique_cpu_s": round(t_ours, 4), "ratio": round(t_np / t_ours, 1)})
        print(f"{name:<34} {values.size:>10,}  np.unique {t_np:7.3f} s  unique {t_ours:7.3f} s  "
              f"{t_np / t_ours:6.1f}x", flush=True)
    result = {"benchmark": "unique", "numpy": np.__version__, "repeat": args.repeat, "rows": rows}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
