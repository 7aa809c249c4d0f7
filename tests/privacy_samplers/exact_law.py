"""Exact reference laws for the sampler tests, in high precision (``decimal``, 60 digits; no mpmath, no
floats).

* :func:`gaussian_law` — N_Z(0, σ²) weights exp(-k²/(2σ²)) for k = 0..K (K where the weight < 1e-45), the
  normaliser Z = w_0 + 2 Σ w_k, the variance 2 Σ k² w_k / Z and the 4th moment.
* :func:`geometric_law` — two-sided geometric P(k) = (1-a)/(1+a) a^|k|, a = exp(-1/b), variance 2a/(1-a)².
* :func:`chi_square` — Pearson goodness of fit of integer samples against such a law, with contiguous bins merged
  until each expects >= max(50, n/1000) samples (tail mass folded into the two end bins).
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np
import numpy.typing as npt
from scipy import stats

CTX = decimal.Context(prec=60)
ALPHA = 1e-6  # per-assertion false-failure rate of every statistical check for a random seed
Z_CRIT = float(stats.norm.isf(ALPHA / 2))  # two-sided normal critical value at ALPHA (≈ 4.89)


def _sum(xs: Iterable[Decimal]) -> Decimal:
    with decimal.localcontext(CTX):
        return sum(xs, Decimal(0))


def dec(x: Fraction) -> Decimal:
    return CTX.divide(Decimal(x.numerator), Decimal(x.denominator))


@dataclass(frozen=True)
class Law:
    """A symmetric integer law given by its one-sided pmf p[k] = P(X = k) = P(X = -k), k = 0..K."""

    half: list[Decimal]  # P(X = k) for k = 0..K (exact to ~55 digits)
    tail: Decimal  # P(X > K) (one side)
    variance: Decimal
    fourth: Decimal

    def pmf(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """Values -K..K and their probabilities (floats, for the chi-square expected counts only)."""
        k = len(self.half) - 1
        h = np.array([float(p) for p in self.half])
        return np.arange(-k, k + 1), np.concatenate([h[:0:-1], h])

    def tail_at_least(self, k: int) -> Decimal:
        """P(|X| >= k) for k >= 1."""
        return CTX.multiply(2, CTX.add(_sum(self.half[k:]), self.tail))


def gaussian_law(sigma2: Fraction) -> Law:
    s = dec(sigma2)
    q = CTX.exp(CTX.divide(-1, s))  # exp(-1/σ²)
    c = CTX.exp(CTX.divide(Decimal(-1), CTX.multiply(2, s)))  # exp(-(2*0+1)/(2σ²))
    w = [Decimal(1)]
    k = 0
    sigma = float(sigma2) ** 0.5
    while w[-1] > Decimal("1e-45") or k < 2 * sigma:
        w.append(CTX.multiply(w[-1], c))  # w_{k+1} = w_k * exp(-(2k+1)/(2σ²))
        c = CTX.multiply(c, q)
        k += 1
    z = CTX.add(w[0], CTX.multiply(2, _sum(w[1:])))
    half = [CTX.divide(x, z) for x in w]
    var = CTX.multiply(2, _sum(CTX.multiply(i * i, p) for i, p in enumerate(half)))
    m4 = CTX.multiply(2, _sum(CTX.multiply(i**4, p) for i, p in enumerate(half)))
    return Law(half, Decimal(0), var, m4)  # tail beyond K < 1e-40: below any Monte-Carlo resolution


def geometric_law(b: Fraction, k_max: int | None = None) -> Law:
    with decimal.localcontext(CTX):
        a = (Decimal(-b.denominator) / Decimal(b.numerator)).exp()
        norm = (1 - a) / (1 + a)
        if k_max is None:
            k_max = int(float(b) * 110) + 10  # a**K < 1e-47
        half = [norm]
        for _ in range(k_max):
            half.append(half[-1] * a)
        tail = half[-1] * a / (1 - a)  # Σ_{k > K} norm a^k
        var = 2 * a / (1 - a) ** 2
        # E X^4 = 2 (1-a)/(1+a) Σ_k k^4 a^k, Σ_k k^4 a^k = a(1 + 11a + 11a² + a³)/(1-a)^5 (Eulerian numbers)
        m4 = 2 * norm * a * (1 + 11 * a + 11 * a * a + a * a * a) / (1 - a) ** 5
    return Law(half, tail, var, m4)


def chi_square(samples: npt.NDArray[np.int64], law: Law) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of Pearson's test of ``samples`` against ``law``."""
    values, probs = law.pmf()
    tail = float(law.tail)
    probs = probs.copy()
    probs[0] += tail
    probs[-1] += tail
    n = samples.size
    lo = int(values[0])
    clipped = np.clip(samples, lo, int(values[-1])) - lo
    observed = np.bincount(clipped, minlength=values.size).astype(np.float64)
    expected = probs * n
    min_exp = max(50.0, n / 1000)
    edges = [0]
    acc = 0.0
    for i, e in enumerate(expected):
        acc += e
        if acc >= min_exp:
            edges.append(i + 1)
            acc = 0.0
    if edges[-1] != values.size:
        if len(edges) > 1:
            edges[-1] = values.size
        else:
            edges.append(values.size)
    o = np.add.reduceat(observed, edges[:-1])
    e = np.add.reduceat(expected, edges[:-1])
    stat = float(np.sum((o - e) ** 2 / e))
    dof = len(e) - 1
    return stat, dof, float(stats.chi2.sf(stat, dof)) if dof > 0 else 1.0


def z_mean(samples: npt.NDArray[np.int64], law: Law) -> float:
    sd: float = (float(law.variance) / samples.size) ** 0.5
    mean = float(np.mean(samples, dtype=np.float64))
    return mean / sd


def z_variance(samples: npt.NDArray[np.int64], law: Law) -> float:
    """z-score of the sample second moment (mean known to be 0) against the exact variance."""
    x = samples.astype(np.float64)
    m2 = float(np.mean(x * x))
    var = float(law.variance)
    se: float = ((float(law.fourth) - var * var) / samples.size) ** 0.5
    return (m2 - var) / se
