"""Validation of every input, config and output of a release (Great Expectations 1.x suites, fail closed).

Public API (GX is imported lazily, on first validation):

- :func:`run_product_suite(product, confidential, public, config) <validation.products.run_product_suite>`
  → :class:`ValidationResult` (``.success``, ``.summary``, ``.html``, ``.error``: ``InputError`` with file,
  row, column; ``.raise_for_failure()``).
- :func:`validate_outputs(release_dir_or_frames, plan_record, configs=None) <validation.outputs.validate_outputs>`.
- :func:`validate_product_config`, :func:`validate_release_config` (every config format).
- :func:`check_delimited` (phase-0 preflight of a delimited file), :func:`store_results` (JSON + Data Docs
  HTML under ``runs/{id}/validation/``), :mod:`validation.adapters` (the DAG's validate gate).
"""

from __future__ import annotations

from typing import Any

from validation.result import ValidationResult

__all__ = ["ValidationResult", "check_delimited", "run_product_suite", "store_results", "validate_outputs",
           "validate_product_config", "validate_release_config"]


def __getattr__(name: str) -> Any:  # lazy: importing ``validation`` stays cheap
    import importlib

    where = {"run_product_suite": "validation.products", "validate_outputs": "validation.outputs",
             "validate_product_config": "validation.configs", "validate_release_config": "validation.configs",
             "check_delimited": "validation.preflight", "store_results": "validation.wrap"}
    if name in where:
        return getattr(importlib.import_module(where[name]), name)
    raise AttributeError(name)
