"""The ``matrix`` product in the DAG: a workload file (JSON, as ``dasflow.products.matrix.config`` documents)
and person records with integer-coded attribute columns named as the schema's attributes, read from every
Parquet file under the release's ``matrix`` prefix (e.g. the synthetic census's TopDown persons files, whose
HHGQ, VOTINGAGE, HISPANIC, CENRACE codes are 0-based). No public inputs: the domain is the schema. Files in
folders (``{SS}/part-*.parquet``, one per state) are prepared one folder at a time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, parquet_folders, read_parquet_keys, read_parquet_records
from dasflow.io.store import ObjectStore
from dasflow.privacy import relations
from dasflow.products.matrix import checks
from dasflow.products.matrix.config import MatrixConfig, parse_config
from dasflow.products.matrix.estimate import marginal_of
from dasflow.products.matrix.product import MatrixProduct
from dasflow.products.plugin import DemoEntry, InputChecks, InputDeclaration, ProductPlugin, config_json

RECORD_FILES = "Parquet record files"


class MatrixPlugin(ProductPlugin[MatrixConfig]):
    title = 'Matrix mechanism (Eigen-Design)'
    name = "matrix"
    validation_cost = 0.07  # validate CPU µs per person at 331 M persons (BENCHMARKS.md, fifth national run)
    #: add/remove one person; one marginal per key (0/+1 cells), so → change-one ρ × 2, ε × 2
    relation = relations.add_remove_product(change=relations.COUNTS_CHANGE)
    input_declarations = (InputDeclaration("matrix", "confidential/matrix/", confidential=True),)
    synth_format = "topdown"  # the matrix product reads the synthetic census's TopDown persons files
    #: the PL94-like marginal workload on the synthetic census's TopDown persons (no public files)
    demo = DemoEntry(inputs={"matrix": "confidential/synth/topdown/persons/"}, config_file="matrix-config.json")

    def product(self, config: MatrixConfig) -> MatrixProduct:
        return MatrixProduct(config)

    def load_config(self, text: str, universe: str) -> MatrixConfig:
        raw = config_json(text, "matrix")
        return parse_config(raw, source="matrix config")

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: MatrixConfig) -> dict[str, Any]:
        return {}

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str],
                                 config: MatrixConfig) -> dict[str, Any]:
        prefix = input_prefix(inputs, "matrix", "confidential/matrix/")
        records = read_parquet_records(store, prefix, list(config.schema), RECORD_FILES)
        return {"records": records.to_pandas(), "records_source": prefix}

    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: MatrixConfig) -> list[str] | None:
        """The folders of the record files (``{SS}/part-*.parquet``: one per state), or None when the files lie
        directly under the input prefix.

        Exactness: a person is one record in one folder and adds 1 to one histogram cell, so the histogram of
        the input is the sum of the folders' histograms and every marginal (a linear map of it) is the sum of
        theirs over the same schema domain (the default ``combine_prepared``). Same function of the data, same
        sensitivities (Δ₂² = 1 per marginal)."""
        folders = parquet_folders(store, input_prefix(inputs, "matrix", "confidential/matrix/"), RECORD_FILES)
        return None if folders is None else list(folders)

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: MatrixConfig,
                         partition: str) -> dict[str, Any]:
        """One folder's records (the schema's columns only); errors name the folder."""
        prefix = input_prefix(inputs, "matrix", "confidential/matrix/")
        folders = parquet_folders(store, prefix, RECORD_FILES) or {}
        if partition not in folders:
            raise InputError(f"no record files in a folder {partition!r}", file=prefix)
        keys = folders[partition]
        records = read_parquet_keys(store, keys, list(config.schema))
        return {"records": records.to_pandas(), "records_source": keys[0].rsplit("/", 1)[0] + "/"}

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: MatrixConfig) -> dict[str, Any]:
        """Every attribute code in its domain (the product's own tabulation check), before any noise."""
        MatrixProduct(config).histogram(confidential["records"], str(confidential["records_source"]))
        return {"records": len(confidential["records"])}

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                      config: MatrixConfig, chunk_rows: int) -> InputChecks:
        """:meth:`validate` with the records read in Parquet batches (:func:`checks.stream_checks`)."""
        return checks.stream_checks(store, inputs, config, chunk_rows)

    def file_name(self, table: str, universe: str) -> str:
        return f"{table}.csv"

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: MatrixConfig,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
        """The workload tables of the true histogram (the product's own tabulation): attribute codes + COUNT per
        cell, in the release layout (``{level}_{table}``)."""
        conf = self.confidential_inputs(store, inputs, config)
        hist = MatrixProduct(config).histogram(conf["records"], str(conf["records_source"]))
        names = list(config.schema)
        out: dict[str, pd.DataFrame] = {}
        for table, attrs in config.workload.items():
            counts = marginal_of(hist, [names.index(a) for a in attrs]).astype(np.int64).reshape(-1)
            grid = np.indices([config.schema[a] for a in attrs]).reshape(len(attrs), -1) if attrs else ()
            frame = pd.DataFrame({a: grid[i] for i, a in enumerate(attrs)} | {"COUNT": counts})
            out[self.file_name(f"{config.level}_{table}", universe)] = frame
        return out


PLUGIN = MatrixPlugin()
