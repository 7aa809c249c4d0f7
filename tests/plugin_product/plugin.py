"""The ``counts`` test product as a plugin package: what an agency writes to add a product to dasflow without
editing it. Registered with one line (``dasflow.registry.register("counts", "tests.plugin_product.plugin")``,
or ``DASFLOW_PRODUCTS=counts=tests.plugin_product.plugin`` for a subprocess); its neighbouring relation is
declared on the plugin, ``relation`` (add/remove one person: one cell of each level moves by one).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.store import ObjectStore
from dasflow.privacy import relations
from dasflow.products.plugin import InputDeclaration, ProductPlugin
from tests.plugin_product.product import PERSONS, STATES, CountsProduct

#: what the certificate lists for the product (nothing is held invariant: every count is noisy)
INVARIANTS = ["counts: no count held invariant; the public state list fixes the tabulated cells"]


class CountsPlugin(ProductPlugin[Any]):
    """The plugin of the ``counts`` test product (config: ``{"rho": {"state": ..., "state_sex": ...}}``)."""

    name = "counts"
    title = "Counts (test product)"
    input_declarations = (InputDeclaration("counts", "confidential/counts/", confidential=True),
                          InputDeclaration("counts_public", "public/counts/", confidential=False))
    #: add/remove one person: one cell of each level moves by one
    relation = relations.add_remove_product()

    def product(self, config: Any) -> CountsProduct:
        return CountsProduct()

    def load_config(self, text: str, universe: str) -> Any:
        return json.loads(text)

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        states = pd.read_csv(io.BytesIO(store.get(STATES)), dtype=str)["STATE"].tolist()
        return {"states": states}

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: Any) -> dict[str, Any]:
        return {"persons": pd.read_csv(io.BytesIO(store.get(PERSONS)), dtype={"STATE": str})}

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any], config: Any) -> dict[str, Any]:
        persons = confidential["persons"]
        bad_sex = ~persons["SEX"].isin([1, 2])
        if bad_sex.any():
            row = int(np.flatnonzero(bad_sex.to_numpy())[0]) + 2
            raise InputError(f"SEX must be 1 or 2, got {persons['SEX'].iloc[row - 2]!r}", file=PERSONS, row=row,
                             column="SEX")
        bad_state = ~persons["STATE"].isin(public["states"])
        if bad_state.any():
            row = int(np.flatnonzero(bad_state.to_numpy())[0]) + 2
            raise InputError("STATE not in the public state list", file=PERSONS, row=row, column="STATE")
        return {"persons": len(persons)}

    def file_name(self, table: str, universe: str) -> str:
        return table

    def invariants(self, public: Mapping[str, Any], config: Any) -> list[str]:
        return list(INVARIANTS)


PLUGIN = CountsPlugin()
