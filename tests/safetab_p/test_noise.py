"""ST8/ST9/ST10: the measured noise has the planned distribution (seeded test RNG, deterministic).

64,500 stage-1 draws per mechanism on an all-zero population. The sample variance's relative standard error is
√(2/n)·(1+kurtosis term) ≈ 0.6 %; the test allows 5 % (> 8 SE), the mean ±5 SE: false-failure rate < 1e-6 for
any seed (the seed is fixed, so the outcome is deterministic).
"""

from __future__ import annotations

import math
from decimal import Decimal

import numpy as np
import pytest

from dasflow.errors import DasflowError
from dasflow.privacy import rng
from dasflow.products.safetab_p.measure import with_stage1
from dasflow.products.safetab_p.product import SafeTabP
from tests.safetab_p.helpers import config, person, persons_table, public, real_iterations, toy_config_dict

BLOCKS = [(f"01{c:03d}0000010001", "99999", "9999") for c in range(1, 61, 2)]


def _stage1(defn: str):
    raw = toy_config_dict(defn)
    for k in list(raw):
        if k.startswith("privacy_budget_p_level"):
            raw[k] = Decimal("0.9") if k.endswith("_2_county") else 0
    cfg = config(raw)
    pub = public(cfg, real_iterations(), BLOCKS)
    product = SafeTabP()
    spec = next(s for s in product.plan(cfg, pub) if s.detail["stage"] == 1)
    prepared = product.prepare({"persons": persons_table([person(BLOCKS[0][0])]), "source": "p"}, pub)
    return product, prepared, spec, product.measure(prepared, spec, rng.seeded(2024))


def test_st8_discrete_gaussian_stage1_noise():
    _, _, spec, m = _stage1("zcdp")
    x = m.table["NOISY"].to_numpy()[1:]  # the first group (county 01001, iteration 1) may hold the person
    assert float(spec.noise) == 9 / (2 * 0.09)
    assert len(x) > 60000 and x.dtype == np.int64
    var = float(spec.noise)
    assert abs(x.var() / var - 1) < 0.05
    assert abs(x.mean()) < 5 * math.sqrt(var / len(x))
    assert m.rng_mode == "test" and (m.table["NOISE_DISTRIBUTION"] == "discrete_gaussian").all()
    assert np.allclose(m.table["VARIANCE"], var)


def test_st8_geometric_stage1_noise():
    _, _, spec, m = _stage1("puredp")
    x = m.table["NOISY"].to_numpy()[1:]
    b = float(spec.noise)
    assert b == 9 / 0.09
    a = math.exp(-1 / b)
    var = 2 * a / (1 - a) ** 2
    assert abs(x.var() / var - 1) < 0.05
    assert abs(x.mean()) < 5 * math.sqrt(var / len(x))
    assert np.allclose(m.table["VARIANCE"], var)


def test_seeded_measurement_is_reproducible_and_stage2_needs_stage1():
    """Same seed, same key → same noise (test mode); stage 2 refuses to run without the stage-1 table."""
    product, prepared, spec, m = _stage1("zcdp")
    again = product.measure(prepared, spec, rng.seeded(2024))
    assert (again.table["NOISY"].to_numpy() == m.table["NOISY"].to_numpy()).all()
    stage2 = spec.__class__(**{**spec.__dict__, "key": spec.key.replace("stage1", "stage2"),
                               "detail": {**spec.detail, "stage": 2, "total_only_noise": spec.noise,
                                          "total_only_variance": spec.variance}})
    with pytest.raises(DasflowError, match="stage-1"):
        product.measure(prepared, stage2, rng.seeded(1))
    out = product.measure(with_stage1(prepared, m), stage2, rng.seeded(1))
    assert len(out.table) > 0
