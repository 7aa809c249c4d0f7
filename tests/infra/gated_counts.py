"""The DAG test product ``counts`` (tests/plugin_product) with a gate in measurement, so an integration test can
kill the worker at a known point in the middle of a run (``DASFLOW_PRODUCTS=counts=tests.infra.gated_counts``).

When ``DASFLOW_TEST_GATE`` names a directory, measuring the ``state_sex`` level (after ``state`` was committed)
writes ``waiting`` (holding the flow-run process id) there and blocks until a file ``open`` exists. Without the
variable, or with ``open`` present, the product is exactly the counts product.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement
from tests.plugin_product.plugin import CountsPlugin
from tests.plugin_product.product import CountsProduct

GATED_LEVEL = "state_sex"


class GatedCountsProduct(CountsProduct):
    def measure(self, prepared: Any, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        gate = os.environ.get("DASFLOW_TEST_GATE")
        if gate and spec.level == GATED_LEVEL:
            root = Path(gate)
            (root / "waiting").write_text(f"{os.getpid()}\n")
            deadline = time.time() + 600
            while not (root / "open").exists():
                if time.time() > deadline:
                    raise TimeoutError(f"gate {root} was never opened")
                time.sleep(0.2)
        return super().measure(prepared, spec, rng)


class GatedCountsPlugin(CountsPlugin):
    def product(self, config: Any) -> GatedCountsProduct:
        return GatedCountsProduct()


PLUGIN = GatedCountsPlugin()
