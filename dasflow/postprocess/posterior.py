"""Posteriors of true counts and ratios given noisy counts (PHSafe statistical post-processing, phsafe.md §3).

Model (the Census's ``SDHC_Model_Based_Estimates``, phsafe.md §3 "Statistical postprocessing"): a noisy count
``Z`` is ``Y + noise`` with the noise approximated by a continuous Gaussian of the published variance ``V``
(discrete Gaussian and two-sided geometric alike), and the prior is flat on the feasible set.

* **Counts** — prior ``1{Y >= 0}``: the posterior is ``N(Z, V)`` truncated to ``[0, inf)``. Mean and quantiles
  are closed-form (:func:`count_posterior`), evaluated with ``log_ndtr`` / ``ndtri_exp`` so that cells whose
  noisy count lies far below zero stay exact.
* **Ratios** — independent noisy numerator ``Zn ~ N(Yn, Vn)`` and denominator ``Zd ~ N(Yd, Vd)``, flat prior
  on the wedge ``{Yd >= d_min, lo*Yd <= Yn <= hi*Yd}``: a bivariate truncated normal (:func:`ratio_posterior`).
  The Census drew 1e6 Monte Carlo samples per cell (seed 777); dasflow integrates instead, which is
  deterministic (bit-reproducible, no seed) and far more accurate: integrating ``Yn`` out in closed form leaves
  the one-dimensional density of ``Yd``

      p(d) ∝ N(d; Zd, Vd) · [Φ((hi·d − Zn)/σn) − Φ((lo·d − Zn)/σn)],   d >= d_min,

  which is log-concave (Prékopa: a Gaussian integrated over a convex set), so it is unimodal and its
  log-density falls at least as fast as that of ``N(·, Vd)`` away from the mode. The mode is found by
  bisection on the analytic derivative, the support by bisection down to ``exp(-36)`` of the peak on each
  side, and the integrals by composite Simpson on a grid of that support. The ratio's CDF
  ``P(Yn/Yd <= r) = E_d[P(Yn <= r·d | d)]`` is monotone in ``r``, so quantiles come from bisection (44 steps,
  replayed after Newton steps have located the root: :func:`_bisect_quantiles`).

A variance of 0 (an infinite, test-only budget) is treated as a Gaussian with σ = 1e-6: numerically a point
mass at the published value. Everything is vectorised over cells (loops run over bisection steps only).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy import special

Array = npt.NDArray[np.float64]

#: smallest standard deviation used (variance 0 = exact value, see the module docstring)
SIGMA_FLOOR = 1e-6
#: the support of p(d) is where its log-density is within this many nats of the peak
SUPPORT_NATS = 36.0
#: Simpson grid size over that support (odd)
GRID = 257
#: bisection steps of the ratio's quantiles (resolution (hi − lo)/2^44)
QUANTILE_STEPS = 44
#: rounding noise allowed in a computed ratio CDF (see _bisect_quantiles; ≈ 2.3e-13)
MARGIN = 2.0 ** -42
_NEWTON_STEPS = 16
_NEWTON_TOL = 1e-9
_ROW_BLOCK = 128
_LOG_SQRT_2PI = 0.5 * np.log(2 * np.pi)


def _sigma(variance: npt.ArrayLike) -> Array:
    v = np.asarray(variance, dtype=np.float64)
    if np.any(~np.isfinite(v)) or np.any(v < 0):
        raise ValueError("variances must be finite and >= 0")
    return np.maximum(np.sqrt(v), SIGMA_FLOOR)


def log_phi(x: Array) -> Array:
    """log of the standard normal density."""
    out: Array = -0.5 * x * x - _LOG_SQRT_2PI
    return out


def log_diff_ndtr(a: Array, b: Array) -> Array:
    """``log(Φ(b) − Φ(a))`` for ``a <= b`` without cancellation (−inf where ``a == b``)."""
    a, b = np.broadcast_arrays(np.asarray(a, np.float64), np.asarray(b, np.float64))
    upper = a > 0  # both in the upper tail: use Φ(−a) − Φ(−b)
    hi = np.where(upper, special.log_ndtr(-a), special.log_ndtr(b))
    lo = np.where(upper, special.log_ndtr(-b), special.log_ndtr(a))
    with np.errstate(divide="ignore", invalid="ignore"):
        out = hi + np.log1p(-np.exp(lo - hi))
    return np.where(a >= b, -np.inf, out)


def _lower_terms(a: Array) -> tuple[npt.NDArray[np.bool_], Array]:
    """``a``'s part of :func:`log_diff_ndtr` for a fixed lower bound: its tail (``a > 0``) and ``log Φ(−a)`` in
    the upper tail, ``log Φ(a)`` elsewhere (the tail choice depends on ``a`` only)."""
    upper = a > 0
    return upper, np.where(upper, special.log_ndtr(-a), special.log_ndtr(a))


def _log_diff_ndtr_fixed(a: Array, upper: npt.NDArray[np.bool_], fixed: Array, b: Array) -> Array:
    """``log_diff_ndtr(a, b)`` bit for bit, given ``_lower_terms(a)``: one ``log_ndtr`` (of ``−b`` in the upper
    tail, ``b`` elsewhere) instead of four."""
    varying = special.log_ndtr(np.where(upper, -b, b))
    hi = np.where(upper, fixed, varying)
    lo = np.where(upper, varying, fixed)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = hi + np.log1p(-np.exp(lo - hi))
    result: Array = np.where(a >= b, -np.inf, out)
    return result


# ------------------------------------------------------------------------------------------------- counts
@dataclass(frozen=True)
class CountPosterior:
    """Posterior mean and equal-tailed credible interval of true counts (arrays over cells)."""

    mean: Array
    lower: Array
    upper: Array


def shifted_mills(t: Array) -> Array:
    """``t + φ(t)/Φ(t)`` (the mean of N(t, 1) truncated to [0, inf)) without cancellation.

    Direct formula for ``t > −100`` (relative error ≲ 1e-16·t⁴ ≤ 1e-8); below, the asymptotic series
    ``(1/x)(1 − 2/x² + 10/x⁴ − 74/x⁶)`` with ``x = −t`` (from the Mills-ratio expansion
    ``Φ(−x)/φ(x) ~ (1/x)(1 − 1/x² + 3/x⁴ − 15/x⁶ + 105/x⁸)``; truncation error < 1e-12 relative).
    """
    t = np.asarray(t, np.float64)
    far = t < -100.0
    safe = np.where(far, -100.0, t)
    direct = safe + np.exp(log_phi(safe) - special.log_ndtr(safe))
    x = np.where(far, -t, 100.0)
    u = 1.0 / (x * x)
    series = (1.0 - 2.0 * u + 10.0 * u * u - 74.0 * u ** 3) / x
    return np.where(far, series, direct)


def truncnorm_quantile(z: Array, s: Array, p: float) -> Array:
    """The ``p``-quantile of ``N(z, s²)`` truncated to ``[0, inf)``: ``P(Y > y) = Φ((z − y)/s)/Φ(z/s)``."""
    log_tail = np.log1p(-p) + special.log_ndtr(z / s)
    out: Array = np.maximum(z - s * special.ndtri_exp(log_tail), 0.0)
    return out


def count_posterior(noisy: npt.ArrayLike, variance: npt.ArrayLike, level: float = 0.9) -> CountPosterior:
    """Posterior of true counts ``Y >= 0`` given ``Z = noisy`` and Gaussian noise of ``variance``.

    ``mean = Z + σ·φ(Z/σ)/Φ(Z/σ)`` (:func:`shifted_mills`); the interval is the ``(1 − level)/2`` and
    ``(1 + level)/2`` quantiles.
    """
    z = np.asarray(noisy, dtype=np.float64)
    s = _sigma(variance)
    z, s = np.broadcast_arrays(z, s)
    t = z / s
    mean = np.maximum(s * shifted_mills(t), 0.0)
    alpha = (1.0 - level) / 2.0
    return CountPosterior(mean=mean, lower=truncnorm_quantile(z, s, alpha),
                          upper=truncnorm_quantile(z, s, 1.0 - alpha))


# ------------------------------------------------------------------------------------------------- ratios
@dataclass(frozen=True)
class RatioPosterior:
    """Posterior summaries of ``Yn/Yd`` (and of ``Yn``, ``Yd``) under the wedge prior (arrays over cells)."""

    mean: Array
    lower: Array
    upper: Array
    numerator_mean: Array
    denominator_mean: Array


@dataclass(frozen=True)
class _Model:
    zn: Array
    sn: Array
    zd: Array
    vd: Array
    lo: Array
    hi: Array
    d_min: float

    def log_density(self, d: Array) -> Array:
        """Unnormalised log p(d) (see the module docstring); ``d`` broadcasts against the cell arrays."""
        a = (self.lo * d - self.zn) / self.sn
        b = (self.hi * d - self.zn) / self.sn
        return -0.5 * (d - self.zd) ** 2 / self.vd + log_diff_ndtr(a, b)

    def slope(self, d: Array) -> Array:
        """d/dd log p(d): −(d − Zd)/Vd + [hi·φ(b) − lo·φ(a)] / (σn·(Φ(b) − Φ(a)))."""
        a = (self.lo * d - self.zn) / self.sn
        b = (self.hi * d - self.zn) / self.sn
        lw = log_diff_ndtr(a, b)
        with np.errstate(over="ignore", invalid="ignore"):
            term = (self.hi * np.exp(log_phi(b) - lw) - self.lo * np.exp(log_phi(a) - lw)) / self.sn
        return -(d - self.zd) / self.vd + np.nan_to_num(term, nan=0.0, posinf=1e300)


def _mode(m: _Model) -> Array:
    """Mode of the log-concave p(d) on [d_min, inf): bisection on the sign of its slope."""
    left = np.full_like(m.zd, m.d_min)
    at_min = m.slope(left) <= 0
    scale = np.sqrt(m.vd) + m.sn / np.maximum(m.hi, 1e-12) + 1.0
    right = np.maximum(np.maximum(m.zd, (m.zn + m.sn) / np.maximum(m.lo, 1e-12)), left) + scale
    right = np.where(np.isfinite(right), right, left + scale)
    for _ in range(200):
        rising = (m.slope(right) > 0) & ~at_min
        if not rising.any():
            break
        right = np.where(rising, left + 2.0 * (right - left), right)
    for _ in range(120):
        mid = 0.5 * (left + right)
        up = m.slope(mid) > 0
        left = np.where(up, mid, left)
        right = np.where(up, right, mid)
    return np.where(at_min, m.d_min, 0.5 * (left + right))


def _edges(m: _Model, mode: Array) -> tuple[Array, Array]:
    """Points left and right of the mode where log p falls ``SUPPORT_NATS`` below its peak."""
    floor = m.log_density(mode) - SUPPORT_NATS
    sd = np.sqrt(m.vd)
    # left edge in [d_min, mode]
    lo_end = np.full_like(mode, m.d_min)
    cut_left = m.log_density(lo_end) < floor
    a, b = lo_end.copy(), mode.copy()
    for _ in range(80):
        mid = 0.5 * (a + b)
        below = m.log_density(mid) < floor
        a = np.where(below, mid, a)
        b = np.where(below, b, mid)
    left = np.where(cut_left, a, m.d_min)
    # right edge: expand until below the floor, then bisect
    step = sd + m.sn / np.maximum(m.hi, 1e-12) + 1e-9
    right = mode + step
    for _ in range(200):
        high = m.log_density(right) >= floor
        if not high.any():
            break
        step = np.where(high, 2.0 * step, step)
        right = np.where(high, mode + step, right)
    a, b = mode.copy(), right
    for _ in range(80):
        mid = 0.5 * (a + b)
        above = m.log_density(mid) >= floor
        a = np.where(above, mid, a)
        b = np.where(above, b, mid)
    return left, b


def _simpson_weights(n: int) -> Array:
    w = np.ones(n)
    w[1:-1:2] = 4.0
    w[2:-1:2] = 2.0
    return w / 3.0


class _GridCdf:
    """The ratio's CDF on each cell's Simpson grid, ``S(r) = Σ_j w_j·P(Yn <= r·d_j | d_j)`` (and its density),
    evaluated for any list of cells. A cell's value is computed element-wise and summed over its own row only,
    so it does not depend on the other cells evaluated with it: bit-identical to evaluating every cell at once.
    Rows are evaluated in blocks of ``_ROW_BLOCK`` to bound the temporaries."""

    def __init__(self, d: Array, w: Array, a: Array, lw: Array, zn: Array, sn: Array) -> None:
        self.d, self.w, self.a, self.lw, self.zn, self.sn = d, w, a, lw, zn, sn
        self.upper, self.fixed = _lower_terms(a)

    def __call__(self, cells: npt.NDArray[np.intp], r: Array, density: bool = False) -> tuple[Array, Array]:
        """``S(r[i])`` for cell ``cells[i]`` (and its derivative in ``r`` if ``density``, else zeros)."""
        value = np.empty(len(cells))
        slope = np.zeros(len(cells))
        for start in range(0, len(cells), _ROW_BLOCK):
            part = slice(start, start + _ROW_BLOCK)
            rows = cells[part]
            d, a, lw = self.d[rows], self.a[rows], self.lw[rows]
            sn = self.sn[rows][:, None]
            c = (r[part][:, None] * d - self.zn[rows][:, None]) / sn
            log_f = _log_diff_ndtr_fixed(a, self.upper[rows], self.fixed[rows], np.maximum(c, a))
            w = self.w[rows]
            value[part] = (w * np.exp(log_f - lw)).sum(axis=1)
            if density:  # d/dr P(Yn <= r·d | d) = φ(c)·d/σn / (Φ(b) − Φ(a)); only steers the search
                with np.errstate(over="ignore", invalid="ignore"):
                    slope[part] = (w * np.exp(log_phi(c) - lw) * d).sum(axis=1) / sn[:, 0]
        return value, slope


def _bisect_quantiles(cdf: _GridCdf, cells: npt.NDArray[np.intp], p: Array, lo: Array, hi: Array,
                      start: Array) -> Array:
    """Per row ``i``: ``QUANTILE_STEPS`` bisection steps for ``S(r) = p[i]`` on ``[lo[i], hi[i]]`` (cell
    ``cells[i]``), with the result bits of evaluating ``S`` at every midpoint, at a fraction of the cost.

    ``S`` is non-decreasing in ``r`` (a mixture of conditional CDFs) and a computed ``S`` departs from that
    non-decreasing function by rounding noise far below ``MARGIN`` (at most 4.4e-15 measured over the demo's and
    extreme random cells, against 2.3e-13; tests/release/test_posterior.py compares with the plain bisection bit
    for bit). So a point ``X`` with computed ``S(X) < p − MARGIN`` decides ``S(m) < p`` for every midpoint
    ``m <= X``, and a point ``Y`` with ``S(Y) >= p + MARGIN`` decides ``S(m) >= p`` for every ``m >= Y``.
    Safeguarded Newton steps (from ``start``) first find such points on both sides close to the root; the
    bisection is then replayed, evaluating ``S`` exactly as the plain bisection does but only at midpoints
    strictly between them: ≈ 11 evaluations per row on the demo instead of 44.
    """
    n = len(cells)
    margin = MARGIN
    below_at = np.full(n, -np.inf)  # largest point known to have S < p − margin
    above_at = np.full(n, np.inf)   # smallest point known to have S >= p + margin

    def learn(rows: npt.NDArray[np.intp], r: Array, s: Array) -> None:
        below = s < p[rows] - margin
        above = s >= p[rows] + margin
        below_at[rows] = np.where(below, np.maximum(below_at[rows], r), below_at[rows])
        above_at[rows] = np.where(above, np.minimum(above_at[rows], r), above_at[rows])

    rows = np.arange(n)
    edge = (hi - lo) / 256.0
    r = np.where(np.isfinite(start), np.clip(start, lo + edge, hi - edge), 0.5 * (lo + hi))
    for _ in range(_NEWTON_STEPS):
        if not rows.size:
            break
        s, slope = cdf(cells[rows], r, density=True)
        learn(rows, r, s)
        x, y = np.maximum(below_at[rows], lo[rows]), np.minimum(above_at[rows], hi[rows])
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            step = r - (s - p[rows]) / slope
        inside = np.isfinite(step) & (step > x) & (step < y)
        near = inside & (np.abs(s - p[rows]) < _NEWTON_TOL)
        if near.any():  # converged: probe 2·MARGIN/slope either side of the Newton step
            close, t = rows[near], step[near]
            h = 2.0 * margin / slope[near]
            for probe in (t - h, t + h):
                learn(close, probe, cdf(cells[close], probe)[0])
        keep = ~near
        rows, r = rows[keep], np.where(inside, step, 0.5 * (x + y))[keep]
    x, y = lo.copy(), hi.copy()
    for _ in range(QUANTILE_STEPS):
        mid = 0.5 * (x + y)
        low = mid <= below_at
        open_rows = np.flatnonzero(~low & (mid < above_at))
        if open_rows.size:
            s = cdf(cells[open_rows], mid[open_rows])[0]
            learn(open_rows, mid[open_rows], s)
            low[open_rows] = s < p[open_rows]
        x = np.where(low, mid, x)
        y = np.where(low, y, mid)
    out: Array = 0.5 * (x + y)
    return out


def ratio_posterior(num: npt.ArrayLike, num_variance: npt.ArrayLike, den: npt.ArrayLike,
                    den_variance: npt.ArrayLike, lo: npt.ArrayLike, hi: npt.ArrayLike = 10.0,
                    d_min: float = 1.0, level: float = 0.9) -> RatioPosterior:
    """Posterior of the ratio ``Yn/Yd`` given noisy ``num``, ``den`` (see the module docstring).

    ``lo``/``hi`` bound the ratio (scalars or per-cell arrays; ``lo`` may be 0), ``d_min`` the denominator.
    Returns the posterior mean of the ratio, its equal-tailed ``level`` credible interval, and the posterior
    means of numerator and denominator under the same model.
    """
    zn = np.atleast_1d(np.asarray(num, np.float64))
    zd = np.atleast_1d(np.asarray(den, np.float64))
    sn = _sigma(num_variance)
    sd = _sigma(den_variance)
    lo_a = np.asarray(lo, np.float64)
    hi_a = np.asarray(hi, np.float64)
    zn, sn, zd, sd, lo_a, hi_a = (np.array(x, np.float64) for x in np.broadcast_arrays(zn, sn, zd, sd, lo_a, hi_a))
    if np.any(lo_a < 0) or np.any(hi_a <= lo_a):
        raise ValueError("ratio bounds must satisfy 0 <= lo < hi")
    if d_min <= 0:
        raise ValueError("d_min must be > 0")
    m = _Model(zn=zn[:, None], sn=sn[:, None], zd=zd[:, None], vd=(sd * sd)[:, None], lo=lo_a[:, None],
               hi=hi_a[:, None], d_min=d_min)
    flat = _Model(zn=zn, sn=sn, zd=zd, vd=sd * sd, lo=lo_a, hi=hi_a, d_min=d_min)
    mode = _mode(flat)
    left, right = _edges(flat, mode)
    u = np.linspace(0.0, 1.0, GRID)
    d = left[:, None] + (right - left)[:, None] * u[None, :]
    a = (m.lo * d - m.zn) / m.sn
    b = (m.hi * d - m.zn) / m.sn
    lw = log_diff_ndtr(a, b)
    logp = -0.5 * (d - m.zd) ** 2 / m.vd + lw  # m.log_density(d), its log_diff_ndtr term computed once
    logp -= logp.max(axis=1, keepdims=True)
    w = np.exp(logp) * _simpson_weights(GRID)[None, :]
    w /= w.sum(axis=1, keepdims=True)
    cond_mean = m.zn + m.sn * (np.exp(log_phi(a) - lw) - np.exp(log_phi(b) - lw))
    cond_mean = np.clip(np.nan_to_num(cond_mean), m.lo * d, m.hi * d)
    ratio_mean = (w * cond_mean / d).sum(axis=1)
    num_mean = (w * cond_mean).sum(axis=1)
    den_mean = (w * d).sum(axis=1)

    # where the quantile search starts (it steers the search only): a normal approximation of the ratio, its
    # variance from the conditional truncated-normal variances on the grid
    with np.errstate(all="ignore"):
        pa, pb = np.exp(log_phi(a) - lw), np.exp(log_phi(b) - lw)
        cond_var = np.clip(np.nan_to_num(m.sn ** 2 * (1.0 + a * pa - b * pb - (pa - pb) ** 2)), 0.0,
                           ((m.hi - m.lo) * d) ** 2)
        spread = np.sqrt(np.maximum((w * (cond_var + cond_mean ** 2) / d ** 2).sum(axis=1) - ratio_mean ** 2, 0.0))
    alpha = (1.0 - level) / 2.0
    n = len(zn)
    both = _bisect_quantiles(_GridCdf(d=d, w=w, a=a, lw=lw, zn=zn, sn=sn),
                             np.concatenate([np.arange(n), np.arange(n)]), np.repeat([alpha, 1.0 - alpha], n),
                             np.tile(lo_a, 2), np.tile(hi_a, 2),
                             np.concatenate([ratio_mean + special.ndtri(p) * spread for p in (alpha, 1.0 - alpha)]))
    bounds = [both[:n], both[n:]]
    return RatioPosterior(mean=ratio_mean, lower=bounds[0], upper=bounds[1], numerator_mean=num_mean,
                          denominator_mean=den_mean)
