"""Release text through Arrow against pandas, side by side, on the release tables of a kept national run.

    .venv/bin/python benchmarks/national.py --persons 10e6 --production --lanes 1 --dask-workers 2 --keep \\
        --workdir <kept-run dir>
    .venv/bin/python benchmarks/release_text.py --workdir <kept-run dir> --repeat 3 \\
        --out benchmarks/results/release_text_session22.json

Every pipe-delimited table under the kept run's ``release/`` is read once into the frames its product's
release-files stage writes (digit-string GEOIDs and other text as strings, integer columns as integers), then,
per repeat and side by side, written with ``frame.to_csv(index=False, sep="|", lineterminator="\\n")``
(pandas, before) and with :func:`dasflow.io.delimited.pipe_text` (Arrow where it gives the same bytes, now), in
chunks of the size TopDown's ``table_chunks`` hands the writer (one state's rows).

Process CPU seconds (Arrow's threads included) and wall seconds; the least over ``--repeat`` is the figure.
Bytes written are compared with each other and with the kept run's files (all must be identical).

The release stage's check of every table (it parses, COUNT holds integers) is timed too, on the kept files:
the pandas parse alone (before) and ``publish._check_table`` (now: :func:`dasflow.io.delimited.integer_counts`,
Arrow on blocks this process reads itself, then pandas only where Arrow defers). Both must pass every table;
``arrow_deferred`` counts the tables the Arrow pass left to pandas. (Session 21's first Arrow check gave Arrow
the file handle itself; its streaming reader read ahead on it while the pandas fallback read the same handle,
and it was withdrawn.)
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

from dasflow.io.delimited import integer_counts, pipe_text
from dasflow.release.publish import CHECK_ROWS, _check_table


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


def _pandas_check(name: str, data: bytes) -> None:
    """The release stage's check before the Arrow pass: the pandas parse, chunk by chunk."""
    for frame in pd.read_csv(io.BytesIO(data), sep="|", dtype=str, keep_default_na=False, chunksize=CHECK_ROWS):
        if "COUNT" in frame.columns:
            counts = pd.to_numeric(frame["COUNT"], errors="coerce")
            if bool((counts.isna() | (counts % 1 != 0)).any()):
                raise SystemExit(f"{name}: the kept table fails the check")


def _each(check: Callable[[str, bytes], None], tables: dict[str, bytes]) -> None:
    for name, data in tables.items():
        check(name, data)


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
        check_before = _timed(lambda: _each(_pandas_check, tables))
        check_now = _timed(lambda: _each(lambda n, d: _check_table(n, io.BytesIO(d)), tables))
        for label, (cpu, wall, _) in (("write_pandas", before), ("write_arrow", now),
                                      ("check_pandas", check_before), ("check_arrow", check_now)):
            row = rows.setdefault(label, {"cpu_s": float("inf"), "wall_s": float("inf")})
            row["cpu_s"], row["wall_s"] = min(row["cpu_s"], round(cpu, 3)), min(row["wall_s"], round(wall, 3))
    deferred = sorted(n for n, d in tables.items() if not integer_counts(io.BytesIO(d)))
    out = {"benchmark": "release_text", "kept_run": run.name, "tables": len(tables),
           "bytes": sum(len(d) for d in tables.values()), "repeat": args.repeat, "figures": rows,
           "write_cpu_ratio_pandas_over_arrow": round(rows["write_pandas"]["cpu_s"] / rows["write_arrow"]["cpu_s"], 2),
           "check_cpu_ratio_pandas_over_arrow": round(rows["check_pandas"]["cpu_s"] / rows["check_arrow"]["cpu_s"], 2),
           "arrow_deferred": deferred, "identical_bytes": same_bytes}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
