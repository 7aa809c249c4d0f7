"""PHSafe as a dasflow Product (``dasflow/products/base.py``) plus the one-execution runners the command uses.

Interface for the DAG::

    from dasflow.products.phsafe import PHSAFE            # name = "phsafe"
    specs = PHSAFE.plan(config, public)                   # config: PHSafeConfig or path/dict; data-independent
    prepared = PHSAFE.prepare({"persons": cols, "units": cols}, {"config": config, "geo": geo_cols})
    m = PHSAFE.measure(prepared, spec, rng.spawn("phsafe/" + spec.key))   # ONE key; measure does not spawn
    estimates = PHSAFE.postprocess({spec.key: m, ...}, public)            # adds PH5_num, PH8_num
    files = PHSAFE.tables(estimates)                      # {"PH1_num": DataFrame in the release layout, ...}

``cols`` are dicts of integer numpy columns as returned by :func:`dasflow.products.phsafe.inputs.read_inputs`
(or pandas DataFrames with the same columns). The geography file is PUBLIC (phsafe.md §1.5) and goes in
``public``. ``prepare`` tabulates every tabulated level exactly over its public domain, after the
(2τ+2)-stable ``truncate_and_join``; these exact counts are confidential and must stay in the confidential
store.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import DasflowError, InputError
from dasflow.privacy import rng as rng_mod
from dasflow.privacy.ledger import Cap, check_plan
from dasflow.products.base import Estimates, MeasurementSpec, NoisyMeasurement, Prepared
from dasflow.products.phsafe import measure as measure_mod
from dasflow.products.phsafe import outputs
from dasflow.products.phsafe import planning as plan_mod
from dasflow.products.phsafe.config import PHSafeConfig, load_config, parse_config
from dasflow.products.phsafe.tables import DERIVED, MEASURED, OUTPUT_TABLES
from dasflow.products.phsafe.tabulate import build_universe, tabulate, with_domain


def as_config(config: PHSafeConfig | Mapping[str, Any] | str | Path) -> PHSafeConfig:
    """Accept a PHSafeConfig, a path to ``config.json``, or an already-decoded mapping."""
    if isinstance(config, PHSafeConfig):
        return config
    if isinstance(config, str | Path):
        return load_config(config)
    if isinstance(config, Mapping):
        return parse_config(config)
    raise InputError(f"unsupported PHSafe config type {type(config).__name__}")


def _columns(obj: Any) -> dict[str, np.ndarray]:
    if isinstance(obj, pd.DataFrame):
        return {str(c): obj[c].to_numpy() for c in obj.columns}
    return {str(k): np.asarray(v) for k, v in obj.items()}


def levels_of(specs: list[MeasurementSpec]) -> dict[str, list[str]]:
    """table -> planned levels, in plan order."""
    out: dict[str, list[str]] = {}
    for s in specs:
        out.setdefault(str(s.detail["table"]), []).append(s.level)
    return out


def prepare_exact(persons: Any, units: Any, geo: Any, config: PHSafeConfig,
                  truncate: bool = True, domain: bool = True) -> Prepared:
    """Exact per-key tabulations; ``truncate=False`` gives the non-private ground truth (R17, no
    truncation); ``domain=False``: COUNT only (:func:`.tabulate.tabulate`)."""
    uni = build_universe(_columns(persons), _columns(units), _columns(geo), config.state_filter,
                         min_tau=min(config.tau.values()))
    levels = levels_of(plan_mod.plan(config))
    return tabulate(uni, levels, dict(config.tau) if truncate else None, config.state_filter, domain)


class PHSafe:
    """The PHSafe product (phsafe.md): 9 measured runs x levels, 2 derived tables.

    Bound to a config (``PHSafe(config)``, what the pipeline's plugin gives), it prepares compact frames —
    ``COUNT`` only, in the level's public domain order — and ``measure`` puts the public domain columns back
    from the config: a partitioned preprocess then writes and combines one integer column per key and
    partition instead of the domain's text columns (same counts, same measurement). Unbound (:data:`PHSAFE`),
    prepared frames carry their domain columns."""

    name = "phsafe"

    def __init__(self, config: PHSafeConfig | None = None) -> None:
        self.config = config

    def plan(self, config: PHSafeConfig | Mapping[str, Any] | str | Path,
             public: Mapping[str, Any] | None = None) -> list[MeasurementSpec]:
        """Data-independent plan; ``public`` is not read (the domain comes from the config)."""
        return plan_mod.plan(as_config(config))

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Filters, public geo join, ``truncate_and_join``, exact counts per planned key. A partition's inputs
        carry the public geo rows of its units (``inputs["geo"]``); otherwise ``public["geo"]`` is joined."""
        geo = inputs["geo"] if "geo" in inputs else public["geo"]
        return prepare_exact(inputs["persons"], inputs["units"], geo, as_config(public["config"]),
                             domain=self.config is None)

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        """Noise for ONE key from ``rng`` as given (the caller spawns a per-key generator); a compact prepared
        frame gets its public domain columns from the bound config first."""
        if spec.key in prepared and "REGION_ID" not in prepared[spec.key].columns:
            if self.config is None:
                raise DasflowError(f"{spec.key}: a compact prepared frame needs a PHSafe bound to its config")
            if len(prepared[spec.key]) != spec.cells:
                raise DasflowError(f"{spec.key}: prepared {len(prepared[spec.key])} cells, plan says {spec.cells}")
            exact = with_domain(spec.key, prepared[spec.key], self.config.state_filter)
            return measure_mod.measure({spec.key: exact}, spec, rng)
        return measure_mod.measure(prepared, spec, rng)

    def postprocess(self, measurements: Mapping[str, NoisyMeasurement],
                    public: Mapping[str, Any] | None = None) -> Estimates:
        """Stack levels per table and derive PH5_num / PH8_num from the noisy values only."""
        return measure_mod.derive(measurements)

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]:
        """Release frames keyed by file stem (``PH1_num`` -> ``PH1_num.csv``)."""
        return {t: outputs.release_frame(t, e) for t, e in estimates.items()}


PHSAFE = PHSafe()


def execution_cap(specs: list[MeasurementSpec], cap: Fraction | None) -> Cap:
    """The execution's cap in the plan's own unit: ρ for a zcdp plan, ε for a puredp one (``None``: no cap)."""
    if cap is not None and specs and all(s.privacy_defn == "puredp" for s in specs):
        return Cap(rho=None, epsilon=cap)
    return Cap(rho=cap)


def measure_all(prepared: Prepared, specs: list[MeasurementSpec], generator: Any,
                cap: Fraction | None) -> dict[str, NoisyMeasurement]:
    """Measure every planned key once, charging its budget against the execution's cap (R12).

    ``cap`` (ρ under zcdp, ε under puredp) None means an unlimited (infinite-budget) execution. Before drawing
    anything the plan goes through the ledger's one cap check (``ledger.check_plan``: duplicate keys, the exact
    sequential total within the cap, an infinite budget over any cap), which raises ``LedgerRefusal``; each
    key's noise comes from ``generator.spawn("phsafe/key")``.
    """
    check_plan(specs, execution_cap(specs, cap))
    return {s.key: PHSAFE.measure(prepared, s, generator.spawn(f"phsafe/{s.key}")) for s in specs}


def run_private(persons: Any, units: Any, geo: Any, config: PHSafeConfig, generator: Any | None = None,
                cap: Fraction | None = None) -> dict[str, pd.DataFrame]:
    """One execution (US or PR): plan, prepare, measure every key, derive; returns release frames.

    ``generator`` defaults to the production CSPRNG; pass ``rng.seeded(s)`` only in tests and benchmarks.
    ``cap`` defaults to the config's total budget (the single ledger of this execution).
    """
    specs = plan_mod.plan(config)
    if cap is None:
        cap = plan_mod.config_total(config)
    prepared = prepare_exact(persons, units, geo, config)
    g = rng_mod.csprng() if generator is None else generator
    measurements = measure_all(prepared, specs, g, cap)
    return PHSAFE.tables(PHSAFE.postprocess(measurements))


def run_non_private(persons: Any, units: Any, geo: Any, config: PHSafeConfig,
                    truncate: bool = False) -> dict[str, pd.DataFrame]:
    """Ground-truth frames (no noise; no truncation unless ``truncate``), derived tables included."""
    exact = prepare_exact(persons, units, geo, config, truncate=truncate)
    by_table: dict[str, list[pd.DataFrame]] = {}
    for key, frame in exact.items():
        by_table.setdefault(key.split("/")[0], []).append(frame)
    stacked = {t: pd.concat(f, ignore_index=True) for t, f in by_table.items()}
    frames: dict[str, pd.DataFrame] = {}
    for table in MEASURED:
        if table in stacked:
            frames[table] = stacked[table]
    for name, (source, mapping) in DERIVED.items():
        if source not in stacked:
            continue
        src = stacked[source]
        keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
        parts = []
        for new_cell, old in mapping.items():
            g = src[src["DATA_CELL"].isin(old)].groupby(keys, sort=False, as_index=False)["COUNT"].sum()
            g["DATA_CELL"] = new_cell
            g["_order"] = np.arange(len(g))
            parts.append(g)
        d = pd.DataFrame(pd.concat(parts, ignore_index=True)).sort_values(["_order", "DATA_CELL"],
                                                                          kind="stable")
        frames[name] = d[[*keys, "DATA_CELL", "COUNT"]].reset_index(drop=True)
    return {t: outputs.truth_frame(t, frames[t]) for t in OUTPUT_TABLES if t in frames}
