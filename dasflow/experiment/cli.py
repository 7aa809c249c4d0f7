"""``dasflow experiment CONFIG --runs N --out DIR [--budget-scale 0.5,1,2] [--budget-split PRODUCT:LEVEL=W,...]...
[--seed S] [--products a,b]`` (arguments parsed in ``dasflow.cli``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dasflow.config import load_release_config
from dasflow.experiment.record import prefix, write_outputs
from dasflow.experiment.runner import run_experiment
from dasflow.experiment.scaling import parse_scales, parse_split
from dasflow.io.store import open_store


def run(args: argparse.Namespace) -> int:
    config = load_release_config(args.config)
    scales = parse_scales(args.budget_scale)
    products = [p.strip() for p in args.products.split(",")] if args.products else None
    splits = [parse_split(text) for text in getattr(args, "budget_split", None) or []]
    exp = run_experiment(config, runs=args.runs, scales=scales, seed=args.seed, products=products, splits=splits,
                         progress=lambda msg: print(msg, file=sys.stderr))
    store = open_store(config.store)
    paths = write_outputs(exp, Path(args.out), store)
    print(f"metrics: {paths['metrics.csv']}")
    print(f"report:  {paths['report.html']}")
    if "split_metrics.csv" in paths:
        print(f"splits:  {paths['split_metrics.csv']}")
    print(f"recorded for releases of this method in {store.uri}/{prefix(exp.meta['method_sha256'])}")
    return 0
