"""Group sizes in the DAG: the household-size distribution for nation, states and counties.

Inputs: the synthetic census's group-size unit files (Parquet, one folder per state: MAFID, block, HHGQ, SIZE)
under the release's ``groupsize`` prefix (confidential); under ``groupsize_public``: ``geography.csv`` (every
STATE, COUNTY of the universe: the public tree) and ``invariants.json`` (``occupied_units``: the number of
occupied housing units n, held invariant as the DAS holds housing-unit counts from the MAF). Groups are the
occupied housing units (HHGQ 0, SIZE ≥ 1); vacant units and group quarters are not households.
Config (JSON): ``budget`` (ε or ρ), ``privacy_defn``, ``mechanism`` (M_DP, M_DPC, M_DPC*), ``k`` (top code),
optional ``level_shares``.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, read_parquet_records
from dasflow.io.store import ObjectStore, StoreError
from dasflow.privacy import accounting
from dasflow.products.groupsize import checks
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct
from dasflow.products.groupsize.relation import RELATION
from dasflow.products.groupsize.reporting import groupsize_consistency, groupsize_truth
from dasflow.products.plugin import DemoCensus, DemoEntry, InputChecks, InputDeclaration, ProductPlugin
from dasflow.synth.reference import counties as synth_counties
from dasflow.validation.configs import check_infinity, check_keys

UNIT_COLUMNS = ("TABBLKST", "TABBLKCOU", "HHGQ", "SIZE")



GROUPSIZE_KEYS = frozenset({"budget", "privacy_defn", "mechanism", "k", "level_shares", "window_multiplier"})
GROUPSIZE_REQUIRED = frozenset({"budget", "privacy_defn", "mechanism"})



class GroupSizePlugin(ProductPlugin[GroupSizeConfig]):
    title = 'Group sizes'
    name = "groupsize"
    #: households fixed (n public); → account relations by query (dasflow.products.groupsize.relation)
    relation = RELATION
    input_declarations = (
        InputDeclaration("groupsize", "confidential/groupsize/", confidential=True),
        InputDeclaration("groupsize_public", "public/groupsize/", confidential=False),
    )
    synth_format = "groupsize"
    demo = DemoEntry(inputs={"groupsize": "confidential/synth/groupsize/", "groupsize_public": "public/groupsize/"},
                     config_file="groupsize-config.json",
                     derived_files=("public/groupsize/geography.csv", "public/groupsize/invariants.json"))

    def demo_public(self, store: ObjectStore, census: DemoCensus) -> None:
        """The public nation > state > county tree of the generated states, and the occupied-unit invariant n
        (public in the DAS, like every housing-unit count from the MAF; the certificate declares it)."""
        rows = [f"{st},{county:03d}" for st, (codes, _names) in sorted(synth_counties().items())
                if st in census.states for county in codes]
        store.put("public/groupsize/geography.csv", ("STATE,COUNTY\n" + "\n".join(rows) + "\n").encode())
        occupied = int(census.totals["occupied_units"])
        store.put("public/groupsize/invariants.json", (json.dumps({"occupied_units": occupied}) + "\n").encode())

    def product(self, config: GroupSizeConfig) -> GroupSizeProduct:
        return GroupSizeProduct(config)

    def check_config(self, raw: Mapping[str, Any], source: str) -> None:
        """Known keys only; a group-size release never has an infinite budget."""
        check_keys(raw, GROUPSIZE_KEYS, GROUPSIZE_REQUIRED, source)
        check_infinity(raw, "", "\0", source)

    def load_config(self, text: str, universe: str) -> GroupSizeConfig:
        try:
            raw = accounting.load_json_exact(text)
            return GroupSizeConfig.from_mapping(raw)
        except (ValueError, KeyError, TypeError) as exc:
            raise InputError(f"group-size config: {exc}", file="groupsize config") from None

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: GroupSizeConfig) -> dict[str, Any]:
        prefix = input_prefix(inputs, "groupsize_public", "public/groupsize/")
        geo = pd.read_csv(io.BytesIO(store.get(prefix + "geography.csv")), dtype=str)
        try:
            invariants = json.loads(store.get(prefix + "invariants.json"))
            n = int(invariants["occupied_units"])
        except (StoreError, KeyError, ValueError) as exc:
            raise InputError(f"public invariants: {exc}", file=prefix + "invariants.json") from None
        return {"geography": geo, "n_groups": n}

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str],
                                 config: GroupSizeConfig) -> dict[str, Any]:
        prefix = input_prefix(inputs, "groupsize", "confidential/groupsize/")
        units = read_parquet_records(store, prefix, UNIT_COLUMNS, "group-size unit files").to_pandas()
        households = units[(units["HHGQ"] == 0) & (units["SIZE"] >= 1)]
        frame = pd.DataFrame({
            "STATE": households["TABBLKST"].astype(str).str.zfill(2).to_numpy(),
            "COUNTY": households["TABBLKCOU"].astype(int).astype(str).str.zfill(3).to_numpy(),
            "SIZE": households["SIZE"].to_numpy(),
        })
        return {"households": frame, "households_source": prefix}

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: GroupSizeConfig) -> dict[str, Any]:
        """Sizes, geography and the public invariant n, all checked before any noise (by the product's own
        tabulation, which raises ``InputError`` with file, row and column)."""
        product = GroupSizeProduct(config)
        product.prepare(confidential, public)
        return {"households": len(confidential["households"]), "n_groups": public["n_groups"]}

    def file_name(self, table: str, universe: str) -> str:
        return f"{table}.csv"

    def preflight(self, store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
        checks.preflight(store, inputs, public=public)

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                     config: GroupSizeConfig) -> InputChecks:
        return checks.input_checks(confidential, public, config)

    def output_header(self, file: str) -> list[str] | None:
        return checks.output_header(file)

    def check_outputs(self, frames: Mapping[str, pd.DataFrame]) -> InputError | None:
        return checks.check_outputs(frames)

    def invariants(self, public: Mapping[str, Any], config: GroupSizeConfig) -> list[str]:
        """Group sizes hold the number of occupied housing units n invariant (public, from the MAF)."""
        return [f"groupsize: number of occupied housing units n = {int(public['n_groups'])} (public, from the "
                "MAF; held invariant by the product)"]

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: GroupSizeConfig,
              universe: str) -> dict[str, pd.DataFrame]:
        """Group sizes by exact tabulation: households per (geography, size) in the release layout."""
        public = self.public_inputs(store, inputs, config)
        households = self.confidential_inputs(store, inputs, config)["households"]
        frames = groupsize_truth(households, public["geography"], int(config.k))
        return {self.file_name(f"groupsize_{level}", universe): f for level, f in frames.items()}

    def consistency(self, files: Mapping[str, pd.DataFrame], public: Mapping[str, Any],
                    config: GroupSizeConfig) -> list[dict[str, Any]]:
        """nation ⊇ states ⊇ counties per size, and Σ nation against the public n (when it could be read)."""
        n = int(public["n_groups"]) if "n_groups" in public else None
        return groupsize_consistency(files, n)


PLUGIN = GroupSizePlugin()
