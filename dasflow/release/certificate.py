"""The privacy certificate of a release, as Markdown and as a self-contained HTML page.

Built only from what the release froze — the ledger's plan record (every planned key's mechanism, sensitivity,
budget, noise scale and variance), the frozen config and its SHA-256, the committed ledger entries — and from
SHA-256 digests of the *public* inputs, read through the post-processing store view. Nothing in it is computed
from confidential data: a digest of a confidential input is itself a disclosure (it lets anyone who knows all
records but one test candidates for the last), so confidential digests never appear here. The frozen config's
SHA-256 is published: the config is not confidential (products, budgets, input locations, RNG mode).

Totals: the plan's entries compose sequentially (``dasflow.privacy.accounting.compose``: zCDP budgets add,
pure-DP entries count ε²/2; all-pure plans also add in ε) and are converted to (ε, δ = 1e-10) by every sound
conversion the accounting module offers; the certificate lists each with its method and states the smallest.
No conversion is re-implemented here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

from dasflow.pipeline.run import RunContext, code_version
from dasflow.privacy import accounting, rng
from dasflow.privacy.ledger import frac_str, spec_from_record
from dasflow.release.account_section import account_blocks
from dasflow.release.document import Block, Bullets, Heading, Para, Table, to_html, to_markdown

DELTA = Fraction(1, 10**10)
TEST_BANNER = "TEST RELEASE — seeded randomness; not a production release and never publishable as one."

def invariants(ctx: RunContext) -> list[str]:
    """What each product holds invariant (its plugin's ``invariants``: public statements or public values,
    given the public inputs read through the post-processing view, which cannot resolve confidential keys)."""
    out = []
    for p in ctx.config.products:
        out += ctx.plugin(p.name).invariants(ctx.post_public(p.name), ctx.product_config(p.name))
    return out


def input_digests(ctx: RunContext) -> dict[str, str]:
    """SHA-256 of every object under the release's **public** inputs, read through the post-processing view.

    Never a digest of a confidential input: a SHA-256 of a small confidential file lets anyone who knows all
    records but one test candidates for the last, voiding the DP guarantee. The confidential inputs' digests
    stay on the confidential side (the stage manifests and NMF bindings under ``runs/``)."""
    record = ctx.public_record()
    if record is not None:  # the digests frozen with the plan (every stage read the files checked against them)
        return dict(sorted(record["inputs"].items()))
    post = ctx.post_store()
    out: dict[str, str] = {}
    for _name, prefix in sorted(ctx.layout.public.items()):
        for key in post.list(prefix):
            out[key] = post.sha256(key)
    return out


def _total(entries: Sequence[Mapping[str, Any]]) -> accounting.Total:
    specs = [spec_from_record(e) for e in entries]
    spends = [accounting.Spend(definition=s.privacy_defn, budget=s.budget, label=s.key) for s in specs]
    has_pure = any(s.privacy_defn == "puredp" for s in specs)
    return accounting.compose(spends, DELTA, rdp=has_pure)


def _float(text: str) -> str:
    if text == "Infinity":
        return "∞"
    try:
        return f"{float(Fraction(text)):.6g}"
    except (ValueError, ZeroDivisionError):
        return text


def _noise_label(entry: Mapping[str, Any]) -> str:
    if entry["privacy_defn"] == "puredp":
        return f"b = {entry['noise']} ≈ {_float(entry['noise'])}"
    return f"σ² = {entry['noise']} ≈ {_float(entry['noise'])}"


def _sensitivity(plan: Mapping[str, Any], entry: Mapping[str, Any]) -> str:
    """The key's whole-vector sensitivity from the plan's audit record: Δ₂² (zCDP) or Δ₁ (pure DP) under the
    product's relation, the ``MeasurementSpec`` convention; a plan frozen before the audit record: as recorded."""
    audit = plan.get("audit", {}).get(entry["key"])
    if audit is None:
        return str(entry["sensitivity"])
    if "sensitivity_l2sq" in audit:
        return f"Δ₂² = {audit['sensitivity_l2sq']}"
    return f"Δ₁ = {audit['sensitivity_l1']}"


def _total_lines(total: accounting.Total) -> list[str]:
    if total.is_infinite:
        return ["total: infinite budget (no noise on some key): no privacy guarantee"]
    lines = [f"total ρ (zCDP) = {frac_str(total.rho)} ≈ {_float(frac_str(total.rho))}"]
    if total.is_pure:
        lines.append(f"total ε (pure DP, sequential composition) = {frac_str(total.epsilon)}")
    best = total.best
    for conv in total.conversions:
        if conv.sound:
            mark = " (smallest)" if conv is best else ""
            lines.append(f"ε at δ = 1e-10: {conv.epsilon:.6f} — {conv.method}{mark}")
    return lines


def certificate_blocks(ctx: RunContext) -> list[Block]:
    """The certificate's content (shared by both renderings)."""
    plan = ctx.ledger.plan_record()
    entries: list[dict[str, Any]] = list(plan["entries"])
    cfg = ctx.config
    blocks: list[Block] = []
    if cfg.is_test:
        blocks.append(Para(TEST_BANNER, strong=True))
    randomness = (f"seeded test generator (seed {cfg.rng.seed}) — TEST mode" if cfg.is_test
                  else f"CSPRNG: {rng.SOURCE} — production mode")
    cap = plan["cap"]
    total = _total(entries)
    spent = ctx.ledger.spent()
    blocks += [
        Heading(f"Privacy certificate: release `{ctx.release_id}`", 1),
        Bullets((
            f"universe: {cfg.universe}",
            f"randomness (RNG mode): {randomness}",
            f"code version: `{code_version()}`",
            f"frozen config SHA-256: `{ctx.config_sha256}`",
            f"privacy cap: ρ = {cap['rho']}" + (f", ε = {cap['epsilon']}" if cap.get("epsilon") else ""),
            f"products: {', '.join(p.name for p in cfg.products)}",
            "neighbouring datasets: each product's relation and its conversion to the account's are in "
            "the account section; the ledger's audit record gives each key's whole-vector sensitivity",
        )),
        Heading("Totals"),
        Bullets((*_total_lines(total),
                 f"spent (committed ledger entries): ρ = {frac_str(spent.rho)} over {spent.entries} of "
                 f"{len(entries)} planned keys")),
    ]
    products = list(dict.fromkeys(e["product"] for e in entries))
    for product in products:
        rows = [e for e in entries if e["product"] == product]
        blocks.append(Heading(f"Product `{product}`"))
        blocks.append(Bullets(tuple(_total_lines(_total(rows)))))
        levels = list(dict.fromkeys(e["level"] for e in rows))
        level_rows = []
        for level in levels:
            lrows = [e for e in rows if e["level"] == level]
            lt = _total(lrows)
            level_rows.append((level, str(len(lrows)), ", ".join(sorted({e["mechanism"] for e in lrows})),
                               frac_str(lt.rho), "" if not lt.is_pure else frac_str(lt.epsilon),
                               str(sum(int(e["cells"]) for e in lrows))))
        blocks.append(Table(("level", "keys", "mechanism", "ρ", "ε (pure DP)", "cells"), tuple(level_rows)))
        blocks.append(Table(
            ("key", "level", "definition", "mechanism", "whole-vector sensitivity (Δ₂² zCDP, Δ₁ pure DP)", "budget",
             "noise scale", "variance", "cells"),
            tuple((e["key"], e["level"], e["privacy_defn"], e["mechanism"], _sensitivity(plan, e), e["budget"],
                   _noise_label(e), _float(e["variance"]), str(e["cells"])) for e in rows)))
    blocks += account_blocks(ctx)
    blocks += [Heading("Invariants"), Bullets(tuple(invariants(ctx)))]
    blocks.append(Heading("Product configurations (SHA-256 of the verbatim text)"))
    blocks.append(Bullets(tuple(f"{p.name}: `{hashlib.sha256(p.config_text.encode()).hexdigest()}`"
                                for p in cfg.products)))
    digests = input_digests(ctx)
    blocks.append(Heading("Public inputs (SHA-256)"))
    blocks.append(Para("Confidential inputs are not listed: any digest of them would disclose information about "
                       "the records. Their integrity is bound on the confidential side (stage manifests and "
                       "noisy measurement files under runs/)."))
    blocks.append(Table(("object", "SHA-256"), tuple((f"`{k}`", f"`{v}`") for k, v in digests.items()))
                  if digests else Para("no input objects"))
    return blocks


def certificate(ctx: RunContext) -> tuple[str, str]:
    """``(markdown, html)`` of the release's privacy certificate. A test release says so on the first line of
    both (Markdown: the first line; HTML: the page title and a banner before everything else)."""
    blocks = certificate_blocks(ctx)
    md = to_markdown(blocks)
    body = blocks[1:] if ctx.config.is_test else blocks
    page = to_html(body, f"Privacy certificate: {ctx.release_id}",
                   banner=TEST_BANNER if ctx.config.is_test else None)
    return md, page
