"""``dasflow safetab-p {validate,execute} PARAMETERS_DIR DATA_DIR [OUTPUT_DIR]``.

PARAMETERS_DIR holds ``config.json`` and, optionally, the four iteration files (else they are read from DATA_DIR,
else the packaged real 2020 files are used). DATA_DIR holds ``person-records.txt`` and ``GRF-C.txt``.

``validate``: config, iteration files, GRF-C and every person row are checked; the plan (exact budgets per
(region type, level, stage)) is printed; nothing is measured. ``execute``: the same validation, then for each
enabled universe (US, PR — separate runs with separate budgets) stage 1, stage 2, post-processing, and
``OUTPUT_DIR/t1/t1_<U>.csv``, ``OUTPUT_DIR/t2/t2_<U>.csv`` (pipe-delimited) plus ``manifest.json`` (Γ, ρ_i, γ, s,
θ per level, TotalOnly iterations, rng mode). Files are written under a temporary name and renamed; the
manifest is written last. Noise comes from the CSPRNG (production mode).

DATA_DIR may hold the person records split into several files, ``person-records/*.txt`` (e.g. one per state,
each with the header) instead of ``person-records.txt``: they are then read one file at a time and their counts
summed before any noise (the partitioned path of :mod:`.product`), so a national run never holds all persons.

``--ground-truth``: the non-private twin — the same validation, plan shape, adaptivity rules and t1/t2 formats
with every tabulated level at infinite budget (no noise, no zero suppression), written to OUTPUT_DIR (default
``safetab-p-ground-truth``) with ``"ground_truth": true`` in the manifest. For accuracy reports only: its
outputs are the confidential tabulations and must never be released.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.privacy import rng as rng_mod
from dasflow.privacy.standalone import add_account_arguments, spend_standalone
from dasflow.products.base import MeasurementSpec
from dasflow.products.safetab_p.config import load_config
from dasflow.products.safetab_p.plan import accounting_plan, plan_total
from dasflow.products.safetab_p.product import (
    SafeTabP,
    ground_truth_config,
    load_inputs,
    load_public,
    run_prepared,
)
from dasflow.products.safetab_p.regions import REGION_GRANULARITY, Universe, region_types

DEFAULT_OUTPUT = "safetab-p-output"
DEFAULT_GROUND_TRUTH_OUTPUT = "safetab-p-ground-truth"


def _universes(run_us: bool, run_pr: bool) -> list[Universe]:
    out: list[Universe] = []
    if run_us:
        out.append("US")
    if run_pr:
        out.append("PR")
    return out


def _json(v: Any) -> Any:
    if isinstance(v, Fraction):
        return str(v)
    if isinstance(v, dict):
        return {str(k): _json(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json(x) for x in v]
    return v


def spec_record(spec: MeasurementSpec) -> dict[str, Any]:
    """A JSON-safe record of one planned key (exact values as strings)."""
    return {"key": spec.key, "level": spec.level, "privacy_defn": spec.privacy_defn,
            "mechanism": spec.mechanism, "budget": None if spec.budget is None else str(spec.budget),
            "sensitivity": str(spec.sensitivity), "noise": str(spec.noise), "cells": spec.cells,
            "variance": str(spec.variance), "detail": _json(dict(spec.detail))}


def write_table(df: pd.DataFrame, path: Path) -> None:
    """Pipe-delimited, written to a temporary name then renamed (never a half-written file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    df.to_csv(tmp, sep="|", index=False)
    os.replace(tmp, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``dasflow safetab-p`` (the Census production command line)."""
    parser.add_argument("mode", choices=["validate", "execute"])
    parser.add_argument("parameters_dir")
    parser.add_argument("data_dir")
    parser.add_argument("output_dir", nargs="?", default=None)
    parser.add_argument("--ground-truth", action="store_true", help="execute: the non-private twin (no noise)")
    add_account_arguments(parser)  # a private run reserves its plan from the dataset's account before any noise


def run(args: argparse.Namespace) -> int:
    """Handler of ``dasflow safetab-p``; InputError → exit 2 (by ``dasflow.cli``)."""
    params, data = Path(args.parameters_dir), Path(args.data_dir)
    if not params.is_dir():
        raise InputError("PARAMETERS_DIR is not a directory", file=str(params))
    if not data.is_dir():
        raise InputError("DATA_DIR is not a directory", file=str(data))
    ground_truth = bool(getattr(args, "ground_truth", False))
    cfg = load_config(params)
    if ground_truth:
        cfg = ground_truth_config(cfg)
    universes = _universes(cfg.run_us, cfg.run_pr)
    product = SafeTabP()
    publics = {u: load_public(params, data, u, cfg) for u in universes}
    inputs = load_inputs(data)
    plans = {u: product.plan(cfg, publics[u]) for u in universes}
    prepared = {}
    for u in universes:  # validates every person row (every file) before any noise is drawn
        prepared[u] = product.prepare(inputs, publics[u])
    if args.mode == "validate":
        for u in universes:
            total = plan_total(plans[u])
            shown = "infinite (ground-truth twin)" if total is None else f"{total} (= {float(total):.6g})"
            print(f"{u}: {len(plans[u])} planned keys, total {cfg.privacy_defn} budget {shown}")
            for s in plans[u]:
                print(f"  {s.key}  budget={s.budget}  noise={s.noise}  stability={s.detail['stability']}")
        print("safetab-p validate: inputs and config are valid")
        return 0
    out = Path(args.output_dir or (DEFAULT_GROUND_TRUTH_OUTPUT if ground_truth else DEFAULT_OUTPUT))
    if not ground_truth:  # before any noise; exit 3 without an account
        spend_standalone(args, "safetab-p execute", plans.items())
    g = rng_mod.csprng()  # the ground-truth twin draws nothing from it (σ² = 0 everywhere)
    manifest: dict[str, Any] = {"product": "safetab-p", "rng_mode": g.mode, "privacy_defn": cfg.privacy_defn,
                                "gamma": str(cfg.gamma), "ground_truth": ground_truth, "runs": {}}
    for u in universes:
        result = run_prepared(publics[u], prepared.pop(u), g)
        write_table(result.tables["t1"], out / "t1" / f"t1_{u}.csv")
        write_table(result.tables["t2"], out / "t2" / f"t2_{u}.csv")
        index = publics[u]["iterations"]
        composed = accounting.compose(accounting_plan(result.specs), rdp=False)
        manifest["runs"][u] = {
            "total_budget": None if result.budget is None else str(result.budget),
            "accounting": composed.as_record(),
            "plan": [spec_record(s) for s in result.specs],
            "total_only_iterations": {str(lv): [str(c) for c in li.iteration_codes[li.total_only]]
                                      for lv, li in index.levels.items()},
            "region_granularity": "off: every iteration at every region type" if cfg.ignore_region_granularity
            else {rt: REGION_GRANULARITY[rt] for rt in region_types(u)},
            "rows": {k: len(v) for k, v in result.tables.items()},
        }
    tmp = out / f".manifest.json.tmp-{os.getpid()}"
    tmp.write_text(json.dumps(manifest, indent=1), encoding="utf-8")
    os.replace(tmp, out / "manifest.json")
    print(f"safetab-p execute{' --ground-truth' if ground_truth else ''}: wrote {out}", file=sys.stderr)
    return 0
