"""Release text through Arrow against pandas, side by side, on the release tables of a kept national run.

    .venv/bin/python benchmarks/national.py --persons 10e6 --production --lanes 1 --dask-workers 2 --keep \\
        --workdir <kept-run dir>
    .venv/bin/python benchmarks/release_text.py --workdir <kept-run dir> --repeat 3 \\
        --out benchmarks/results/release_text_session21.json

Every pipe-delimited table under the kept run's ``release/`` is read once into the frames its product's
release-files stage writes (digit-string GEOIDs and other text as strings, integer columns as integers), then,
per repeat and side by side, written with ``frame.to_csv(index=False, sep="|", lineterminator="\\n")``
(pandas, before) and with :func:`dasflow.io.delimited.pipe_text` (Arrow where it gives the same bytes, now), in
chunks of the size TopDown's ``table_chunks`` hands the writer (one state's rows).

Process CPU seconds (Arrow's threads included) and wall seconds; the least over ``--repeat`` is the figure.
Bytes written are compared with each other and with the kept run's files (all must be identical). (Its
first version also timed an Arrow pass of the release stage's COUNT check, since withdrawn: Arrow's streaming
reader read ahead on the caller's file handle, which the pandas fallback then shared.)
"""

from __future__ import annotations

import argparse
import glob
import io
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from dasflow.io.delimited import pipe_text

CHECK_ROWS = 1_000_000


def _timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    c, w = time.process_time(), time.perf_counter()
    out = fn()
    return time.process_time() - c, time.perf_counter() - w, out


def _frame(data: bytes) -> pd.DataFrame:
    text = pd.read_csv(io.BytesIO(data), sep="|", dtype=str, keep_default_na=False)
    for col in text.columns:  # integers as the products hand them over; codes with leading zeros stay text
        s = text[col]
        if s.str.fullmatch(r"-?(0|[1-9][0-9]*)").all():
            text[col] = s.astype("int64")
        else:
            text[col] = s.astype("string")
    return text


def _chunks(frame: pd.DataFrame) -> list[pd.DataFrame]:
    if "GEOID" not in frame.columns or frame.empty:
        return [frame]
    state = frame["GEOID"].str.slice(0, 2)
    return [g for _, g in frame.groupby(state, sort=True)]


def _pandas_write(chunks: list[pd.DataFrame]) -> bytes:
    return b"".join(str(c.to_csv(index=False, sep="|", lineterminator="\n", header=i == 0)).encode()
                    for i, c in enumerate(chunks))


def _arrow_write(chunks: list[pd.DataFrame]) -> bytes:
    return b"".join(pipe_text(c, header=i == 0) for i, c in enumerate(chunks))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, required=True, help="a national.py --keep workdir")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    run = Path(glob.glob(str(args.workdir / "national-*"))[0])
    files = sorted(Path(p) for p in glob.glob(str(run / "store/runs/*/release/*/**/*.csv"), recursive=True))
    tables = {f.relative_to(f.parents[1]).as_posix(): f.read_bytes() for f in files}
    chunks = {name: _chunks(_frame(data)) for name, data in tables.items()}
    rows: dict[str, dict[str, float]] = {}
    same_bytes = True
    for _ in range(args.repeat):
        before = _timed(lambda: {n: _pandas_write(c) for n, c in chunks.items()})
        now = _timed(lambda: {n: _arrow_write(c) for n, c in chunks.items()})
        same_bytes &= before[2] == now[2] == tables  # and both the kept run's (pandas-written) files
        for label, (cpu, wall, _) in (("pandas", before), ("arrow", now)):
            row = rows.setdefault(f"write_{label}", {"cpu_s": float("inf"), "wall_s": float("inf")})
            row["cpu_s"], row["wall_s"] = min(row["cpu_s"], round(cpu, 3)), min(row["wall_s"], round(wall, 3))
    out = {"benchmark": "release_text", "kept_run": run.name, "tables": len(tables),
           "bytes": sum(len(d) for d in tables.values()), "repeat": args.repeat, "figures": rows,
           "write_cpu_ratio_pandas_over_arrow": round(rows["write_pandas"]["cpu_s"] / rows["write_arrow"]["cpu_s"], 2),
           "identical_bytes": same_bytes}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
