"""The fail-closed validate gate for the release DAG: a product adapter wrapped so that (1) every input file
passes the phase-0 preflight before its reader parses it, and (2) ``validate`` runs the product's GX suites
(:func:`validation.products.run_product_suite`) and raises the ``InputError`` of the first failure.

The DAG's ``validate_stage`` calls ``adapter.validate`` before preprocessing and measurement, so a rejected
input leaves the release with no prepared data, no ledger entry and no measurement. The last
:class:`ValidationResult` is kept on the wrapper (``last_result``) for :func:`store_results`.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore
from dasflow.pipeline.adapters.files import local_dir, local_file
from validation.preflight import check_delimited
from validation.products import run_product_suite
from validation.result import ValidationResult


def _prefix(inputs: Mapping[str, str], name: str, default: str) -> str:
    prefix = inputs.get(name, default)
    return prefix if prefix.endswith("/") else prefix + "/"


def preflight_inputs(product: str, store: ObjectStore, inputs: Mapping[str, str], public: bool) -> None:
    """Phase 0 on the files of one product (public or confidential side) before any reader runs."""
    if product == "phsafe":
        from dasflow.products.phsafe.inputs import SCHEMAS

        if public:
            key = _prefix(inputs, "phsafe_geo", "public/phsafe/") + "geo.csv"
            check_delimited(local_file(store, key), list(SCHEMAS["geo"]), None)
        else:
            prefix = _prefix(inputs, "phsafe", "confidential/phsafe/")
            for name in ("persons", "units"):
                check_delimited(local_file(store, f"{prefix}{name}.csv"), list(SCHEMAS[name]), None)
    elif product == "safetab-p":
        from dasflow.products.safetab_p import iterations as it
        from dasflow.products.safetab_p.product import PERSON_DIR
        from dasflow.products.safetab_p.records import GRFC_COLUMNS, GRFC_FILE, PERSON_COLUMNS, PERSON_FILE

        if public:
            folder = local_dir(store, _prefix(inputs, "safetab-p_public", "public/safetab-p/"))
            if (folder / GRFC_FILE).is_file():
                check_delimited(folder / GRFC_FILE, GRFC_COLUMNS, "|", extra_columns=True)
            for name in it.ITERATION_FILES:
                if (folder / name).is_file():
                    check_delimited(folder / name, None, "|")
        else:  # person-records.txt, or a split input person-records/*.txt (each file checked)
            prefix = _prefix(inputs, "safetab-p", "confidential/safetab-p/")
            split = [k for k in store.list(f"{prefix}{PERSON_DIR}/") if k.endswith(".txt")]
            for key in split or [prefix + PERSON_FILE]:
                check_delimited(local_file(store, key), PERSON_COLUMNS, "|")
    elif product == "topdown" and public:
        key = _prefix(inputs, "topdown_public", "public/topdown/") + "GRF-C.txt"
        if store.exists(key):
            check_delimited(local_file(store, key), ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"], "|",
                            extra_columns=True)
    elif product in ("groupsize", "topdown") and not public:
        prefix = _prefix(inputs, product, f"confidential/{product}/")
        for key in store.list(prefix):
            if key.endswith(".parquet"):
                try:  # every page decoded: a corrupt page is a pyarrow OSError inside the adapter otherwise
                    pq.read_table(io.BytesIO(store.get(key)))
                except (pa.ArrowException, OSError, ValueError) as exc:
                    raise InputError(f"not a readable Parquet file: {exc}", file=key) from None


class ValidatedAdapter:
    """An adapter with the phase-0 preflight and the GX validate gate (see the module docstring)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name: str = inner.name
        self.last_result: ValidationResult | None = None

    def product(self, config: Any) -> Any:
        return self.inner.product(config)

    def load_config(self, text: str, universe: str) -> Any:
        from validation.configs import validate_product_config

        return validate_product_config(self.name, text, universe, loader=self.inner.load_config)

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        preflight_inputs(self.name, store, inputs, public=True)
        out: dict[str, Any] = self.inner.public_inputs(store, inputs, config)
        return out

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        preflight_inputs(self.name, store, inputs, public=False)
        out: dict[str, Any] = self.inner.confidential_inputs(store, inputs, config)
        return out

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: Any) -> dict[str, Any]:
        result = run_product_suite(self.name, confidential, public, config)
        self.last_result = result
        result.raise_for_failure()
        # the product's own validate check ran inside run_product_suite (or, for PHSafe's cross-file rules,
        # was replicated rule for rule by the facts): it is not run a second time here
        return {k: v for k, v in result.summary.items() if k != "expectations"} | {
            "gx": result.summary["expectations"]}

    def file_name(self, table: str, universe: str) -> str:
        name: str = self.inner.file_name(table, universe)
        return name

    def __getattr__(self, attr: str) -> Any:  # e.g. SafeTab-P's adaptive measurement helpers
        return getattr(self.inner, attr)


def store_results(store: ObjectStore, root: str, product: str, result: ValidationResult) -> dict[str, str]:
    """Write ``{root}/validation/{product}.gx.json`` and ``{product}.html`` (atomic puts); key → sha256."""
    keys = {f"{root}/validation/{product}.gx.json": result.to_json().encode(),
            f"{root}/validation/{product}.html": result.html.encode()}
    return {k: store.put(k, v) for k, v in keys.items()}
