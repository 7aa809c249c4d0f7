"""Zero suppression: the threshold equals the noise quantile P(noise ≤ t) ≥ chance (production semantics)."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import numpy as np

from dasflow.privacy import rng
from dasflow.products.safetab_p.outputs import suppression_threshold
from dasflow.products.safetab_p.product import run_universe
from tests.safetab_p.helpers import config, person, persons_table, public, real_iterations, toy_config_dict


def _pmf_direct(mech: str, noise: float, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    x = np.arange(lo, hi + 1)
    if mech == "discrete_gaussian":
        w = np.array([math.exp(-(k * k) / (2 * noise)) for k in x])
    else:
        w = np.array([math.exp(-abs(k) / noise) for k in x])
    return x, w / w.sum()


def _quantile(x: np.ndarray, p: np.ndarray, chance: float) -> int:
    c = np.cumsum(p)
    return int(x[np.argmax(c >= chance - 1e-12)])


def test_threshold_single_draw_equals_quantile():
    """t = smallest integer with P(noise ≤ t) ≥ chance, for both mechanisms (direct pmf sums)."""
    for mech, noise in (("discrete_gaussian", Fraction(9, 2 * Fraction("0.1431"))),
                        ("discrete_gaussian", Fraction(1, 2)),
                        ("two_sided_geometric", Fraction(9, 2)), ("two_sided_geometric", Fraction(1, 3))):
        for chance in (Fraction("0.9999"), Fraction("0.5"), Fraction("0.9")):
            hi = int(60 * float(noise)) + 60
            x, p = _pmf_direct(mech, float(noise), -hi, hi)
            assert suppression_threshold(mech, noise, 1, chance) == _quantile(x, p, float(chance))


def test_threshold_of_summed_cells_equals_convolution_quantile():
    """A T1 summed from n Step-2 cells has the n-fold convolution as its noise: checked by direct
    convolution."""
    for mech, noise, n in (("discrete_gaussian", Fraction(31), 8),
                           ("two_sided_geometric", Fraction(5, 2), 18)):
        hi = int(60 * float(noise)) + 60
        _, p = _pmf_direct(mech, float(noise), -hi, hi)
        q = p
        for _ in range(n - 1):
            q = np.convolve(q, p)
        xs = np.arange(-hi * n, hi * n + 1)
        assert suppression_threshold(mech, noise, n, Fraction("0.9999")) == _quantile(xs, q, 0.9999)


def test_no_threshold_when_chance_zero_or_noise_off():
    assert suppression_threshold("discrete_gaussian", Fraction(3), 1, Fraction(0)) == -math.inf
    assert suppression_threshold("none", Fraction(0), 1, Fraction("0.9999")) == -math.inf


def test_suppression_applied_below_state_only():
    """T1 rows at COUNTY with COUNT ≤ t are dropped; USA and STATE keep every group."""
    raw = toy_config_dict("zcdp")
    raw["zero_suppression_chance"] = Decimal("0.9")
    for k in list(raw):
        if k.startswith("privacy_budget_p_level"):
            raw[k] = Decimal("0.5") if k.endswith(("_2_county", "_2_usa", "_2_state")) else 0
    cfg = config(raw)
    index = real_iterations()
    blocks = [("010010000010001", "99999", "9999")]
    res = run_universe(public(cfg, index, blocks), {"persons": persons_table([person()] * 3), "source": "p"},
                       rng.seeded(11))
    t1 = res.tables["t1"]
    n_it = index.levels[2].n_iterations
    assert (t1.REGION_TYPE == "USA").sum() == n_it and (t1.REGION_TYPE == "STATE").sum() == n_it
    spec = res.measurements["safetab-p/US/COUNTY/2/stage2"].spec
    t_two = suppression_threshold(spec.mechanism, spec.noise, 1, Fraction("0.9"))
    t_to = suppression_threshold(spec.mechanism, spec.detail["total_only_noise"], 1, Fraction("0.9"))
    county = t1[t1.REGION_TYPE == "COUNTY"]
    assert (min(t_two, t_to) < county.COUNT).all()
    assert 0 < len(county) < n_it  # ~10 % of the (almost all zero) groups survive
