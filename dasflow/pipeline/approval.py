"""The approval gate's library half (no Prefect): what an operator approves, and the audit record of who did.

A release started from a deployment (the UI form, a schedule, an automation) stops after its plan is frozen
and reserved from the account, and before any noise is drawn: ``flows/approval.py`` shows :func:`plan_summary`
in the Prefect UI and waits for an operator. The decision is written create-only to
``runs/{id}/approval.json``, bound to the SHA-256 of the frozen ``ledger/plan.json``; a resume of an approved
release finds that record and goes on without asking again, and a record for another plan is refused.

Privacy argument: the gate spends nothing and draws nothing; it only delays the draws of an already frozen,
already reserved plan. The numbers shown are the plan's own (data-independent) budgets, never data.
"""

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from fractions import Fraction
from typing import Any

from dasflow.errors import DasflowError, LedgerRefusal
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext
from dasflow.privacy import account
from dasflow.privacy.composition import compose_plan


class NotApproved(DasflowError):
    """An operator rejected the release's plan (nothing was drawn; the account reservation can be returned with
    ``dasflow account abandon``)."""


def approval_key(ctx: RunContext) -> str:
    return f"{ctx.root}/approval.json"


def _plan_sha256(ctx: RunContext) -> str:
    return ctx.store.sha256(f"{ctx.root}/ledger/plan.json")


def plan_summary(ctx: RunContext) -> dict[str, Any]:
    """The frozen plan as an operator approves it: per product its own budget and, with an account, the budget
    converted to the account's relation; the release total and cap; the account's reservation and what remains;
    the RNG mode. Data-independent: read from the frozen plan and the account chain only."""
    total = ctx.ledger.plan_record()["total"]
    products: dict[str, dict[str, Any]] = {}
    specs = {p.name: stages.product_specs(ctx, p.name) for p in ctx.config.products}
    for name, own in specs.items():
        products[name] = {"keys": len(own), "rho": str(compose_plan(own).rho), "converted_rho": None}
    summary: dict[str, Any] = {
        "release_id": ctx.release_id, "universe": ctx.config.universe, "config_sha256": ctx.config_sha256,
        "plan_sha256": _plan_sha256(ctx), "rng_mode": ctx.config.rng.mode, "test_release": ctx.config.is_test,
        "total_rho": total["rho"], "epsilon_at_delta": total.get("epsilon_at_delta"),
        "cap_rho": ctx.config.cap.rho, "account": None, "products": products}
    if ctx.config.account is not None:
        acct = account.load_account(ctx.store, ctx.config.account)
        charge, breakdown = account.plan_charge(acct, [s for own in specs.values() for s in own])
        for name, info in breakdown.items():
            products[name]["converted_rho"] = info["converted"]["rho"]
        shown = account.summary(ctx.store, ctx.config.account)
        summary["account"] = {"name": acct.name, "unit": acct.unit, "relation": acct.relation,
                              "cap": str(acct.cap), "reserved_for_release": str(charge),
                              "spent_after_reservation": shown["spent"], "remaining": shown["remaining"]}
    return summary


def _num(text: str | None) -> str:
    if text in (None, "None"):
        return "—"
    value = Fraction(str(text))
    return f"{text}" if value.denominator == 1 else f"{text} (≈ {float(value):.6g})"


def plan_markdown(summary: dict[str, Any]) -> str:
    """The plan as the markdown the Prefect UI shows on the approval form and as an artifact."""
    lines = [f"# Approve release `{summary['release_id']}` ({summary['universe']})", "",
             f"RNG mode: **{summary['rng_mode']}**" + (" — a TEST release, never publishable as production"
                                                       if summary["test_release"] else ""), "",
             "| product | keys | budget (rho) | converted to the account's relation (rho) |", "|---|---:|---:|---:|"]
    for name, info in summary["products"].items():
        lines.append(f"| {name} | {info['keys']} | {_num(info['rho'])} | {_num(info['converted_rho'])} |")
    lines += ["", f"- release total: rho = {_num(summary['total_rho'])} "
                  f"(epsilon at delta = 1e-10: {summary['epsilon_at_delta']}); release cap rho = "
                  f"{_num(summary['cap_rho'])}"]
    acct = summary["account"]
    if acct is None:
        lines.append("- account: none (test releases only)")
    else:
        lines.append(f"- account `{acct['name']}` ({acct['relation']}, cap {acct['unit']} = {_num(acct['cap'])}): "
                     f"this release reserves {_num(acct['reserved_for_release'])}; remaining after it: "
                     f"**{_num(acct['remaining'])}**")
    lines += ["", f"Frozen plan SHA-256 `{summary['plan_sha256']}`. Nothing has been drawn. Approve to draw the "
                  "noise of exactly this plan; reject to stop (the reservation can then be returned with "
                  "`dasflow account abandon`)."]
    return "\n".join(lines) + "\n"


def read_approval(ctx: RunContext) -> dict[str, Any] | None:
    """The release's approval record, verified against the frozen plan (``None``: not decided yet)."""
    key = approval_key(ctx)
    if not ctx.store.exists(key):
        return None
    record: dict[str, Any] = json.loads(ctx.store.get(key))
    if record.get("plan_sha256") != _plan_sha256(ctx):
        raise LedgerRefusal(f"{ctx.store.uri}/{key}: approves another plan than the frozen ledger/plan.json")
    return record


def record_decision(ctx: RunContext, *, approved: bool, approver: str, comment: str = "",
                    flow_run_id: str | None = None, via: str = "prefect-ui") -> dict[str, Any]:
    """Write the decision create-only (the first decision on a plan stands) and return the record that stands."""
    record = {"release_id": ctx.release_id, "config_sha256": ctx.config_sha256, "plan_sha256": _plan_sha256(ctx),
              "approved": approved, "approver": approver, "comment": comment, "via": via,
              "flow_run_id": flow_run_id, "host": socket.gethostname(), "process": os.getpid(),
              "decided_at": datetime.now(UTC).isoformat(timespec="seconds")}
    data = (json.dumps(record, sort_keys=True, indent=1) + "\n").encode()
    ctx.store.put_if_absent(approval_key(ctx), data)
    stood = read_approval(ctx)
    assert stood is not None
    return stood


def require_approved(record: dict[str, Any] | None, release_id: str) -> None:
    """Refuse to go on unless the record approves the plan."""
    if record is None or not record.get("approved"):
        who = f" by {record['approver']}" if record else ""
        raise NotApproved(f"release {release_id}: the plan was not approved{who}; nothing was drawn")
