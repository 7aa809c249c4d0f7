"""The product plugin registry: the one place where product modules are named (as strings).

Every consumer — validation, the pipeline, the release stage, the demo, the budget tools, the CLI — asks this
registry for a product's plugin (:class:`dasflow.products.plugin.ProductPlugin`) and never names a product or
imports a product module itself. Adding a product is one package exposing ``PLUGIN`` plus one line in
:data:`PLUGINS` (or, without editing dasflow, ``DASFLOW_PRODUCTS="name=module"`` in the environment, or
:func:`register`).

The registry sits at the bottom of the layer stack (it imports no product statically: a plugin module is imported
by name on first use), so any layer may look a product up without an import loop.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from dasflow.errors import InputError

if TYPE_CHECKING:
    from dasflow.products.plugin import ProductPlugin

#: product name -> module defining ``PLUGIN`` (the products dasflow ships)
PLUGINS: dict[str, str] = {
    "phsafe": "dasflow.products.phsafe.plugin",
    "safetab-p": "dasflow.products.safetab_p.plugin",
    "groupsize": "dasflow.products.groupsize.plugin",
    "topdown": "dasflow.products.topdown.plugin",
    "matrix": "dasflow.products.matrix.plugin",
}


def register(name: str, module: str) -> None:
    """Register a product plugin module under ``name`` for this process (tests, embedding applications)."""
    PLUGINS[name] = module


def _environment() -> dict[str, str]:
    """Extra products from ``DASFLOW_PRODUCTS`` ("name=module,name2=module2"): how an agency plugs in a product
    of its own without editing dasflow."""
    out = {}
    for item in filter(None, os.environ.get("DASFLOW_PRODUCTS", "").split(",")):
        name, _, module = item.partition("=")
        out[name.strip()] = module.strip()
    return out


def names() -> list[str]:
    """Every registered product name (shipped first, in registry order, then the environment's)."""
    return list(dict.fromkeys([*PLUGINS, *_environment()]))


def get_plugin(name: str) -> ProductPlugin[Any]:
    """The plugin of a registered product; ``InputError`` (naming ``products.name``) for an unknown name."""
    module = PLUGINS.get(name) or _environment().get(name)
    if module is None:
        raise InputError(f"unknown product {name!r}; known: {sorted(names())}", column="products.name")
    plugin: ProductPlugin[Any] = importlib.import_module(module).PLUGIN
    if plugin.name != name:
        raise InputError(f"module {module} registers product {plugin.name!r}, not {name!r}", column="products.name")
    return plugin


def plugins() -> list[ProductPlugin[Any]]:
    """Every registered product's plugin (imports each plugin module)."""
    return [get_plugin(n) for n in names()]
