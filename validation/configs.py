"""Config validation for every format: the native release config, the Census PHSafe and SafeTab-P production
configs, and the group-size config — keys, types, budgets, thresholds, state filters, PR rules.

Each product config is parsed by the product's own exact parser (budgets as ``Fraction`` through
``accounting.parse_budget``: non-negative, finite unless the JSON says ``Infinity``, never NaN, never rounded);
this module adds what those parsers leave open — unknown keys (a typo such as ``privacy_budget_p_level_1_stat``
would otherwise silently mean "budget 0, not tabulated"), ``Infinity`` only where a budget is allowed, and the
release's universe against every product's own universe — and turns every error into ``InputError`` naming the
file and the key (as ``column``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.privacy import accounting

#: keys the SafeTab-P production config may carry (safetab-p-production.md)
SAFETAB_LEVEL_SUFFIXES = ("usa", "state", "county", "tract", "place", "aiannh", "pr_state", "pr_county",
                          "pr_tract", "pr_place")
SAFETAB_KEYS = frozenset({
    *(f"privacy_budget_p_level_{lv}_{s}" for lv in (1, 2) for s in SAFETAB_LEVEL_SUFFIXES),
    "privacy_budget_p_stage_1_fraction", "thresholds_p", "zero_suppression_chance", "allow_negative_counts",
    "run_us", "run_pr", "max_race_codes", "privacy_defn", "reader", "state_filter_us",
    "ignore_region_granularity"})  # dasflow's opt-out of the Census region granularity (docs/safetab_p.md)
SAFETAB_REQUIRED = frozenset({"max_race_codes", "privacy_budget_p_stage_1_fraction", "thresholds_p",
                              "privacy_defn"})
GROUPSIZE_KEYS = frozenset({"budget", "privacy_defn", "mechanism", "k", "level_shares", "window_multiplier"})
GROUPSIZE_REQUIRED = frozenset({"budget", "privacy_defn", "mechanism"})


def _walk_infinity(value: Any, path: str, allowed: str, source: str) -> None:
    """``Infinity`` (an infinite budget) is allowed only in budget keys (names starting ``allowed``)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            _walk_infinity(v, f"{path}.{k}" if path else str(k), allowed, source)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _walk_infinity(v, f"{path}[{i}]", allowed, source)
    elif (((isinstance(value, Decimal) and not value.is_finite()) or value in ("Infinity", "-Infinity"))
          and (not path.startswith(allowed) or str(value).startswith("-"))):
        raise InputError(f"{value} is not allowed here (only budgets may be Infinity)", file=source,
                         column=path)


def _keys(raw: Mapping[str, Any], allowed: frozenset[str], required: frozenset[str], source: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise InputError(f"unknown key(s): {', '.join(unknown)}", file=source, column=unknown[0])
    missing = sorted(required - set(raw))
    if missing:
        raise InputError(f"missing required key(s): {', '.join(missing)}", file=source, column=missing[0])


def _decode(text: str, source: str) -> Any:
    try:
        raw = accounting.load_json_exact(text)
    except ValueError as exc:
        raise InputError(f"not valid JSON: {exc}", file=source) from None
    if not isinstance(raw, Mapping):
        raise InputError("a config is a JSON object", file=source)
    return raw


#: the products' own adapters (their ``load_config`` is the exact parser)
OWN_ADAPTERS = {"phsafe": "dasflow.pipeline.adapters.phsafe", "safetab-p": "dasflow.pipeline.adapters.safetab_p",
                "groupsize": "dasflow.pipeline.adapters.groupsize", "topdown": "dasflow.pipeline.adapters.topdown"}


def _own_loader(product: str) -> Callable[[str, str], Any]:
    """The product's own ``load_config`` (importing an adapter module registers it: keep the registry as is)."""
    import importlib

    from dasflow.pipeline.adapters import REGISTRY, get_adapter

    if product not in OWN_ADAPTERS:
        return get_adapter(product).load_config
    before = dict(REGISTRY)
    module = importlib.import_module(OWN_ADAPTERS[product])
    REGISTRY.clear()
    REGISTRY.update(before)
    loader: Callable[[str, str], Any] = module.ADAPTER.load_config
    return loader


def validate_product_config(product: str, text: str, universe: str, source: str | None = None,
                            loader: Callable[[str, str], Any] | None = None) -> Any:
    """Validate one product config (verbatim text) for a release universe; return the loaded config.

    ``loader`` is the product's own ``load_config`` (default: the shipped adapter's)."""
    src = source or f"{product} config"
    raw = _decode(text, src)
    if product == "safetab-p":
        _keys(raw, SAFETAB_KEYS, SAFETAB_REQUIRED, src)
        _walk_infinity(raw, "", "privacy_budget_p_level_", src)
    elif product == "groupsize":
        _keys(raw, GROUPSIZE_KEYS, GROUPSIZE_REQUIRED, src)
        _walk_infinity(raw, "", "\0", src)  # a group-size release never has an infinite budget
    elif product == "phsafe":
        _walk_infinity(raw, "", "privacy_budget.", src)  # keys, types: PHSafe's parser is already strict
    try:
        return (loader or _own_loader(product))(text, universe)
    except InputError as exc:
        if exc.file is None or exc.file == f"{product} config":
            raise InputError(str(exc).split(": ", 1)[-1], file=src, row=exc.row, column=exc.column) from None
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        raise InputError(f"{type(exc).__name__}: {exc}", file=src) from None


def validate_release_config(raw: Mapping[str, Any] | str, source: str = "<release config>") -> ReleaseConfig:
    """The native release config and every product config in it (universe rules included)."""
    obj = _decode(raw, source) if isinstance(raw, str) else raw
    if isinstance(raw, str):
        obj = {k: (str(v) if isinstance(v, Decimal) else v) for k, v in obj.items()}
    cfg = parse_release_config(dict(obj), source=source)
    for p in cfg.products:
        validate_product_config(p.name, p.config_text, cfg.universe, source=p.source or f"{source}: {p.name}")
    return cfg
