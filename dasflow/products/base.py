"""The Product interface every dasflow product implements (DESIGN.md §3).

A product is five plain functions over plain data:

``plan(config, public) -> list[MeasurementSpec]``
    Data-independent: every measurement key with its mechanism, sensitivity, budget and noise scale. The plan
    is what the privacy ledger checks against the release's cap before any noise is drawn, so nothing that
    depends on confidential data may enter it.
``prepare(inputs, public) -> Prepared``
    Stability-accounted transformations of the confidential inputs (filters, joins, flat maps) into
    per-measurement tabulations; the stability of each transformation is already in the plan's sensitivity.
``measure(prepared, spec, rng) -> NoisyMeasurement``
    Draws noise for exactly one planned key (exact integer samplers only).
``postprocess(measurements, public) -> Estimates``
    Pure post-processing: it takes noisy measurements and public inputs only.
``tables(estimates) -> dict[str, DataFrame]``
    Release files in the formats the Census published.

Privacy argument: the release is a post-processing of the measurements; each measurement is a mechanism with
the planned budget applied to a transformation whose stability the plan accounts for, so the sequential
composition of the plan's entries bounds the release's privacy loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal, Protocol, runtime_checkable

import pandas as pd

Mechanism = Literal["discrete_gaussian", "two_sided_geometric", "none"]
PrivacyDefinition = Literal["zcdp", "puredp"]

#: Columns every noisy-measurement table carries besides its key columns.
NOISY_COLUMN = "NOISY"
VARIANCE_COLUMN = "VARIANCE"
MECHANISM_COLUMN = "NOISE_DISTRIBUTION"


@dataclass(frozen=True)
class MeasurementSpec:
    """One planned measurement: fixed before any data is read.

    ``budget`` is ρ under zCDP or ε under pure DP (``None`` = infinite budget: no noise, variance 0).
    ``sensitivity`` is the L2 (zCDP) or L1 (pure DP) sensitivity of the measured query vector after the
    product's stable transformations. ``noise`` is σ² of the discrete Gaussian, or the scale b of the
    two-sided geometric (P(k) ∝ exp(-|k|/b)); 0 means no noise. ``variance`` is the per-cell variance the
    product publishes for this key: exact σ² (a Fraction) for the discrete Gaussian; for the two-sided
    geometric it is 2a/(1-a)² with a = exp(-1/b), irrational, so a float (display only, never a decision).
    """

    product: str
    key: str
    level: str
    privacy_defn: PrivacyDefinition
    mechanism: Mechanism
    budget: Fraction | None
    sensitivity: Fraction
    noise: Fraction
    cells: int
    variance: Fraction | float
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NoisyMeasurement:
    """The noisy answers of one planned key: key columns + NOISY + VARIANCE + NOISE_DISTRIBUTION.

    ``rng_mode`` records whether the noise came from the production CSPRNG or the seeded test generator.
    """

    spec: MeasurementSpec
    table: pd.DataFrame
    rng_mode: str


Prepared = dict[str, pd.DataFrame]
Estimates = dict[str, pd.DataFrame]


@runtime_checkable
class Product(Protocol):
    """What the DAG needs from a product (see the module docstring)."""

    name: str

    def plan(self, config: Any, public: Mapping[str, Any]) -> list[MeasurementSpec]: ...

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared: ...

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement: ...

    def postprocess(
        self, measurements: Mapping[str, NoisyMeasurement], public: Mapping[str, Any]
    ) -> Estimates: ...

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]: ...
