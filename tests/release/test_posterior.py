"""PHSafe statistical post-processing: truncated-normal count posteriors and wedge-constrained ratio
posteriors, checked against seeded Monte Carlo (phsafe.md §3 "Statistical postprocessing";
phsafe-production.md, last section).

Every Monte Carlo check compares an exact (quadrature/closed-form) value with a sample statistic using a
5-standard-error tolerance: the false-failure rate per check is 5.7e-7 (two-sided normal tail), below 1e-5 for
the whole module. The RNG is seeded, so the tests are deterministic anyway.
"""

from __future__ import annotations

import numpy as np
import pytest

from dasflow.postprocess import posterior
from dasflow.postprocess.posterior import (
    _GridCdf,
    _log_diff_ndtr_fixed,
    _lower_terms,
    count_posterior,
    log_diff_ndtr,
    ratio_posterior,
)

Z5 = 5.0


def _check_mc(samples: np.ndarray, mean: float, lower: float, upper: float) -> None:
    n = len(samples)
    assert n > 50_000
    se = samples.std() / np.sqrt(n)
    assert abs(samples.mean() - mean) < Z5 * se, (samples.mean(), mean, se)
    for q, p in ((lower, 0.05), (upper, 0.95)):
        frac = float((samples <= q).mean())
        assert abs(frac - p) < Z5 * np.sqrt(p * (1 - p) / n), (q, p, frac)


@pytest.mark.parametrize(("z", "v"), [(-20.0, 100.0), (0.0, 100.0), (3.0, 4.0), (20.0, 25.0), (459.0, 92401.68)])
def test_count_posterior_matches_monte_carlo(z: float, v: float) -> None:
    """Truncated normal N(Z, V) on [0, inf): mean and 90 % interval vs rejection sampling (seed 777)."""
    g = np.random.default_rng(777)
    y = g.normal(z, np.sqrt(v), 3_000_000)
    y = y[y >= 0]
    post = count_posterior([z], [v])
    _check_mc(y, float(post.mean[0]), float(post.lower[0]), float(post.upper[0]))


def test_count_posterior_limits_and_far_tail() -> None:
    """Far above zero the posterior is the likelihood (Z ± 1.645σ); far below zero the mean tends to
    σ²/|Z| (asymptotic truncated-normal mean) and stays finite, non-negative and ordered."""
    post = count_posterior([10_000.0, -1e6, -50.0], [100.0, 100.0, 1.0])
    assert post.mean[0] == pytest.approx(10_000.0, abs=1e-9)
    assert post.lower[0] == pytest.approx(10_000 - 1.6448536 * 10, abs=1e-4)
    assert post.upper[0] == pytest.approx(10_000 + 1.6448536 * 10, abs=1e-4)
    assert post.mean[1] == pytest.approx(100.0 / 1e6, rel=1e-3)
    assert post.mean[2] == pytest.approx(1 / 50, rel=1e-2)
    assert np.all(np.isfinite(post.mean)) and np.all(post.lower >= 0)
    assert np.all((post.lower <= post.mean) & (post.mean <= post.upper))


def test_count_posterior_variance_zero_is_the_published_value() -> None:
    """An infinite (test-only) budget publishes variance 0: the estimate is the exact count."""
    post = count_posterior([0.0, 7.0, 123.0], [0.0, 0.0, 0.0])
    np.testing.assert_allclose(post.mean, [0.0, 7.0, 123.0], atol=1e-5)
    np.testing.assert_allclose(post.upper, [0.0, 7.0, 123.0], atol=1e-5)


def test_count_posterior_rejects_negative_variance() -> None:
    with pytest.raises(ValueError, match="variances"):
        count_posterior([1.0], [-1.0])


def test_log_diff_ndtr_is_accurate_in_both_tails() -> None:
    from scipy import special
    a = np.array([-3.0, 8.0, 40.0, -41.0, 1.0])
    b = np.array([2.0, 9.0, 41.0, -40.0, 1.0])
    got = log_diff_ndtr(a, b)
    assert got[0] == pytest.approx(np.log(special.ndtr(2.0) - special.ndtr(-3.0)), rel=1e-12)
    assert got[1] == pytest.approx(np.log(special.ndtr(-8.0) - special.ndtr(-9.0)), rel=1e-10)
    assert np.isfinite(got[2]) and got[2] < -800  # exp underflows, the log does not
    assert got[3] == pytest.approx(got[2], rel=1e-12)  # symmetry
    assert got[4] == -np.inf


RATIO_CASES = [
    # zn, vn, zd, vd, lo  (PHSafe-sized variances: US σ² ≈ 92402 / 90909, state ≈ 1709)
    (459.0, 92401.68, -100.0, 90909.0, 1.0),   # negative noisy denominator
    (2500.0, 1700.0, 1000.0, 1700.0, 1.0),     # well-determined
    (30.0, 1700.0, 10.0, 1700.0, 2.0),         # family average, small counts
    (300.0, 1700.0, -40.0, 1700.0, 0.0),       # age component (lo = 0)
    (-100.0, 5000.0, 40.0, 400.0, 0.0),        # negative noisy numerator
]


@pytest.mark.parametrize(("zn", "vn", "zd", "vd", "lo"), RATIO_CASES)
def test_ratio_posterior_matches_monte_carlo(zn: float, vn: float, zd: float, vd: float, lo: float) -> None:
    """Joint truncated normal over (Yn, Yd) on {Yd >= 1, lo·Yd <= Yn <= 10·Yd}: ratio mean and 90 % interval,
    numerator and denominator means vs rejection sampling (seed 777, 4e6 proposals)."""
    g = np.random.default_rng(777)
    n = 4_000_000
    yn = g.normal(zn, np.sqrt(vn), n)
    yd = g.normal(zd, np.sqrt(vd), n)
    keep = (yd >= 1) & (yn >= lo * yd) & (yn <= 10 * yd)
    post = ratio_posterior(zn, vn, zd, vd, lo=lo)
    _check_mc(yn[keep] / yd[keep], float(post.mean[0]), float(post.lower[0]), float(post.upper[0]))
    for samples, mean in ((yn[keep], post.numerator_mean[0]), (yd[keep], post.denominator_mean[0])):
        assert abs(samples.mean() - mean) < Z5 * samples.std() / np.sqrt(keep.sum())


def test_ratio_posterior_is_vectorised_reproducible_and_bounded() -> None:
    """A batch equals the cells one by one, two runs are bit-identical (deterministic quadrature: the
    'fixed seed' of the Census's Monte Carlo is not needed), and every estimate lies in [lo, 10]."""
    cols = [np.array(c) for c in zip(*RATIO_CASES, strict=True)]
    batch = ratio_posterior(cols[0], cols[1], cols[2], cols[3], lo=cols[4])
    again = ratio_posterior(cols[0], cols[1], cols[2], cols[3], lo=cols[4])
    for field in ("mean", "lower", "upper", "numerator_mean", "denominator_mean"):
        assert getattr(batch, field).tobytes() == getattr(again, field).tobytes()
    for i, (zn, vn, zd, vd, lo) in enumerate(RATIO_CASES):
        one = ratio_posterior(zn, vn, zd, vd, lo=lo)
        assert one.mean[0] == pytest.approx(batch.mean[i], rel=1e-9)
        assert one.upper[0] == pytest.approx(batch.upper[i], rel=1e-9)
    assert np.all(batch.lower >= cols[4]) and np.all(batch.upper <= 10)
    assert np.all((batch.lower <= batch.mean) & (batch.mean <= batch.upper))
    assert np.all(batch.denominator_mean >= 1)


def test_ratio_posterior_exact_inputs_give_the_exact_ratio() -> None:
    """Variance 0 on both sides (infinite budget): the estimate is the true average."""
    post = ratio_posterior([250.0, 90.0], [0.0, 0.0], [100.0, 30.0], [0.0, 0.0], lo=1.0)
    np.testing.assert_allclose(post.mean, [2.5, 3.0], rtol=1e-6)
    np.testing.assert_allclose(post.lower, [2.5, 3.0], rtol=1e-5)
    np.testing.assert_allclose(post.upper, [2.5, 3.0], rtol=1e-5)


def test_ratio_posterior_rejects_bad_bounds() -> None:
    with pytest.raises(ValueError, match="bounds"):
        ratio_posterior(1.0, 1.0, 1.0, 1.0, lo=10.0, hi=10.0)


def test_log_diff_ndtr_with_a_fixed_lower_bound_is_bit_identical() -> None:
    """The ratio CDF's shortcut (``a``'s terms computed once) equals ``log_diff_ndtr`` bit for bit, both tails,
    ``a == b`` and far tails included."""
    gen = np.random.default_rng(7)
    a = np.concatenate([gen.normal(0, 3, 4000), gen.normal(0, 40, 1000), [0.0, -0.0, 1e-300, 38.0, -38.0]])
    a = a.reshape(-1, 5)
    upper, fixed = _lower_terms(a)
    for b in (a + np.abs(gen.normal(0, 2, a.shape)), a, np.maximum(a, gen.normal(0, 5, a.shape)), a + 1e-12):
        np.testing.assert_array_equal(_log_diff_ndtr_fixed(a, upper, fixed, b), log_diff_ndtr(a, b))


def _random_ratio_cells(seed: int, n: int) -> tuple[np.ndarray, ...]:
    """Noisy numerators/denominators and variances over the whole range: negative and near-zero counts,
    variances 0 (σ floor), tiny and huge, ratios outside [lo, 10], lo in {0, 1, 2}."""
    g = np.random.default_rng(seed)
    zd = np.where(g.random(n) < 0.3, g.normal(0, 50, n), g.lognormal(3, 2, n))
    zn = zd * g.uniform(-1, 12, n) + g.normal(0, 30, n) * (g.random(n) < 0.5)

    def variance() -> np.ndarray:
        return np.choose(g.integers(0, 5, n), [np.zeros(n), g.lognormal(0, 1, n), g.lognormal(7, 2, n),
                                               g.lognormal(12, 1, n), np.full(n, 1e-3)])
    return zn, variance(), zd, variance(), np.choose(g.integers(0, 3, n), [np.zeros(n), np.ones(n),
                                                                          np.full(n, 2.0)])


@pytest.mark.parametrize("seed", [11, 12])
def test_ratio_quantiles_equal_the_plain_bisection_bit_for_bit(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The replayed search (Newton steps, then only the undecided midpoints) returns the bits of the plain
    44-step bisection that evaluates the CDF of every cell at every midpoint, over 1,500 random cells; and the
    CDF of a subset of cells (in row blocks) equals the old all-cells formula with ``log_diff_ndtr``."""
    seen: list[tuple[_GridCdf, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    replay = posterior._bisect_quantiles

    def spy(cdf: _GridCdf, cells: np.ndarray, p: np.ndarray, lo: np.ndarray, hi: np.ndarray,
            start: np.ndarray) -> np.ndarray:
        out = replay(cdf, cells, p, lo, hi, start)
        seen.append((cdf, cells, p, lo, hi, out))
        return out

    monkeypatch.setattr(posterior, "_bisect_quantiles", spy)
    zn, vn, zd, vd, lo = _random_ratio_cells(seed, 1500)
    post = ratio_posterior(zn, vn, zd, vd, lo=lo)
    (cdf, cells, p, lo2, hi2, out), = seen
    assert np.array_equal(out, np.concatenate([post.lower, post.upper]))

    def whole(r: np.ndarray) -> np.ndarray:  # the old CDF: all cells at once, no row blocks
        c = (r[:, None] * cdf.d - cdf.zn[:, None]) / cdf.sn[:, None]
        with np.errstate(all="ignore"):
            return np.asarray((cdf.w * np.exp(log_diff_ndtr(cdf.a, np.maximum(c, cdf.a)) - cdf.lw)).sum(axis=1))

    x, y = lo2.copy(), hi2.copy()
    for _ in range(posterior.QUANTILE_STEPS):
        mid = 0.5 * (x + y)
        low = cdf(cells, mid)[0] < p
        x, y = np.where(low, mid, x), np.where(low, y, mid)
    assert (0.5 * (x + y)).tobytes() == out.tobytes()
    r = np.random.default_rng(seed).uniform(0.0, 10.0, len(zn))
    every = whole(r)
    some = np.random.default_rng(seed).permutation(len(zn))[:700]
    assert cdf(np.arange(len(zn)), r)[0].tobytes() == every.tobytes()
    assert cdf(some, r[some])[0].tobytes() == every[some].tobytes()
