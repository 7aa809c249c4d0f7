"""Validation of every input, config and output of a release (Great Expectations 1.x suites, fail closed).

Generic machinery only: what each product checks comes from its plugin (``dasflow.products.<p>.checks``,
reached through ``dasflow.registry``). Public API (GX itself is imported lazily, on first validation, by
:mod:`dasflow.validation.gx`):

- :func:`run_product_suite(plugin, confidential, public, config) <validation.products.run_product_suite>`
  → :class:`ValidationResult` (``.success``, ``.summary``, ``.html``, ``.error``: ``InputError`` with file,
  row, column; ``.raise_for_failure()``).
- :func:`run_streamed_suite(plugin, store, inputs, public, config, chunk_rows)
  <validation.products.run_streamed_suite>`: the same with the confidential files read in chunks
  (:mod:`dasflow.validation.stream`; the validate stage's path for a plugin with ``stream_checks``).
- :func:`validate_outputs(release_dir_or_frames, plan_record, configs=None) <validation.outputs.validate_outputs>`.
- :func:`validate_product_config`, :func:`validate_release_config` (every config format).
- :func:`check_delimited`, :func:`check_parquet_files` (phase-0 preflight of input files), :func:`store_results`
  (JSON + Data Docs HTML under ``runs/{id}/validation/``).
"""

from __future__ import annotations

from dasflow.validation.configs import validate_product_config, validate_release_config
from dasflow.validation.outputs import validate_outputs
from dasflow.validation.preflight import check_delimited, check_parquet_files
from dasflow.validation.products import run_product_suite, run_streamed_suite
from dasflow.validation.result import ValidationResult
from dasflow.validation.wrap import store_results

__all__ = ["ValidationResult", "check_delimited", "check_parquet_files", "run_product_suite", "run_streamed_suite",
           "store_results",
           "validate_outputs", "validate_product_config", "validate_release_config"]
