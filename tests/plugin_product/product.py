"""The ``counts`` test product's statistics: noisy person counts per state and per (state, sex).

A real product (exact discrete Gaussian via the privacy core, sensitivity 1 per level: adding or removing one
person changes one cell of each level by one), small enough that the DAG tests run in seconds. Inputs:
``confidential/counts/persons.csv`` (columns STATE, SEX) and a public ``public/counts/states.csv`` listing the
states of the universe.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dasflow.privacy import accounting, samplers
from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement
from dasflow.products.base import Prepared

PERSONS = "confidential/counts/persons.csv"
STATES = "public/counts/states.csv"
LEVELS = ("state", "state_sex")


class CountsProduct:
    name = "counts"

    def plan(self, config: Any, public: Mapping[str, Any]) -> list[MeasurementSpec]:
        n_states = len(public["states"])
        specs = []
        for level in LEVELS:
            rho = accounting.parse_budget(config["rho"][level], f"rho.{level}")
            sigma2 = Fraction(0) if rho is None else accounting.gaussian_sigma2(rho, 1)
            specs.append(MeasurementSpec(
                product=self.name, key=level, level=level, privacy_defn="zcdp",
                mechanism="discrete_gaussian" if sigma2 else "none", budget=rho, sensitivity=Fraction(1),
                noise=sigma2, cells=n_states * (1 if level == "state" else 2), variance=sigma2))
        return specs

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        persons: pd.DataFrame = inputs["persons"]
        states = list(public["states"])
        idx = pd.Categorical(persons["STATE"], categories=states).codes.astype(np.int64)
        sex = persons["SEX"].to_numpy(np.int64) - 1
        by_state = np.bincount(idx, minlength=len(states))
        by_sex = np.bincount(idx * 2 + sex, minlength=2 * len(states))
        return {
            "state": pd.DataFrame({"STATE": states, "COUNT": by_state}),
            "state_sex": pd.DataFrame({"STATE": np.repeat(states, 2), "SEX": np.tile([1, 2], len(states)),
                                       "COUNT": by_sex}),
        }

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        frame = prepared[spec.level].copy()
        noise = samplers.discrete_gaussian(spec.noise, len(frame), rng)
        frame["NOISY"] = frame.pop("COUNT").to_numpy(np.int64) + noise
        frame["VARIANCE"] = float(spec.variance)
        frame["NOISE_DISTRIBUTION"] = "Discrete Gaussian"
        return NoisyMeasurement(spec=spec, table=frame, rng_mode=rng.mode)

    def postprocess(self, measurements: Mapping[str, NoisyMeasurement],
                    public: Mapping[str, Any]) -> dict[str, pd.DataFrame]:
        return {m.spec.level: m.table.assign(ESTIMATE=m.table["NOISY"].clip(lower=0))
                for m in measurements.values()}

    def tables(self, estimates: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
        return {f"{level}.csv": frame for level, frame in estimates.items()}
