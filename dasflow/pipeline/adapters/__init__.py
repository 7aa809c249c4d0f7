"""Product adapters: how the pipeline reads each product's config and inputs from a release's store.

An adapter is the only product-specific code the pipeline has; adding a product to the DAG means implementing
the Product interface (``dasflow.products.base``) and an adapter registered in ``REGISTRY``.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore
from dasflow.products.base import Product


class InputDeclaration(NamedTuple):
    """One input a product reads: its name in the release config's ``inputs``, its default prefix, and whether
    it holds confidential data (``dasflow.pipeline.inputs``: undeclared config inputs count as confidential)."""

    name: str
    default: str
    confidential: bool


class Adapter(Protocol):
    """What the pipeline needs to run one product inside a release."""

    name: str
    #: every input the product reads (which are confidential is decided here, never by a path prefix)
    input_declarations: tuple[InputDeclaration, ...]

    def product(self, config: Any) -> Product:
        """The product object for a loaded config."""
        ...

    def load_config(self, text: str, universe: str) -> Any: ...

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        """Public inputs (geography, code lists): may be read by every stage, including post-processing."""
        ...

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        """Confidential inputs: read only by validate, preprocess and measure."""
        ...

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: Any) -> dict[str, Any]:
        """Fail-closed input validation: raise ``InputError`` naming file, row and column; return a summary."""
        ...

    def file_name(self, table: str, universe: str) -> str:
        """The release file name of one of the product's tables (as the Census published it)."""
        ...


#: product name -> module holding ``ADAPTER`` (the products dasflow ships). The input-validating products go
#: through the validation gate of ``validation/`` (Great Expectations suites and file pre-checks wrapped around
#: the product adapter): its ``validate`` fails closed before any noise.
REGISTRY: dict[str, str] = {
    "phsafe": "validation.adapters.phsafe",
    "safetab-p": "validation.adapters.safetab_p",
    "groupsize": "validation.adapters.groupsize",
    "topdown": "validation.adapters.topdown",
    "matrix": "dasflow.pipeline.adapters.matrix",
}


def register(name: str, module: str) -> None:
    REGISTRY[name] = module


def _plugins() -> dict[str, str]:
    """Extra products from ``DASFLOW_PRODUCTS`` ("name=module,name2=module2"): how an agency plugs in a product
    of its own without editing dasflow (the module defines ``ADAPTER``)."""
    out = {}
    for item in filter(None, os.environ.get("DASFLOW_PRODUCTS", "").split(",")):
        name, _, module = item.partition("=")
        out[name.strip()] = module.strip()
    return out


def get_adapter(name: str) -> Adapter:
    """The adapter of a registered product; ``InputError`` for an unknown product name."""
    module = REGISTRY.get(name) or _plugins().get(name)
    if module is None:
        raise InputError(f"unknown product {name!r}; known: {sorted(REGISTRY | _plugins())}", column="products.name")
    adapter: Adapter = importlib.import_module(module).ADAPTER
    return adapter
