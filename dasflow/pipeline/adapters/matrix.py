"""The ``matrix`` product in the DAG: a workload file (JSON, as ``dasflow.products.matrix.config`` documents)
and person records with integer-coded attribute columns named as the schema's attributes, read from every
Parquet file under the release's ``matrix`` prefix (e.g. the synthetic census's TopDown persons files, whose
HHGQ, VOTINGAGE, HISPANIC, CENRACE codes are 0-based). No public inputs: the domain is the schema."""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore
from dasflow.pipeline.adapters.files import config_json, input_prefix
from dasflow.products.matrix.config import MatrixConfig, parse_config
from dasflow.products.matrix.product import MatrixProduct


class MatrixAdapter:
    name = "matrix"

    def product(self, config: Any) -> MatrixProduct:
        return MatrixProduct(config)

    def load_config(self, text: str, universe: str) -> MatrixConfig:
        raw = config_json(text, "matrix")
        return parse_config(raw, source="matrix config")

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        return {}

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        prefix = input_prefix(inputs, "matrix", "confidential/matrix/")
        keys = [k for k in store.list(prefix) if k.endswith(".parquet")]
        if not keys:
            raise InputError("no Parquet record files", file=prefix)
        columns = list(config.schema)
        parts = []
        for key in keys:
            table = pq.read_table(io.BytesIO(store.get(key)))
            missing = [c for c in columns if c not in table.column_names]
            if missing:
                raise InputError(f"missing attribute column(s) {', '.join(missing)}", file=key, column=missing[0])
            parts.append(table.select(columns))
        return {"records": pa.concat_tables(parts).to_pandas(), "records_source": prefix}

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: Any) -> dict[str, Any]:
        """Every attribute code in its domain (the product's own tabulation check), before any noise."""
        MatrixProduct(config).histogram(confidential["records"], str(confidential["records_source"]))
        return {"records": len(confidential["records"])}

    def file_name(self, table: str, universe: str) -> str:
        return f"{table}.csv"


ADAPTER = MatrixAdapter()
