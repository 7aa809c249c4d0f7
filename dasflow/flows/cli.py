"""Handlers of ``dasflow run | resume | validate | demo`` (they run Prefect flows, so they live in ``flows``)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
import time
from collections.abc import Callable

# Embedded defaults for the ephemeral Prefect API (no telemetry off this machine; a loaded machine needs more
# than the 20 s default to start the temporary server). An operator's environment overrides them.
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")
from pathlib import Path

from dasflow.config import ReleaseConfig, load_release_config
from dasflow.flows import temporary_api
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext, candidate_context, open_run
from dasflow.privacy.ledger import check_plan
from dasflow.validation import gx


class _NoTracebacks(logging.Filter):
    """Console filter: a failed task or flow run is one log line here (its traceback stays in the Prefect UI via
    the API log handler, which runs first); the command then prints the one-line error and its exit code."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.exc_info = None
        record.exc_text = None
        if isinstance(record.msg, str) and "\nTraceback" in record.msg:
            record.msg = record.msg.split("\nTraceback", 1)[0]
        return True


def quiet_console_tracebacks() -> None:
    """Install :class:`_NoTracebacks` on Prefect's console handlers (configuring Prefect's logging now, once)."""
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.handlers import PrefectConsoleHandler

    ensure_logging_setup()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler) and not any(isinstance(f, _NoTracebacks)
                                                                  for f in handler.filters):
            handler.addFilter(_NoTracebacks())


def _report(ctx: RunContext, seconds: float) -> None:
    root = ctx.store.uri.rstrip("/") + "/" + ctx.root
    spent = ctx.ledger.spent().as_record()
    kind = "TEST release" if ctx.config.is_test else "production"
    print(f"release {ctx.release_id} done in {seconds:.1f} s ({kind})")
    print(f"  tables:      {root}/release/")
    print(f"  certificate: {root}/release/CERTIFICATE.md  (and CERTIFICATE.html)")
    print(f"  accuracy:    {root}/release/ACCURACY.html")
    print(f"  ledger:      {root}/ledger/  (audit: {root}/release/ledger.csv)")
    print(f"  spent:       rho = {spent['rho']} over {spent['entries']} measurements; "
          f"epsilon(delta=1e-10) = {spent['epsilon_at_delta']}")


def _execution(cfg: ReleaseConfig, args: argparse.Namespace) -> ReleaseConfig:
    """The config with the command line's execution settings (not part of the frozen config's hash)."""
    update = {k: v for k, v in (("task_runner", getattr(args, "task_runner", None)),
                                ("dask_address", getattr(args, "dask_address", None)),
                                ("measure_on_workers", getattr(args, "measure_on_workers", None))) if v is not None}
    if update.get("dask_address") and "task_runner" not in update:
        update["task_runner"] = "dask"
    return cfg.model_copy(update=update) if update else cfg


def _reach(cfg: ReleaseConfig) -> None:
    """An agency's Dask scheduler answers (one line if not) before the temporary Prefect server is waited for."""
    from dasflow.flows.release import connect_scheduler

    if cfg.task_runner == "dask" and cfg.dask_address:
        connect_scheduler(str(cfg.dask_address)).close()


def run_command(args: argparse.Namespace, api_ready: Callable[[], object]) -> int:
    from dasflow.flows.release import run_release

    cfg = _execution(load_release_config(args.config), args)
    _reach(cfg)
    gx.warm_up()  # a new release validates first: GX's import overlaps the wait for the Prefect server
    api_ready()
    t0 = time.perf_counter()
    run_release(cfg, product_lanes=getattr(args, "product_lanes", 1))
    _report(open_run(cfg.release_id, cfg.store), time.perf_counter() - t0)
    return 0


def resume_command(args: argparse.Namespace, api_ready: Callable[[], object]) -> int:
    from dasflow.flows.release import run_release

    ctx = open_run(args.release_id, args.store or "dasflow-store")
    cfg = _execution(ctx.config, args)
    _reach(cfg)
    api_ready()
    t0 = time.perf_counter()
    run_release(cfg, product_lanes=getattr(args, "product_lanes", 1))
    _report(open_run(ctx.release_id, ctx.config.store), time.perf_counter() - t0)
    return 0


def validate_command(args: argparse.Namespace, api_ready: Callable[[], object]) -> int:
    """Config + input validation only: plan against the cap (nothing frozen), then every product's inputs."""
    cfg = load_release_config(args.config)
    ctx = candidate_context(cfg)  # nothing is frozen: the release id stays usable whatever happens here
    store = ctx.store
    specs = [s for p in cfg.products for s in stages.product_specs(ctx, p.name)]
    total = check_plan(specs, ctx.cap)  # the same check freezing applies (rho and a pure-DP epsilon cap)
    cap = ctx.cap
    print(f"config {args.config}: {len(specs)} planned measurements, total rho = {total.rho} (cap {cap.rho})")
    if cfg.account is not None:  # would the plan fit the account now? (nothing is reserved here)
        from dasflow.privacy.account import check_fits

        charge = check_fits(store, cfg.account, cfg.universe, specs, cfg.release_id)
        print(f"  account {cfg.account}: the plan would reserve {charge} (converted to the account's relation)")
    for p in cfg.products:
        # the release's own gate (confidential inputs present, not header-only, synthetic in test mode, the
        # product's suites); its report stays under runs/ (confidential side), only a verdict is printed
        record = stages.validate_stage(ctx, p.name)
        print(f"  {p.name}: inputs valid ({len(record['inputs'])} confidential objects checked)")
    return 0


def demo_command(args: argparse.Namespace, api_ready: Callable[[], object]) -> int:
    """The synthetic census while the temporary Prefect server starts, then the release: every demo product,
    the products' subflows side by side on this machine's cores (``product_lanes``)."""
    from dasflow.demo import prepare_demo
    from dasflow.flows.release import run_release

    t0 = time.perf_counter()
    cfg = prepare_demo(Path(args.store), persons=args.persons, seed=args.seed)
    gx.warm_up()  # validation is the flow's first stage: GX's import overlaps the wait for the Prefect server
    api_ready()
    _settle(args)  # what is loaded so far lives to the end: the run's collections need not scan it again
    run_release(cfg, product_lanes=os.cpu_count() or 1)
    ctx = open_run(cfg.release_id, cfg.store)
    _report(ctx, time.perf_counter() - t0)
    if cfg.account is not None:
        print(f"privacy-loss account: dasflow account show {cfg.account} --store {cfg.store}")
    return 0


def _settle(args: argparse.Namespace) -> None:
    """``gc.freeze()`` when the command owns its process (the console script, ``args.own_process``): what
    exists now lives until the process ends, so later collections skip it (demo: generation-2 collections
    2.0 -> 1.1 s). Not for a caller of ``dasflow.cli.main(argv)``, whose collector is left alone."""
    if getattr(args, "own_process", False):
        gc.freeze()


def run(args: argparse.Namespace) -> int:
    flow_command = args.command in temporary_api.FLOW_COMMANDS
    api = temporary_api.launch() if flow_command else None  # before Prefect (or the one launched earlier)
    quiet_console_tracebacks()
    handlers = {"run": run_command, "resume": resume_command, "validate": validate_command, "demo": demo_command}
    _settle(args)  # the imports (Prefect, pandas, the products) live to the end: no collection rescans them
    with temporary_api.serving_flows(api) as api_ready:
        return handlers[args.command](args, api_ready)
