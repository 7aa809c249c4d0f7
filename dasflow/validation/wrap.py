"""Where a product's input validation result is kept: ``store_results`` writes the full result (every
expectation, counts, first failure) and its Data Docs page under ``runs/{id}/validation/``.

The pipeline's validate stage runs the gate itself (``plugin.preflight`` before each reader, then
:func:`dasflow.validation.products.run_product_suite`) and raises the first failure before preprocessing and
measurement, so a rejected input leaves the release with no prepared data, no ledger entry and no measurement.
The page may quote input values: it stays under ``runs/``, never in ``release/``.
"""

from __future__ import annotations

from dasflow.io.store import ObjectStore
from dasflow.validation.result import ValidationResult


def store_results(store: ObjectStore, root: str, product: str, result: ValidationResult) -> dict[str, str]:
    """Write ``{root}/validation/{product}.gx.json`` and ``{product}.html`` (atomic puts); key → sha256."""
    keys = {f"{root}/validation/{product}.gx.json": result.to_json().encode(),
            f"{root}/validation/{product}.html": result.html.encode()}
    return {k: store.put(k, v) for k, v in keys.items()}
