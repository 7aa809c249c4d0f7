"""``dasflow status`` and ``dasflow ledger`` (read-only views of a release), ``dasflow postprocess`` (post-process
and release again from the committed noisy measurements: spends nothing) and ``dasflow publish`` (copy a finished
release outside the store). No Prefect needed: the same library functions the operator flows wrap."""

from __future__ import annotations

import argparse
import json
from typing import Any

import pandas as pd

from dasflow.pipeline import stages
from dasflow.pipeline.run import open_run
from dasflow.release.operator import rerun_postprocess
from dasflow.release.publish import publish

DEFAULT_STORE = "dasflow-store"


def _store(args: argparse.Namespace) -> str:
    return str(args.store or DEFAULT_STORE)


def status_command(args: argparse.Namespace) -> int:
    st = stages.status(open_run(args.release_id, _store(args)))
    print(f"release {st['release_id']} in {st['store']}: {'RELEASED' if st['released'] else 'not released'}")
    for product, done in st["products"].items():
        marks = "  ".join(f"{stage}:{'done' if ok else 'pending'}" for stage, ok in done.items())
        print(f"  {product:12s} {marks}")
    if st["planned"] is not None:
        print(f"  ledger: planned rho = {st['planned']['rho']} ({st['planned']['entries']} keys); "
              f"spent rho = {st['spent']['rho']} ({st['spent']['entries']} keys committed)")
    else:
        print("  ledger: no plan frozen yet")
    return 0


def ledger_command(args: argparse.Namespace) -> int:
    ctx = open_run(args.release_id, _store(args))
    stages.verify_release(ctx)  # a read-only view reports nothing from a tampered chain
    rows: list[dict[str, Any]] = ctx.ledger.audit()
    if args.format == "json":
        plan = ctx.ledger.plan_record()  # audit: per key relation, whole-vector sensitivity, noise, conversions
        print(json.dumps({"plan_total": plan["total"], "spent": ctx.ledger.spent().as_record(), "entries": rows,
                          "audit": plan.get("audit", {}), "account": ctx.config.account}, indent=1,
                         sort_keys=True))
    elif args.format == "csv":
        print(stages.ledger_csv(ctx), end="")
    else:
        frame = pd.DataFrame(rows)[["product", "key", "privacy_defn", "mechanism", "budget", "noise", "state"]]
        print(frame.to_string(index=False))
        total = ctx.ledger.plan_record()["total"]
        print(f"planned rho = {total['rho']}, epsilon(delta=1e-10) = {total['epsilon_at_delta']}; "
              f"spent rho = {ctx.ledger.spent().as_record()['rho']}")
    return 0


def postprocess_command(args: argparse.Namespace) -> int:
    """Recompute post-processing + release from the stored noisy measurements; the ledger is checked unchanged,
    object for object (so no privacy budget is spent), else ``LedgerRefusal`` (exit 3)."""
    result = rerun_postprocess(open_run(args.release_id, _store(args)))
    print(f"release {args.release_id}: post-processing and release redone, {result['files']} files; ledger "
          f"unchanged ({result['ledger_objects']} objects, spent rho = {result['spent']['rho']})")
    return 0


def publish_command(args: argparse.Namespace) -> int:
    """Publish a finished release to ``--target`` (refused inside the store's bucket or directory)."""
    record = publish(open_run(args.release_id, _store(args)), args.target, test_publication=args.test_publication)
    print(f"release {args.release_id} published ({record['kind']}): {record['files']} files under "
          f"{args.target.rstrip('/')}/{record['location']}")
    return 0


def run(args: argparse.Namespace) -> int:
    handlers = {"status": status_command, "ledger": ledger_command, "postprocess": postprocess_command,
                "publish": publish_command}
    if args.command not in handlers:
        raise SystemExit(f"dasflow.commands.release cannot run {args.command!r}")
    return handlers[args.command](args)
