"""PHSafe in the DAG: the production ``config.json`` as-is; ``persons.csv`` and ``units.csv`` under the
release's ``phsafe`` input prefix (confidential), ``geo.csv`` under ``phsafe_geo`` (public, phsafe.md §1.5)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.io.files import input_prefix, local_file
from dasflow.io.store import ObjectStore
from dasflow.privacy import relations
from dasflow.products.phsafe import PHSafe, PHSafeConfig, checks, load_config, parse_config, plan
from dasflow.products.phsafe import cli as phsafe_cli
from dasflow.products.phsafe.estimates import checked_frame, estimate_file_name, estimates_bytes, phsafe_estimates
from dasflow.products.phsafe.inputs import Inputs, LazyTable, check_cross_file, read_rows_of, read_table
from dasflow.products.phsafe.product import run_non_private
from dasflow.products.plugin import (
    BudgetPlan,
    CliCommand,
    DemoEntry,
    InputChecks,
    InputDeclaration,
    ProductPlugin,
    budget_text,
    config_json,
)
from dasflow.validation.configs import check_infinity

#: the confidential files, at the input prefix or in each state folder
PERSON_FILES = ("persons", "units")


class PHSafePlugin(ProductPlugin[PHSafeConfig]):
    title = 'PHSafe'
    name = "phsafe"
    validation_cost = 0.89  # validate CPU µs per person at 331 M persons (BENCHMARKS.md, fifth national run)
    #: add/remove one person (household-truncated); → change-one by the triangle inequality (ρ × 4, ε × 2)
    relation = relations.add_remove_product()
    input_declarations = (
        InputDeclaration("phsafe", "confidential/phsafe/", confidential=True),
        InputDeclaration("phsafe_geo", "public/phsafe/", confidential=False),
    )
    synth_format = "phsafe"
    demo = DemoEntry(inputs={"phsafe": "confidential/synth/phsafe/", "phsafe_geo": "public/phsafe/"},
                     config_file="phsafe-us-config.json", public_files={"phsafe/geo.csv": "public/phsafe/geo.csv"})

    def product(self, config: PHSafeConfig) -> PHSafe:
        """PHSafe bound to the release's config (compact prepared frames, :class:`.product.PHSafe`)."""
        return PHSafe(config)

    def check_config(self, raw: Mapping[str, Any], source: str) -> None:
        """``Infinity`` only in budgets (keys and types: PHSafe's own parser is already strict)."""
        check_infinity(raw, "", "privacy_budget.", source)

    def load_config(self, text: str, universe: str) -> PHSafeConfig:
        raw = config_json(text, "phsafe")
        config = parse_config(raw, file="phsafe config")
        if config.universe != universe:
            raise InputError(f"PHSafe config is for {config.universe} but the release universe is {universe}",
                             file="phsafe config", column="state_filter")
        return config

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: PHSafeConfig) -> dict[str, Any]:
        """The config and ``geo.csv``, read when first used (:class:`LazyTable`): the plan and a partitioned
        preprocess (which reads each partition's rows, :meth:`partition_inputs`) never hold the nation's."""
        geo_key = self._geo_key(inputs)
        return {"config": config, "geo": LazyTable(lambda: local_file(store, geo_key), "geo")}

    def _geo_key(self, inputs: Mapping[str, str]) -> str:
        return input_prefix(inputs, "phsafe_geo", "public/phsafe/") + "geo.csv"

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str],
                                 config: PHSafeConfig) -> dict[str, Any]:
        """``persons.csv`` and ``units.csv`` of the input prefix, or of every state folder in turn (concatenated
        in folder order) when the input is partitioned by state (:func:`checks.state_folders`)."""
        prefix = input_prefix(inputs, "phsafe", "confidential/phsafe/")
        folders = checks.state_folders(store, prefix)
        if folders is None:
            return {name: read_table(local_file(store, f"{prefix}{name}.csv"), name) for name in PERSON_FILES}
        parts = [self._folder_records(store, prefix, f) for f in folders]
        return {name: {c: np.concatenate([p[name][c] for p in parts]) for c in parts[0][name]}
                for name in PERSON_FILES}

    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: PHSafeConfig) -> list[str] | None:
        """The input's state folders (``{SS}/persons.csv``, ``{SS}/units.csv``), or None for one national pair.

        Exactness: a household is one unit MAFID with its persons, all in one state folder
        (:meth:`partition_inputs` refuses a person whose unit is in another folder), and validation has refused
        duplicate unit MAFIDs across the nation, so the filters, the geography join, ``truncate_and_join`` (per
        MAFID) and the bincounts see the same records per state as in one pass: each level's vector is the sum
        of the states' vectors (national rows included). Same function of the data, same sensitivities."""
        return checks.state_folders(store, input_prefix(inputs, "phsafe", "confidential/phsafe/"))

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: PHSafeConfig,
                         partition: str) -> dict[str, Any]:
        """One state folder's ``persons.csv`` and ``units.csv``, and the public ``geo.csv`` rows of its units'
        MAFIDs (``geo``: every row of each such MAFID, so the public MAFID -> state map of these units is the
        national one, :func:`.preprocess.geo_state_index`; streamed, never the whole file); ``InputError`` if a
        person's MAFID has no unit in the folder (its household would span two partitions)."""
        prefix = input_prefix(inputs, "phsafe", "confidential/phsafe/")
        cols = self._folder_records(store, prefix, partition)
        return {**cols, "geo": read_rows_of(local_file(store, self._geo_key(inputs)), "geo", cols["units"]["MAFID"])}

    def _folder_records(self, store: ObjectStore, prefix: str, folder: str) -> dict[str, Any]:
        """A state folder's two files; ``InputError`` for a person whose unit is not in the folder."""
        cols = {name: read_table(local_file(store, f"{prefix}{folder}/{name}.csv"), name) for name in PERSON_FILES}
        orphan = ~np.isin(cols["persons"]["MAFID"], cols["units"]["MAFID"])
        if orphan.any():
            raise InputError("person MAFID has no unit in its state folder (a household spans two partitions)",
                             file=f"{folder}/persons.csv", row=int(np.flatnonzero(orphan)[0]) + 2,
                             column="MAFID")
        return cols

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: PHSafeConfig) -> dict[str, Any]:
        """Phases 1–2 ran while reading; phase 3 (cross-file rules) here — all before any noise."""
        inputs = Inputs(persons=confidential["persons"], units=confidential["units"], geo=public["geo"],
                        files={"persons": "persons.csv", "units": "units.csv", "geo": "geo.csv"})
        check_cross_file(inputs, config.state_filter)
        return {"persons": len(inputs.persons["MAFID"]), "units": len(inputs.units["MAFID"]),
                "universe": config.universe}

    def file_name(self, table: str, universe: str) -> str:
        """``PH1_num.csv`` … (phsafe-production.md), pipe-delimited."""
        return f"{table}.csv"

    def preflight(self, store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
        checks.preflight(store, inputs, public=public)

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                     config: PHSafeConfig) -> InputChecks:
        return checks.input_checks(confidential, public, config)

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                      config: PHSafeConfig, chunk_rows: int) -> InputChecks:
        """The same checks with ``persons.csv`` / ``units.csv`` (national or per state folder) read in chunks."""
        return checks.stream_checks(store, inputs, public, config, chunk_rows)

    def output_header(self, file: str) -> list[str] | None:
        return checks.output_header(file)

    def check_release_files(self, files: Mapping[str, bytes], config: PHSafeConfig) -> None:
        """R16: schema, public domain and VARIANCE = the formula (:func:`checks.check_release_files`)."""
        checks.check_release_files(files, config)

    def invariants(self, public: Mapping[str, Any], config: PHSafeConfig) -> list[str]:
        return ["phsafe: none (phsafe.md §2: no consistency is imposed; PH5_num = PH4 and PH8_num from PH7 are "
                "exact post-processing copies)"]

    def extra_release_files(self, tables: Mapping[str, pd.DataFrame], config: PHSafeConfig) -> dict[str, bytes]:
        """``estimates/{PH1,PH5,PH8,PH1_num,…}.csv``: the statistical post-processing of every released table
        (:mod:`dasflow.products.phsafe.estimates`; published counts and variances only, so no budget)."""
        frames = {rel[:-4]: checked_frame(frame, rel) for rel, frame in tables.items()
                  if "/" not in rel and rel.endswith(".csv")}
        return {estimate_file_name(name): estimates_bytes(frame)
                for name, frame in sorted(phsafe_estimates(frames).items())}

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: PHSafeConfig,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
        """PHSafe's non-private twin (no noise, no truncation: phsafe.md §3 implementation notes)."""
        public = self.public_inputs(store, inputs, config)
        conf = self.confidential_inputs(store, inputs, config)
        frames = run_non_private(conf["persons"], conf["units"], public["geo"], config)
        return {self.file_name(t, universe): f for t, f in frames.items()}

    def budget_format(self, raw: Mapping[str, Any] | None) -> bool:
        """A PHSafe production ``config.json`` carries ``privacy_budget`` and ``tau``."""
        return isinstance(raw, Mapping) and "privacy_budget" in raw and "tau" in raw

    def budget_plan(self, path: Path) -> BudgetPlan:
        """Every planned measurement of the config (PHSafe's data-independent plan) and the universe's parts."""
        cfg = load_config(path)
        specs = plan(cfg)
        rows = [{"product": self.name, "universe": cfg.universe, "key": s.key, "level": s.level,
                 "definition": s.privacy_defn, "budget": budget_text(s.budget), "sensitivity": str(s.sensitivity),
                 "noise": str(s.noise), "variance": str(s.variance), "cells": s.cells} for s in specs]
        return BudgetPlan(rows, {cfg.universe: [(s.privacy_defn, s.budget) for s in specs]})

    def cli(self) -> CliCommand:
        return CliCommand(self.name, "PHSafe with the Census production file formats", phsafe_cli.add_arguments,
                          phsafe_cli.run)


PLUGIN = PHSafePlugin()
