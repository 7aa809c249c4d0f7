"""``dasflow budget CONFIG [--format auto|release|PRODUCT] [--json]``: the budget plan, no data read.

Per product and level: definition, budget, noise and variance; totals per universe as exact ρ (pure-DP parts
count ε²/2) and ε at δ = 1e-10 by the accounting module's sound conversions (the method is printed). A product's
Census production config is read as-is and planned by its plugin (``budget_format`` recognises it,
``budget_plan`` plans it from the config alone). A release config plans every product through its plugin
(public inputs only, never ``confidential/``) and goes through the ledger's one cap check
(``ledger.check_plan``, as ``dasflow validate`` and freezing): an over-cap plan is refused (exit 3).
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path
from typing import Any, cast

from dasflow import registry
from dasflow.config import load_release_config
from dasflow.errors import InputError
from dasflow.io.store import open_store
from dasflow.pipeline import stages
from dasflow.pipeline.run import RunContext
from dasflow.privacy import accounting
from dasflow.privacy.ledger import Ledger, check_plan
from dasflow.products.plugin import budget_text

Row = dict[str, Any]


def _detect(path: Path) -> str:
    """``release`` for a release config, else the first product whose plugin claims the config (``budget_format``:
    a directory is passed as None)."""
    raw: Any = None
    if not path.is_dir():
        try:
            raw = accounting.load_json_exact(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read config: {exc}", file=str(path)) from None
        if not isinstance(raw, dict):
            raise InputError("cannot tell the config format; pass --format", file=str(path))
        if "release_id" in raw:
            return "release"
    for plugin in registry.plugins():
        if plugin.budget_format(raw):
            return plugin.name
    raise InputError("cannot tell the config format; pass --format", file=str(path))


def _total(definitions: list[tuple[str, Fraction | None]]) -> Row:
    spends = [accounting.Spend(definition=cast(accounting.Definition, d), budget=b, label=f"k{i}")
              for i, (d, b) in enumerate(definitions)]
    if not spends:
        return {"rho": "0", "epsilon_pure": None, "epsilon_at_delta": "0", "conversion": "empty plan"}
    total = accounting.compose(spends, rdp=False)
    best = total.best
    return {"rho": budget_text(total.rho), "epsilon_pure": budget_text(total.epsilon) if total.is_pure else None,
            "epsilon_at_delta": None if best is None else f"{best.epsilon:.6f}",
            "conversion": "infinite budget: no guarantee" if best is None else best.method}


def product_budget(name: str, path: Path) -> dict[str, Any]:
    """One product's production config, planned by its plugin (``budget_plan``), with per-universe totals."""
    plan = registry.get_plugin(name).budget_plan(path)
    return {"rows": plan.rows, "totals": {universe: _total(parts) for universe, parts in plan.parts.items()}}


def release_budget(path: Path) -> dict[str, Any]:
    cfg = load_release_config(path)
    store = open_store(cfg.store)
    ctx = RunContext(store=store, config=cfg, config_sha256=cfg.sha256(), ledger=Ledger(store, cfg.release_id))
    specs = [s for p in cfg.products for s in stages.product_specs(ctx, p.name)]
    rows = [{"product": s.product, "universe": cfg.universe, "key": s.key, "level": s.level,
             "definition": s.privacy_defn, "budget": budget_text(s.budget), "sensitivity": str(s.sensitivity),
             "noise": str(s.noise), "variance": str(s.variance), "cells": s.cells} for s in specs]
    total = check_plan(specs, ctx.cap).as_record()  # the one cap check (refuses an over-cap plan)
    total["cap_rho"] = cfg.cap.rho
    return {"rows": rows, "totals": {cfg.universe: total}}


def run(args: argparse.Namespace) -> int:
    path = Path(args.config)
    if not path.exists():
        raise InputError("no such file or directory", file=str(path))
    fmt = _detect(path) if args.format == "auto" else args.format
    result = release_budget(path) if fmt == "release" else product_budget(fmt, path)
    result["format"] = fmt
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    rows = result["rows"]
    cols = [c for c in ("product", "universe", "key", "definition", "budget", "noise", "variance") if
            any(c in r for r in rows)]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols} if rows else {}
    print("  ".join(c.ljust(widths[c]) for c in cols))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols))
    for universe, t in result["totals"].items():
        pure = f", epsilon = {t['epsilon_pure']}" if t.get("epsilon_pure") else ""
        print(f"total {universe}: rho = {t['rho']}{pure}; epsilon(delta=1e-10) = {t['epsilon_at_delta']} "
              f"({t['conversion']})")
    return 0
