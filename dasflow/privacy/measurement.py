"""The plan record's types: one planned measurement and its noisy answers (the floor every layer builds on).

A product's ``plan()`` returns :class:`MeasurementSpec` entries and its ``measure()`` returns
:class:`NoisyMeasurement`; the ledger, the composition, the neighbouring relations and the privacy-loss accounts
read only these types, so they live here, below every product, and import nothing above ``dasflow.privacy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

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

    ``sensitivity`` is, for every product, the sensitivity of the **whole measured vector** of the key (all its
    cells, after the product's stable transformations and under the product's neighbouring relation), exactly:

    * zCDP: the **squared** L2 sensitivity Δ₂² (a Fraction even when Δ₂ is irrational, e.g. Δ₂² = 2);
    * pure DP: the L1 sensitivity Δ₁.

    ``noise`` is σ² of the discrete Gaussian, or the scale b of the two-sided geometric (P(k) ∝ exp(-|k|/b));
    0 means no noise. Under this convention the key's noise is σ² = Δ₂²/(2ρ) (ρ-zCDP, Canonne–Kamath–Steinke)
    or b = Δ₁/ε (ε-DP), which freezing recomputes (``relations.audit_record``) and refuses on mismatch.
    ``variance`` is the per-cell variance the product publishes for this key: exact σ² (a Fraction) for the
    discrete Gaussian; for the two-sided geometric it is 2a/(1-a)² with a = exp(-1/b), irrational, so a float
    (display only, never a decision).
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
