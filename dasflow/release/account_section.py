"""The certificate's account section: per product its neighbouring relation, its budget in that relation and
converted to the account's, the invariants it releases exactly, and the account's lifetime spend.

Conversions come from ``dasflow.privacy.relations`` (proved and tested there); totals and (ε, δ) figures from
``accounting.compose`` (sequential composition; the smallest sound conversion is stated with its method). A
release without an account (test releases only) is shown converted to add/remove-one-person for reference.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from fractions import Fraction

from dasflow.errors import IntegrityError
from dasflow.pipeline.run import RunContext
from dasflow.privacy import account as accounts
from dasflow.privacy import accounting, relations
from dasflow.privacy.ledger import frac_str, spec_from_record
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.release.document import Block, Bullets, Heading, Table

DELTA = Fraction(1, 10**10)


def _total(specs: Sequence[MeasurementSpec]) -> accounting.Total:
    spends = [accounting.Spend(definition=s.privacy_defn, budget=s.budget, label=s.key) for s in specs]
    return accounting.compose(spends, DELTA, rdp=any(s.privacy_defn == "puredp" for s in specs))


def _budget(total: accounting.Total) -> str:
    if total.is_infinite:
        return "∞"
    text = f"ρ = {frac_str(total.rho)}"
    return text + (f", ε = {frac_str(total.epsilon)}" if total.is_pure else "")


def _eps(total: accounting.Total) -> str:
    best = total.best
    return "no guarantee" if best is None else f"ε = {best.epsilon:.6f} at δ = 1e-10 ({best.method})"


def account_blocks(ctx: RunContext) -> list[Block]:
    """The section (see the module docstring)."""
    plan = ctx.ledger.plan_record()
    specs = [spec_from_record(e) for e in plan["entries"]]
    audit = plan.get("audit", {})
    name = ctx.config.account
    acct = accounts.load_account(ctx.store, name) if name is not None else None
    relation = acct.relation if acct is not None else relations.ADD_REMOVE
    rows = []
    converted: list[MeasurementSpec] = []
    for product in dict.fromkeys(s.product for s in specs):
        own = [s for s in specs if s.product == product]
        decl = relations.declared(product)
        recorded = [audit.get(s.key, {}).get("conversions", {}).get(relation) for s in own]
        if decl is None or any(r is None for r in recorded):
            rows.append((product, "undeclared" if decl is None else decl.relation, _budget(_total(own)),
                         "not recorded in the frozen plan", "—", "not declared" if decl is None else
                         ", ".join(decl.invariants) or "none"))
            continue
        # the conversion frozen with the plan (it needs each key's detail, which the plan entry does not keep)
        conv = [dataclasses.replace(s, budget=None if r["budget"] == "Infinity" else Fraction(r["budget"]))
                for s, r in zip(own, recorded, strict=True) if r is not None]
        converted += conv
        arguments = sorted({r["argument"] for r in recorded if r is not None})
        rows.append((product, decl.relation, _budget(_total(own)), "; ".join(arguments), _budget(_total(conv)),
                     ", ".join(decl.invariants) or "none"))
    blocks: list[Block] = [
        Heading(f"Neighbouring relation and privacy-loss account ({relation})"),
        Table(("product", "product's relation", "budget (own relation)", "conversion",
               f"budget ({relation})", "invariants released exactly"), tuple(rows)),
    ]
    release_total = _total(converted)
    lines = [f"this release under {relation}: {_budget(release_total)}; {_eps(release_total)}"]
    if acct is None:
        lines.append("account: none (a test release spends from no account)")
    else:
        chain = accounts.read_chain(ctx.store, acct.name)
        mine = accounts.reservation(chain, ctx.release_id)[0]
        if mine is None:
            raise IntegrityError(f"release {ctx.release_id} holds no reservation on account {acct.name}")
        # the account as it stood when this release was admitted (its slot): a fixed fact of the release, so a
        # re-run of the release stage writes the same certificate whatever was reserved afterwards
        upto = chain[:mine.seq + 1]
        eps, method = accounts.lifetime_epsilon(acct, upto)
        lines += [
            f"account `{acct.name}` (universe {acct.universe}): lifetime cap {acct.unit} = {acct.cap}",
            f"this release reserved {acct.unit} = {mine.amount} (slot {mine.seq})",
            f"account lifetime spend including this release (at its slot): {acct.unit} = {mine.cumulative}, "
            f"remaining {acct.cap - mine.cumulative}; ε = {'—' if eps is None else f'{eps:.6f}'} at δ = 1e-10 "
            f"({method})",
        ]
    blocks.append(Bullets(tuple(lines)))
    return blocks
