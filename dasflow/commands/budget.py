"""``dasflow budget CONFIG [--format auto|release|phsafe|safetab-p] [--json]``: the budget plan, no data read.

Per product and level: definition, budget, noise and variance; totals per universe as exact ρ (pure-DP parts
count ε²/2) and ε at δ = 1e-10 by the accounting module's sound conversions (the method is printed). Census
formats are read as-is: a PHSafe ``config.json`` plans both nothing but its own config; a SafeTab-P config (the
file or its PARAMETERS_DIR) gives each (region type, level) budget split between stage 1 (γ) and stage 2
(1 − γ), for each universe it runs. A release config plans every product through its adapter (public inputs
only, never ``confidential/``).
"""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal, cast

from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.privacy.composition import compose_plan

Row = dict[str, Any]


def _fmt(x: Fraction | None) -> str:
    return "Infinity" if x is None else str(x)


def _detect(path: Path) -> str:
    if path.is_dir():
        return "safetab-p"
    try:
        raw = accounting.load_json_exact(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read config: {exc}", file=str(path)) from None
    if isinstance(raw, dict):
        if "release_id" in raw:
            return "release"
        if "privacy_budget" in raw and "tau" in raw:
            return "phsafe"
        if any(str(k).startswith("privacy_budget_p_") for k in raw):
            return "safetab-p"
    raise InputError("cannot tell the config format; pass --format", file=str(path))


def _total(definitions: list[tuple[str, Fraction | None]]) -> Row:
    spends = [accounting.Spend(definition=cast(accounting.Definition, d), budget=b, label=f"k{i}")
              for i, (d, b) in enumerate(definitions)]
    if not spends:
        return {"rho": "0", "epsilon_pure": None, "epsilon_at_delta": "0", "conversion": "empty plan"}
    total = accounting.compose(spends, rdp=False)
    best = total.best
    return {"rho": _fmt(total.rho), "epsilon_pure": _fmt(total.epsilon) if total.is_pure else None,
            "epsilon_at_delta": None if best is None else f"{best.epsilon:.6f}",
            "conversion": "infinite budget: no guarantee" if best is None else best.method}


def phsafe_budget(path: Path) -> dict[str, Any]:
    from dasflow.products.phsafe import load_config, plan

    cfg = load_config(path)
    specs = plan(cfg)
    rows = [{"product": "phsafe", "universe": cfg.universe, "key": s.key, "level": s.level,
             "definition": s.privacy_defn, "budget": _fmt(s.budget), "sensitivity": str(s.sensitivity),
             "noise": str(s.noise), "variance": str(s.variance), "cells": s.cells} for s in specs]
    return {"rows": rows, "totals": {cfg.universe: _total([(s.privacy_defn, s.budget) for s in specs])}}


def safetab_budget(path: Path) -> dict[str, Any]:
    from dasflow.products.safetab_p import load_config, parse_config

    if path.is_dir():
        cfg = load_config(path)
    else:
        cfg = parse_config(accounting.load_json_exact(path.read_text(encoding="utf-8")), source=str(path))
    rows: list[Row] = []
    totals: dict[str, Row] = {}
    universes: tuple[tuple[Literal["US", "PR"], bool], ...] = (("US", cfg.run_us), ("PR", cfg.run_pr))
    for universe, runs in universes:
        if not runs:
            continue
        parts: list[tuple[str, Fraction | None]] = []
        for rt, lv in cfg.tabulated(universe):
            rho = cfg.budgets[(rt, lv)]
            for stage, share in ((1, cfg.gamma), (2, 1 - cfg.gamma)):
                b = None if rho is None else rho * share
                parts.append((cfg.privacy_defn, b))
                rows.append({"product": "safetab-p", "universe": universe, "key": f"{rt}/{lv}/stage{stage}",
                             "level": f"({rt}, {lv})", "definition": cfg.privacy_defn, "budget": _fmt(b)})
        totals[universe] = _total(parts)
    return {"rows": rows, "totals": totals}


def release_budget(path: Path) -> dict[str, Any]:
    from dasflow.config import load_release_config
    from dasflow.io.store import open_store
    from dasflow.pipeline import stages
    from dasflow.pipeline.run import RunContext
    from dasflow.privacy.ledger import Ledger

    cfg = load_release_config(path)
    store = open_store(cfg.store)
    ctx = RunContext(store=store, config=cfg, config_sha256=cfg.sha256(), ledger=Ledger(store, cfg.release_id))
    specs = [s for p in cfg.products for s in stages.product_specs(ctx, p.name)]
    rows = [{"product": s.product, "universe": cfg.universe, "key": s.key, "level": s.level,
             "definition": s.privacy_defn, "budget": _fmt(s.budget), "sensitivity": str(s.sensitivity),
             "noise": str(s.noise), "variance": str(s.variance), "cells": s.cells} for s in specs]
    total = compose_plan(specs).as_record()
    total["cap_rho"] = cfg.cap.rho
    return {"rows": rows, "totals": {cfg.universe: total}}


def run(args: argparse.Namespace) -> int:
    path = Path(args.config)
    if not path.exists():
        raise InputError("no such file or directory", file=str(path))
    fmt = _detect(path) if args.format == "auto" else args.format
    result = {"release": release_budget, "phsafe": phsafe_budget, "safetab-p": safetab_budget}[fmt](path)
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
