"""One sensitivity convention for every product's plan (issue #19).

``MeasurementSpec.sensitivity`` is the whole-vector squared L2 sensitivity Δ₂² under zCDP and the L1
sensitivity Δ₁ under pure DP. For every product's ``plan()`` on a small config, the noise recomputed from
(sensitivity, budget) by the textbook calibrations — σ² = Δ₂²/(2ρ) (discrete Gaussian, ρ-zCDP) and b = Δ₁/ε
(two-sided geometric, ε-DP) — is exactly ``spec.noise``. A product that recorded plain L2 (PHSafe's c instead of
c², TopDown's √2) or a per-count sensitivity (SafeTab-P's 1 instead of s) fails here and is refused at freezing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from fractions import Fraction

import pandas as pd
import pytest

from dasflow.errors import LedgerRefusal
from dasflow.privacy import relations
from dasflow.privacy.measurement import MeasurementSpec
from dasflow.products.groupsize.product import GroupSizeConfig, GroupSizeProduct
from dasflow.products.matrix import MatrixProduct
from dasflow.products.matrix import parse_config as matrix_config
from dasflow.products.phsafe import PHSAFE
from dasflow.products.phsafe import parse_config as phsafe_config
from dasflow.products.safetab_p.product import SafeTabP
from dasflow.products.topdown.product import TopDown, TopDownConfig
from dasflow.products.topdown.spine import preset
from dasflow.products.topdown.strategy import LevelStrategy, QueryGroup, Schema, make_strategy
from tests.phsafe.builders import config_with
from tests.safetab_p.helpers import config as safetab_config
from tests.safetab_p.helpers import public as safetab_public
from tests.safetab_p.helpers import toy_config_dict, toy_iterations
from tests.topdown.helpers import small_geography

F = Fraction


def _phsafe(defn: str) -> list[MeasurementSpec]:
    return PHSAFE.plan(phsafe_config(config_with(defn=defn)), {})


def _safetab_p(defn: str) -> list[MeasurementSpec]:
    cfg = safetab_config(toy_config_dict(defn))
    return SafeTabP().plan(cfg, safetab_public(cfg, toy_iterations()))


def _matrix(defn: str) -> list[MeasurementSpec]:
    raw = {"schema": {"a": 3, "b": 2, "c": 4}, "workload": {"total": [], "a": ["a"], "bc": ["b", "c"]},
           "rho": "1/2", "level": "state"}
    product = MatrixProduct(matrix_config(raw))
    return product.plan(product.config, {})


def _groupsize(defn: str) -> list[MeasurementSpec]:
    geo = pd.DataFrame({"STATE": ["13", "13", "36", "36"], "COUNTY": ["001", "003", "005", "047"]})
    specs: list[MeasurementSpec] = []
    for mech in ("M_DP", "M_DPC", "M_DPC*"):
        cfg = GroupSizeConfig(budget=F(1, 2), privacy_defn=defn, mechanism=mech, k=4)  # type: ignore[arg-type]
        specs += GroupSizeProduct(cfg).plan(cfg, {"geography": geo, "n_groups": 6})
    return specs


def _topdown(defn: str) -> list[MeasurementSpec]:
    blocks = small_geography(seed=11, states=("01",), counties=2, tracts=3, max_blocks=8)
    beta = [F(v, 4099) for v in (104, 1440, 447, 687, 1256, 165)]
    per_level = LevelStrategy((QueryGroup("total", (), F(1, 2)), QueryGroup("detailed", ("R", "H"), F(1, 2))))
    strategy = make_strategy(preset("pl94_persons", beta, 3).levels, beta, F(1, 2),
                             schema=Schema((("R", 3), ("H", 2))), per_level=per_level, privacy_defn=defn)
    td = TopDown(TopDownConfig(spine=preset("pl94_persons", beta, 3), strategy=strategy))
    return td.plan(td.config, {"blocks": blocks})


PLANS: dict[str, tuple[Callable[[str], list[MeasurementSpec]], tuple[str, ...]]] = {
    "phsafe": (_phsafe, ("zcdp", "puredp")),
    "safetab-p": (_safetab_p, ("zcdp", "puredp")),
    "matrix": (_matrix, ("zcdp",)),  # the matrix product is zCDP only
    "groupsize": (_groupsize, ("zcdp", "puredp")),
    "topdown": (_topdown, ("zcdp", "puredp")),
}
CASES = [(p, d) for p, (_, defns) in PLANS.items() for d in defns]


def _recomputed(spec: MeasurementSpec) -> Fraction:
    assert spec.budget is not None
    if spec.privacy_defn == "zcdp":
        assert spec.mechanism == "discrete_gaussian"
        return spec.sensitivity / (2 * spec.budget)  # σ² = Δ₂²/(2ρ)
    assert spec.mechanism == "two_sided_geometric"
    return spec.sensitivity / spec.budget  # b = Δ₁/ε


@pytest.mark.parametrize(("product", "defn"), CASES)
def test_every_plans_noise_is_recomputed_from_sensitivity_and_budget(product: str, defn: str) -> None:
    specs = PLANS[product][0](defn)
    noisy = [s for s in specs if s.budget is not None and s.mechanism != "none"]
    assert noisy and {s.product for s in specs} == {product} and {s.privacy_defn for s in specs} == {defn}
    for s in noisy:
        assert isinstance(s.sensitivity, Fraction) and s.sensitivity > 0
        assert s.noise == _recomputed(s), (s.key, s.sensitivity, s.budget, s.noise)
    relations.audit_record(specs)  # the freezing check agrees (it refuses a mismatch)


@pytest.mark.parametrize(("product", "defn"), [c for c in CASES if c[1] == "zcdp" and c[0] != "matrix"])
def test_plain_l2_would_be_caught(product: str, defn: str) -> None:
    """Where Δ₂ ≠ Δ₂² (every product but the matrix one, whose Δ₂ = 1), recording plain L2 breaks the noise
    identity and freezing refuses it: the test above cannot pass a product that reverted to L2."""
    s = next(s for s in PLANS[product][0](defn) if s.budget is not None and s.sensitivity != 1)
    reverted = dataclasses.replace(s, sensitivity=F(math.sqrt(s.sensitivity)))  # plain Δ₂ (√2 as a float)
    assert s.noise != _recomputed(reverted)
    with pytest.raises(LedgerRefusal, match="recomputed"):
        relations.audit_record([reverted])
