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

from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Protocol

from dasflow.config import ReleaseConfig, parse_release_config
from dasflow.errors import InputError
from dasflow.privacy import accounting
from dasflow.registry import get_plugin


def check_infinity(value: Any, path: str, allowed: str, source: str) -> None:
    """``Infinity`` (an infinite budget) is allowed only in budget keys (names starting ``allowed``)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            check_infinity(v, f"{path}.{k}" if path else str(k), allowed, source)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_infinity(v, f"{path}[{i}]", allowed, source)
    elif (((isinstance(value, Decimal) and not value.is_finite()) or value in ("Infinity", "-Infinity"))
          and (not path.startswith(allowed) or str(value).startswith("-"))):
        raise InputError(f"{value} is not allowed here (only budgets may be Infinity)", file=source,
                         column=path)


def check_keys(raw: Mapping[str, Any], allowed: frozenset[str], required: frozenset[str], source: str) -> None:
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


class ConfigPlugin(Protocol):
    """What config validation needs of a product plugin (``dasflow.products.plugin.ProductPlugin``)."""

    @property
    def name(self) -> str: ...

    def check_config(self, raw: Mapping[str, Any], source: str) -> None: ...

    def load_config(self, text: str, universe: str) -> Any: ...


def validate_product_config(plugin: ConfigPlugin, text: str, universe: str, source: str | None = None) -> Any:
    """Validate one product config (verbatim text) for a release universe; return the loaded config.

    The plugin's ``check_config`` rules the raw keys (with :func:`check_keys` and :func:`check_infinity`), then its
    exact parser loads it; every error becomes an ``InputError`` naming the config and the key."""
    product = plugin.name
    src = source or f"{product} config"
    raw = _decode(text, src)
    plugin.check_config(raw, src)
    try:
        return plugin.load_config(text, universe)
    except InputError as exc:
        if exc.file is None or exc.file == f"{product} config":
            raise InputError(str(exc).split(": ", 1)[-1], file=src, row=exc.row, column=exc.column) from None
        raise
    except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
        raise InputError(f"{type(exc).__name__}: {exc}", file=src) from None


def validate_release_config(raw: Mapping[str, Any] | str, source: str = "<release config>") -> ReleaseConfig:
    """The native release config and every product config in it (universe rules included; each product by its
    registered plugin)."""
    obj = _decode(raw, source) if isinstance(raw, str) else raw
    if isinstance(raw, str):
        obj = {k: (str(v) if isinstance(v, Decimal) else v) for k, v in obj.items()}
    cfg = parse_release_config(dict(obj), source=source)
    for p in cfg.products:
        validate_product_config(get_plugin(p.name), p.config_text, cfg.universe,
                                source=p.source or f"{source}: {p.name}")
    return cfg
