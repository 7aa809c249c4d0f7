"""``dasflow synth --persons N [--states 06,72] --seed S --out DIR [--format census|parquet]``.

``--format parquet`` writes the state-partitioned Parquet datasets (persons, units, geo, GRF-C) the DAG reads;
``--format census`` writes the Census text inputs of PHSafe (persons.csv, units.csv, geo.csv) and SafeTab-P
(person-records.txt, GRF-C.txt). Bad parameters raise ``InputError`` (exit 2) before anything is written.
"""

from __future__ import annotations

import argparse
import sys
import time

from dasflow.synth.dataset import CLI_FORMATS, generate


def run(args: argparse.Namespace) -> int:
    formats = CLI_FORMATS[args.format]
    t0 = time.perf_counter()
    m = generate(args.out, persons=args.persons, seed=args.seed, states=args.states, formats=formats)
    dt = time.perf_counter() - t0
    tot = m.data["totals"]
    print(
        f"dasflow synth: {tot['persons']:,} persons, {tot['occupied_units']:,} occupied + "
        f"{tot['vacant_units']:,} vacant housing units, {tot['gq_units']:,} group quarters in "
        f"{len(m.data['states'])} state(s), {tot['geography']['blocks']:,} blocks; {dt:.1f} s"
    )
    print(f"dasflow synth: wrote {len(m.files)} files ({', '.join(formats)}); manifest {m.path}")
    sys.stdout.flush()
    return 0
