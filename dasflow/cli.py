"""The ``dasflow`` command (DESIGN.md §9).

Each sub-command is parsed here and handed to a handler ``run(args) -> int`` in the module that owns it. The
handler modules are imported only when their command runs (a plain import inside a loader function: startup time,
not an import loop — Prefect alone takes seconds, so ``dasflow budget`` never pays for it). Products add their
own subcommands (``CliCommand``) and ``budget --format`` choices through their plugins (``dasflow.registry``);
the plugins are imported only when the command line may name one (``dasflow --help``, ``budget``, or a product
subcommand), so core commands such as ``status`` or ``account`` start without importing any product.

Exit codes: 0 success, 2 bad input or config, 3 refused by the privacy ledger, 1 anything else.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from dasflow import registry
from dasflow.errors import DasflowError, InputError, LedgerRefusal

if TYPE_CHECKING:  # the plugin base imports pandas and numpy: a flow command's Prefect server starts first
    from dasflow.flows.temporary_api import TemporaryApi
    from dasflow.products.plugin import ProductPlugin

EXIT_OK = 0
EXIT_OTHER = 1
EXIT_BAD_INPUT = 2
EXIT_LEDGER = 3
EXIT_INTERRUPTED = 130

Handler = Callable[[argparse.Namespace], int]


def _flows() -> Handler:
    import dasflow.flows.cli  # Prefect: loaded only by the commands that run a flow (startup time)

    return dasflow.flows.cli.run


def _release() -> Handler:
    import dasflow.commands.release

    return dasflow.commands.release.run


def _budget() -> Handler:
    import dasflow.commands.budget

    return dasflow.commands.budget.run


def _account() -> Handler:
    import dasflow.commands.account

    return dasflow.commands.account.run


def _experiment() -> Handler:
    import dasflow.experiment.cli

    return dasflow.experiment.cli.run


def _synth() -> Handler:
    import dasflow.synth.cli

    return dasflow.synth.cli.run


#: core sub-command -> loader of its handler (product subcommands come from the plugins)
HANDLERS: dict[str, Callable[[], Handler]] = {
    "demo": _flows, "run": _flows, "resume": _flows, "validate": _flows,
    "status": _release, "ledger": _release, "postprocess": _release, "publish": _release,
    "budget": _budget, "account": _account, "experiment": _experiment, "synth": _synth,
}
#: core commands whose arguments name no product (they parse without importing any plugin)
WITHOUT_PLUGINS = frozenset(HANDLERS) - {"budget"}


def _needs_plugins(argv: Sequence[str]) -> bool:
    """Whether parsing ``argv`` needs the product plugins: the top-level help, ``budget`` (its ``--format``
    choices) or a product subcommand."""
    command = next((a for a in argv if not a.startswith("-")), None)
    return command not in WITHOUT_PLUGINS


def _budget_formats(plugins: Sequence[ProductPlugin[Any]]) -> list[str]:
    from dasflow.products.plugin import ProductPlugin

    return ["auto", "release", *(p.name for p in plugins if type(p).budget_plan is not ProductPlugin.budget_plan)]


def _lanes(text: str) -> int:
    """``--product-lanes``: a whole number of at least 1 (argparse prints the one-line usage error otherwise)."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text!r}")
    return int(text)


def _parser(plugins: Sequence[ProductPlugin[Any]] | None = None) -> argparse.ArgumentParser:
    """The command line; ``plugins`` (default: every registered product) add their subcommands and budget formats
    (pass ``[]`` for a parser of the core commands only)."""
    plugins = registry.plugins() if plugins is None else plugins
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
        parser.add_argument("--product-lanes", type=_lanes, default=1, metavar="N",
                            help="products validated and run N at a time in this process (default 1: one "
                                 "product's data in memory at a time)")
        parser.add_argument("--measure-on-workers", action=argparse.BooleanOptionalAction, default=None,
                            help="draw TopDown's measurements on the Dask workers, which then read the prepared "
                                 "counts (default: yes on the local cluster, no at --dask-address)")
    stat = sub.add_parser("status", help="stages done / pending, ledger")
    stat.add_argument("release_id")
    stat.add_argument("--store", default=None)

    lg = sub.add_parser("ledger", help="the privacy ledger of a release")
    lg.add_argument("release_id")
    lg.add_argument("--store", default=None)
    lg.add_argument("--format", choices=["table", "csv", "json"], default="table")

    pp = sub.add_parser("postprocess", help="post-process + release again from the stored noisy measurements "
                                            "(spends nothing; the ledger must be unchanged)")
    pp.add_argument("release_id")
    pp.add_argument("--store", default=None)

    pb = sub.add_parser("publish", help="copy a finished release to a publication location outside the store")
    pb.add_argument("release_id")
    pb.add_argument("--store", default=None)
    pb.add_argument("--target", required=True, help="directory or s3://bucket/prefix outside the store's bucket")
    pb.add_argument("--test-publication", action="store_true", help="publish a seeded TEST release, marked")

    b = sub.add_parser("budget", help="the budget plan of a config, without reading any data")
    b.add_argument("config")
    b.add_argument("--format", choices=_budget_formats(plugins), default="auto")
    b.add_argument("--json", action="store_true", help="machine-readable output")

    ex = sub.add_parser("experiment", help="accuracy of the published tables: seeded repeated runs and budget "
                                           "sweeps on synthetic inputs (no ledger, no account)")
    ex.add_argument("config")
    ex.add_argument("--runs", type=int, required=True, help="seeded runs per budget scale")
    ex.add_argument("--out", required=True, help="output directory (metrics.csv, report.html, experiment.json)")
    ex.add_argument("--budget-scale", default="1", help="comma-separated budget factors, e.g. 0.5,1,2")
    ex.add_argument("--seed", type=int, default=0, help="seed of the test noise (default 0)")
    ex.add_argument("--products", default=None, help="comma-separated subset of the config's products")
    ex.add_argument("--budget-split", action="append", default=[], metavar="PRODUCT:LEVEL=WEIGHT,...",
                    help="a candidate budget split (repeatable): re-weight a product's plan levels, total kept")

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

    for plugin in plugins:  # the products' standalone commands (Census production formats)
        command = plugin.cli()
        if command is not None:
            parser = sub.add_parser(command.name, help=command.help)
            command.add(parser)
            parser.set_defaults(product_handler=command.run)
    return p


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _unexpected(command: str, exc: BaseException) -> int:
    """One line for a failure that is not one of dasflow's own errors. Its message is not printed (it could quote
    a confidential value); ``DASFLOW_DEBUG=1`` re-raises it with the traceback. Prefect API failures (server down,
    authentication refused) are operator-facing and carry no data, so their first line is shown."""
    if os.environ.get("DASFLOW_DEBUG"):
        raise exc
    kind = f"{type(exc).__module__}.{type(exc).__name__}"
    if kind.startswith(("httpx.", "prefect.")):
        print(f"dasflow {command}: error: the Prefect API failed ({type(exc).__name__}: "
              f"{_one_line(str(exc).splitlines()[0] if str(exc) else '')}); check PREFECT_API_URL and "
              "PREFECT_API_AUTH_STRING", file=sys.stderr)
    else:
        print(f"dasflow {command}: internal error ({kind}); its details are in the Prefect UI or with "
              "DASFLOW_DEBUG=1", file=sys.stderr)
    return EXIT_OTHER


def _dispatch(command: str, handler: Handler, args: argparse.Namespace) -> int:
    try:
        code = int(handler(args))
        sys.stdout.flush()
        return code
    except InputError as exc:
        print(f"dasflow {command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except LedgerRefusal as exc:
        print(f"dasflow {command}: refused by the privacy ledger: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_LEDGER
    except DasflowError as exc:
        print(f"dasflow {command}: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_OTHER
    except BrokenPipeError:
        # the reader went away (``dasflow ledger ... | head``): not an error; silence the final flush too
        with contextlib.suppress(OSError, ValueError):  # ValueError etc.: stdout is not a file (in-process)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print(f"dasflow {command}: interrupted; a release resumes with `dasflow resume`", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:
        return _unexpected(command, exc)


def _early_api(argv: Sequence[str]) -> TemporaryApi | None:
    """A flow command's temporary Prefect server, launched before this process imports pandas, numpy or Prefect
    (about 1.3 s of the command's start): it starts on the other core meanwhile, and the flow command's
    :func:`dasflow.flows.temporary_api.launch` takes it over. None for any other command, for help, or when an
    API is configured."""
    from dasflow.flows import temporary_api  # standard library only

    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in temporary_api.FLOW_COMMANDS or {"-h", "--help"} & set(argv):
        return None
    return temporary_api.launch()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``dasflow`` console script: every failure ends in one line on stderr and its exit
    code (0 ok, 1 other, 2 bad input/config, 3 refused by the ledger, 130 interrupted). Without ``argv`` (the
    console script) the command owns its process, which ends with it (``own_process``: see below)."""
    own_process = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    early = _early_api(argv)
    try:
        args = _parser(None if _needs_plugins(argv) else []).parse_args(argv)
    except BaseException:  # a usage error or --help: no flow runs
        if early is not None:
            early.stop()
        raise
    loader = HANDLERS.get(args.command)
    handler: Handler = loader() if loader is not None else args.product_handler
    args.own_process = own_process
    try:
        return _dispatch(args.command, handler, args)
    finally:
        if own_process:
            # the interpreter's last collections at exit scanned everything a run imported and built: ≈ 2.8 s
            # of the demo's exit after its outputs were complete and its server stopped; frozen objects are
            # released with the process (every output is already written, synced and closed). Only when the
            # process ends with the command: a caller of main(argv) keeps its garbage collector as it was
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
