"""The ``dasflow`` command (DESIGN.md §9).

Each sub-command is parsed here and handed to a handler ``run(args) -> int`` in the module that owns it, imported
lazily so that ``dasflow budget`` never pays for Prefect's import. A command whose handler is not built yet says
so and exits 1; none pretends to work.

Exit codes: 0 success, 2 bad input or config, 3 refused by the privacy ledger, 1 anything else.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dasflow.errors import DasflowError, InputError, LedgerRefusal

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_BAD_INPUT = 2
EXIT_LEDGER = 3

#: sub-command -> (handler module, the issue that builds it)
HANDLERS: dict[str, tuple[str, str]] = {
    # flows.cli runs Prefect flows; it lives outside the library so that dasflow/ never imports Prefect.
    "demo": ("flows.cli", "the production DAG"),
    "run": ("flows.cli", "the production DAG"),
    "resume": ("flows.cli", "the production DAG"),
    "validate": ("flows.cli", "validation"),
    "status": ("dasflow.commands.release", "the production DAG"),
    "ledger": ("dasflow.commands.release", "the production DAG"),
    "budget": ("dasflow.commands.budget", "the budget planner"),
    "account": ("dasflow.commands.account", "privacy-loss accounts"),
    "experiment": ("dasflow.experiment.cli", "accuracy experiments"),
    "synth": ("dasflow.synth.cli", "the synthetic census"),
    "phsafe": ("dasflow.products.phsafe.cli", "PHSafe"),
    "safetab-p": ("dasflow.products.safetab_p.cli", "SafeTab-P"),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dasflow", description="dasflow: the census disclosure avoidance system as a resumable, auditable DAG")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="synthetic census + a full release of every product on local disk")
    d.add_argument("--store", default="dasflow-demo", help="local store directory (default: ./dasflow-demo)")
    d.add_argument("--persons", type=int, default=20_000, help="synthetic persons (default 20000)")
    d.add_argument("--seed", type=int, default=None, help="seeded TEST release (same seed, same bytes)")

    r = sub.add_parser("run", help="run a release (an existing release resumes)")
    r.add_argument("config")
    rs = sub.add_parser("resume", help="resume a stopped release")
    rs.add_argument("release_id")
    rs.add_argument("--store", default=None)
    for parser in (r, rs):
        parser.add_argument("--task-runner", choices=["thread", "dask"], default=None,
                            help="where mapped tasks run: threads here, or a Dask cluster (overrides the config)")
        parser.add_argument("--dask-address", default=None,
                            help="Dask scheduler, e.g. tcp://10.0.0.5:8786 (default: a local 2-worker cluster)")
    stat = sub.add_parser("status", help="stages done / pending, ledger")
    stat.add_argument("release_id")
    stat.add_argument("--store", default=None)

    lg = sub.add_parser("ledger", help="the privacy ledger of a release")
    lg.add_argument("release_id")
    lg.add_argument("--store", default=None)
    lg.add_argument("--format", choices=["table", "csv", "json"], default="table")

    b = sub.add_parser("budget", help="the budget plan of a config, without reading any data")
    b.add_argument("config")
    b.add_argument("--format", choices=["auto", "release", "phsafe", "safetab-p"], default="auto")
    b.add_argument("--json", action="store_true", help="machine-readable output")

    ex = sub.add_parser("experiment", help="accuracy of the published tables: seeded repeated runs and budget "
                                           "sweeps on synthetic inputs (no ledger, no account)")
    ex.add_argument("config")
    ex.add_argument("--runs", type=int, required=True, help="seeded runs per budget scale")
    ex.add_argument("--out", required=True, help="output directory (metrics.csv, report.html, experiment.json)")
    ex.add_argument("--budget-scale", default="1", help="comma-separated budget factors, e.g. 0.5,1,2")
    ex.add_argument("--seed", type=int, default=0, help="seed of the test noise (default 0)")
    ex.add_argument("--products", default=None, help="comma-separated subset of the config's products")

    from dasflow.commands.account import add_parser as account_parser

    account_parser(sub)

    v = sub.add_parser("validate", help="input + config validation only")
    v.add_argument("config")

    sy = sub.add_parser("synth", help="generate a synthetic CEF-like census")
    sy.add_argument("--persons", type=int, required=True)
    sy.add_argument("--states", default=None, help="comma-separated state FIPS codes (default: all)")
    sy.add_argument("--seed", type=int, required=True)
    sy.add_argument("--out", required=True)
    sy.add_argument("--format", choices=["census", "parquet"], default="parquet")

    ph = sub.add_parser("phsafe", help="PHSafe with the Census production file formats")
    ph.add_argument("mode", choices=["validate", "private", "non-private"])
    ph.add_argument("config")
    ph.add_argument("data_path")
    ph.add_argument("output_path", nargs="?", default=None)
    ph.add_argument("--validate", action="store_true", help="validate inputs before running")
    ph.add_argument("--validate-private-output", action="store_true", help="validate outputs after running")

    st = sub.add_parser("safetab-p", help="SafeTab-P with the Census production file formats")
    st.add_argument("mode", choices=["validate", "execute"])
    st.add_argument("parameters_dir")
    st.add_argument("data_dir")
    st.add_argument("output_dir", nargs="?", default=None)
    st.add_argument("--ground-truth", action="store_true", help="execute: the non-private twin (no noise)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dasflow`` console script."""
    args = _parser().parse_args(argv)
    module_name, what = HANDLERS[args.command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            print(f"dasflow {args.command}: not implemented yet ({what} is not built in this version)",
                  file=sys.stderr)
            return EXIT_OTHER
        raise
    try:
        return int(module.run(args))
    except InputError as exc:
        print(f"dasflow {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LedgerRefusal as exc:
        print(f"dasflow {args.command}: refused by the privacy ledger: {exc}", file=sys.stderr)
        return EXIT_LEDGER
    except DasflowError as exc:
        print(f"dasflow {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_OTHER


if __name__ == "__main__":
    sys.exit(main())
