"""The matrix product's input validation streamed (issue #20): the person records read in Parquet batches,
each checked by the product's own tabulation (every attribute code in its domain), so memory follows one batch.

Fail-closed argument: runs in the validate stage and draws no noise; a failure stops the release before
preprocessing. The summary holds a count only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from dasflow.errors import InputError
from dasflow.io.files import input_prefix
from dasflow.io.store import ObjectStore
from dasflow.products.matrix.config import MatrixConfig
from dasflow.products.matrix.product import MatrixProduct
from dasflow.products.plugin import InputChecks
from dasflow.validation.stream import parquet_chunks, shifted


def stream_checks(store: ObjectStore, inputs: Mapping[str, str], config: MatrixConfig,
                  chunk_rows: int) -> InputChecks:
    """The plugin's ``validate`` (``MatrixProduct.histogram`` on every record; rows numbered in the concatenated
    input, as before) batch by batch; summary ``{"records": n}``. No suites or facts, as before."""
    prefix = input_prefix(inputs, "matrix", "confidential/matrix/")
    product = MatrixProduct(config)
    summary: dict[str, Any] = {}
    error: list[InputError] = []
    records = 0
    try:
        for chunk in parquet_chunks(store, prefix, list(config.schema), chunk_rows, "Parquet record files"):
            frame = pd.DataFrame({c: pd.Series(v) if not hasattr(v, "to_pandas") else v.to_pandas()
                                  for c, v in chunk.columns.items()})
            shifted(lambda f=frame: product.histogram(f, prefix), chunk.offset)  # type: ignore[misc]
            records += len(frame)
    except InputError as exc:
        error.append(exc)

    def own() -> None:
        if error:
            raise error[0]
        summary["records"] = records

    return InputChecks(suites=[], facts=[], summary=summary, own=own)
