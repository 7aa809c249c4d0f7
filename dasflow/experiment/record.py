"""Where an experiment's results go: ``--out DIR`` and the store, where releases of the same method find them.

``DIR/metrics.csv`` (the issue's columns, comma-separated), ``DIR/report.html`` and ``DIR/experiment.json``
(what was run: config and method SHA-256, runs, seed, scales, timings). The same three files are recorded in
the config's store under ``experiments/{method_sha256}/`` — the method being the universe and the product
configs (:func:`dasflow.release.experiments.method_sha256`) — and the accuracy report of any release with that
method shows them (``dasflow.release.accuracy``). The store layout and its lookup (``prefix``, ``recorded``)
live in :mod:`dasflow.release.experiments`, below the report. They are computed from synthetic inputs only (the
experiment refuses any other input), so a production release may show them.
"""

from __future__ import annotations

import json
from pathlib import Path

from dasflow.experiment.metrics import COLUMNS
from dasflow.experiment.report import experiment_report
from dasflow.experiment.runner import SPLIT_COLUMNS, Experiment
from dasflow.io.store import ObjectStore
from dasflow.release.experiments import prefix, recorded

__all__ = ["FILES", "SPLIT_FILE", "prefix", "recorded", "write_outputs"]

FILES = ("metrics.csv", "report.html", "experiment.json")
#: written with ``--budget-split`` only: ``SPLIT_COLUMNS`` per product, candidate split, table, geolevel, bin
SPLIT_FILE = "split_metrics.csv"


def _payloads(exp: Experiment) -> dict[str, bytes]:
    out = {
        "metrics.csv": exp.metrics[list(COLUMNS)].to_csv(index=False, lineterminator="\n").encode(),
        "report.html": experiment_report(exp.metrics, exp.meta, exp.splits).encode(),
        "experiment.json": (json.dumps(exp.meta, sort_keys=True, indent=1) + "\n").encode(),
    }
    if not exp.splits.empty:
        out[SPLIT_FILE] = exp.splits[list(SPLIT_COLUMNS)].to_csv(index=False, lineterminator="\n").encode()
    return out


def write_outputs(exp: Experiment, out_dir: Path, store: ObjectStore | None = None) -> dict[str, str]:
    """Write the three files to ``out_dir`` (and, with ``store``, under ``experiments/{method}/``, the
    experiment.json last); return name → local path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    payloads = _payloads(exp)
    for name, data in payloads.items():
        (out_dir / name).write_bytes(data)
        paths[name] = str(out_dir / name)
    if store is not None:
        for name in (*(n for n in payloads if n not in FILES), *FILES):   # experiment.json last
            store.put(prefix(exp.meta["method_sha256"]) + name, payloads[name])
    return paths
