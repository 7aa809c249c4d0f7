"""The DAG tests' product ``counts`` (the plugin package ``tests.plugin_product``), registered for this process
with the one line an agency adds for its own product; importing this module registers it."""

from __future__ import annotations

from dasflow import registry
from tests.plugin_product.plugin import PLUGIN, CountsPlugin
from tests.plugin_product.product import LEVELS, PERSONS, STATES, CountsProduct

registry.register("counts", "tests.plugin_product.plugin")

__all__ = ["LEVELS", "PERSONS", "PLUGIN", "STATES", "CountsPlugin", "CountsProduct"]
