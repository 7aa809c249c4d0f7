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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, parquet_folders, read_parquet_keys, read_parquet_records
from dasflow.io.store import ObjectStore, StoreError
from dasflow.privacy import accounting
from dasflow.products.groupsize import checks
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct
from dasflow.products.groupsize.relation import RELATION
from dasflow.products.groupsize.reporting import groupsize_consistency, groupsize_truth
from dasflow.products.plugin import (
    DemoCensus,
    DemoEntry,
    InputChecks,
    InputDeclaration,
    ProductPlugin,
    sum_counts,
)
from dasflow.synth.reference import counties as synth_counties
from dasflow.validation.configs import check_infinity, check_keys

UNIT_COLUMNS = ("TABBLKST", "TABBLKCOU", "HHGQ", "SIZE")
UNIT_FILES = "group-size unit files"

GROUPSIZE_KEYS = frozenset({"budget", "privacy_defn", "mechanism", "k", "level_shares", "window_multiplier"})
GROUPSIZE_REQUIRED = frozenset({"budget", "privacy_defn", "mechanism"})


def _codes(column: pd.Series, label: Any) -> np.ndarray:
    """``label`` of every value of a code column, formatted once per distinct value (object array)."""
    codes, uniq = pd.factorize(column, use_na_sentinel=False)
    return np.asarray([label(v) for v in uniq], dtype=object)[codes]


def households_frame(units: pa.Table) -> pd.DataFrame:
    """The occupied housing units (HHGQ 0, SIZE ≥ 1) of a unit table as STATE (2 digits), COUNTY (3), SIZE."""
    frame = units.to_pandas()
    households = frame[(frame["HHGQ"] == 0) & (frame["SIZE"] >= 1)]
    return pd.DataFrame({
        "STATE": _codes(households["TABBLKST"], lambda v: str(v).zfill(2)),
        "COUNTY": _codes(households["TABBLKCOU"], lambda v: str(int(v)).zfill(3)),
        "SIZE": households["SIZE"].to_numpy(),
    })


class GroupSizePlugin(ProductPlugin[GroupSizeConfig]):
    title = 'Group sizes'
    name = "groupsize"
    validation_cost = 0.22  # validate CPU µs per person at 331 M persons (BENCHMARKS.md, fifth national run)
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
        units = read_parquet_records(store, prefix, UNIT_COLUMNS, UNIT_FILES)
        return {"households": households_frame(units), "households_source": prefix}

    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: GroupSizeConfig) -> list[str] | None:
        """The folders of the unit files (``units/{SS}/part-*.parquet``: one per state), or None when the files
        lie directly under the input prefix.

        Exactness: a household is one unit row and lands in exactly one (county, size) cell, so each level's
        (regions, k) counts of the whole input are the sum of the partitions' counts over the same public tree,
        and every query (counts, cumulative, chain-cumulative) is linear in them: the per-level answers add up
        (:meth:`combine_prepared`). The public invariant n is checked on the whole input by the validate stage
        (bound to the same input hashes) before any preprocessing. Same function of the data, same
        sensitivities."""
        folders = parquet_folders(store, input_prefix(inputs, "groupsize", "confidential/groupsize/"), UNIT_FILES)
        return None if folders is None else list(folders)

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: GroupSizeConfig,
                         partition: str) -> dict[str, Any]:
        """One folder's occupied housing units (errors name the folder); ``partition`` tells ``prepare`` that the
        whole-input invariant n is not this part's total."""
        prefix = input_prefix(inputs, "groupsize", "confidential/groupsize/")
        folders = parquet_folders(store, prefix, UNIT_FILES) or {}
        if partition not in folders:
            raise InputError(f"no unit files in a folder {partition!r}", file=prefix)
        keys = folders[partition]
        units = read_parquet_keys(store, keys, UNIT_COLUMNS)
        return {"households": households_frame(units), "households_source": keys[0].rsplit("/", 1)[0] + "/",
                "partition": partition}

    def combine_prepared(self, name: str, parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
        """A level's query answers per (REGION, SIZE) summed over the partitions (exact int64; every part has
        the whole public tree's rows)."""
        return sum_counts(name, parts, count="VALUE")

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

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                      config: GroupSizeConfig, chunk_rows: int) -> InputChecks:
        """The same checks with the unit files read in batches (:func:`checks.stream_checks`)."""
        return checks.stream_checks(store, inputs, public, config, chunk_rows)

    def output_header(self, file: str) -> list[str] | None:
        return checks.output_header(file)

    def check_outputs(self, frames: Mapping[str, pd.DataFrame]) -> InputError | None:
        return checks.check_outputs(frames)

    def invariants(self, public: Mapping[str, Any], config: GroupSizeConfig) -> list[str]:
        """Group sizes hold the number of occupied housing units n invariant (public, from the MAF)."""
        return [f"groupsize: number of occupied housing units n = {int(public['n_groups'])} (public, from the "
                "MAF; held invariant by the product)"]

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: GroupSizeConfig,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
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
