"""``dasflow phsafe {validate,private,non-private} CONFIG DATA_PATH [OUTPUT_PATH] [--validate]
[--validate-private-output]`` — the Census production command line (phsafe-production.md).

* ``validate``: config + input phases 1–3; exit 0 or 2 (InputError naming file, row, column).
* ``private``: config and phases 1–2 always (they are what makes the integer conversion safe); phase 3 too with
  ``--validate`` — all of it before any noise is drawn. Then plan, prepare, measure with the CSPRNG, derive,
  write ``PH1_num.csv`` … atomically; ``--validate-private-output`` re-reads and checks them (R16).
* ``non-private``: the Census non-private tables (no noise, NO truncation) in the Census's own non-private
  format (:mod:`.nonprivate`): non-empty rows only, total and marginal cells, all three PH1/PH5 denominator
  cells, PH8_num = Σ FINAL_POP. (``product.run_non_private`` keeps the private layout for accuracy reports.)

Decision: ``reader`` ``cef`` and ``csv`` both read the pipe/comma files in DATA_PATH; dasflow has no separate
CEF reader, and the production config (``"reader": "cef"``) is accepted as-is.
"""

from __future__ import annotations

import argparse
import sys

from dasflow.errors import DasflowError, InputError
from dasflow.privacy.standalone import add_account_arguments, spend_standalone
from dasflow.products.phsafe import outputs
from dasflow.products.phsafe import planning as plan_mod
from dasflow.products.phsafe.config import load_config
from dasflow.products.phsafe.inputs import check_cross_file, read_inputs
from dasflow.products.phsafe.nonprivate import census_non_private
from dasflow.products.phsafe.product import run_private


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``dasflow phsafe`` (the Census production command line)."""
    parser.add_argument("mode", choices=["validate", "private", "non-private"])
    parser.add_argument("config")
    parser.add_argument("data_path")
    parser.add_argument("output_path", nargs="?", default=None)
    parser.add_argument("--validate", action="store_true", help="validate inputs before running")
    parser.add_argument("--validate-private-output", action="store_true", help="validate outputs after running")
    add_account_arguments(parser)  # a private run reserves its plan from the dataset's account before any noise


def run(args: argparse.Namespace) -> int:
    """Handler of ``dasflow phsafe`` (see the module docstring); returns the exit code."""
    config = load_config(args.config)
    if args.mode != "validate" and not args.output_path:
        raise InputError(f"OUTPUT_PATH is required in {args.mode} mode")
    inputs = read_inputs(args.data_path)
    if args.mode == "validate" or args.validate:
        check_cross_file(inputs, config.state_filter)
    if args.mode == "validate":
        print(f"phsafe: config and inputs valid ({config.universe}, {len(inputs.persons['MAFID'])} persons, "
              f"{len(inputs.units['MAFID'])} units)")
        return 0
    if args.mode == "non-private":
        frames = census_non_private(inputs.persons, inputs.units, inputs.geo, config)
        written = outputs.write_tables(frames, args.output_path)
        print(f"phsafe: wrote {len(written)} non-private tables (Census format) to {args.output_path}")
        return 0
    specs = plan_mod.plan(config)
    spend_standalone(args, "phsafe private", [(config.universe, specs)])  # before any noise; exit 3 without one
    frames = run_private(inputs.persons, inputs.units, inputs.geo, config)
    written = outputs.write_tables(frames, args.output_path)
    total = plan_mod.total(specs)
    print(f"phsafe: wrote {len(written)} private tables to {args.output_path}; "
          f"{len(specs)} measurements, total {config.privacy_defn} budget "
          f"{'infinite' if total is None else total}")
    if args.validate_private_output:
        try:
            outputs.validate_output(args.output_path, config)
        except DasflowError as exc:
            print(f"phsafe: output validation FAILED: {exc}", file=sys.stderr)
            raise
        print("phsafe: output validation passed")
    return 0
