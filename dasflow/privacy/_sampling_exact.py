"""Exact big-integer arithmetic behind the samplers: rigorous bounds on exp(-x), 32-bit threshold tables, and
the lazy uniform real that resolves the (probability 2**-32) cases a 32-bit word cannot decide.

Nothing here uses a float. Every function returns integers with a proven bracketing property:

* :func:`exp_neg_bounds` ``(x, p) -> (lo, hi)`` with ``lo <= 2**p * exp(-x) <= hi`` for any rational ``x``.
* :func:`floor_exp_neg` ``(x, p)`` = ``floor(2**p * exp(-x))`` exactly (refines until both bounds agree; this
  terminates because ``exp(-x)`` is irrational for rational ``x != 0``, Lindemann 1882).
* :func:`exp_neg_table` the capped floors ``min(floor(2**32 exp(-x_k)), 2**32 - 1)`` of a quadratic sequence
  ``x_k`` (all the thresholds the samplers compare against), by an interval-arithmetic recurrence with exact
  per-entry fallback.
* :func:`folded_survival_table` the same thresholds for ``P(|X| >= m) = 2 a**m / (1 + a)`` of the two-sided
  geometric (``a = exp(-1/b)``), so that ``|X|`` is drawn by inversion with no rejection.
* :class:`LazyUniform` a uniform real ``U`` in ``[0, 1)`` whose binary expansion is drawn 64 bits at a time
  only as far as needed to decide ``U < exp(-x)`` exactly.

The threshold argument used by every sampler (see :func:`decide`), with ``W = 2**32``: let ``U`` be the
uniform real whose first 32 bits are the word ``u`` (so ``u/W <= U < (u+1)/W``), ``p`` a probability and
``T = min(floor(W p), W - 1)``. Then ``u < T`` implies ``U < (u+1)/W <= T/W <= p`` (decided: ``U < p``),
``u > T`` implies ``U >= u/W >= (T+1)/W > p`` (decided: ``U >= p``; for ``p = 1`` this case cannot occur), and
only ``u == T`` is undecided: then ``U`` is uniform on ``[T/W, (T+1)/W)`` and :class:`LazyUniform` continues
with fresh bits. So ``P(U < p) = p`` exactly, with integer comparisons only. A 32-bit word halves the random
bytes of a 64-bit one; a tie costs a few microseconds of big-integer work and happens with probability 2**-32.

Why the tie is continued rather than re-drawn: answering an undecided word with a *fresh* Bernoulli(p) would
give ``P(yes) = T/W + p/W != p``. The continuation must be the conditional law of the same ``U``, i.e.
Bernoulli(``W p - T``), which is exactly what extending ``U``'s bits computes. Because ``T`` is the exact
floor (not just a bound), the undecided band is the single word ``u == T``.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from dasflow.privacy.rng import Generator

WORD_BITS = 32  # width of the uniform word that decides almost every comparison (ties: probability 2**-32)
WORD = 1 << WORD_BITS
MAX_WORD = WORD - 1
EXTEND_BITS = 64  # bits appended per round when a tie is continued


# ------------------------------------------------------------------------------------------------------------
# Interval fixed-point arithmetic (all values non-negative; an interval is (lo, hi) at scale 2**w)
# ------------------------------------------------------------------------------------------------------------
def _ceil_shift(v: int, s: int) -> int:
    """ceil(v / 2**s) for v >= 0."""
    return -((-v) >> s)


def _mul(a: tuple[int, int], b: tuple[int, int], w: int) -> tuple[int, int]:
    """Interval product at scale 2**w: floor of the low product, ceil of the high product."""
    return (a[0] * b[0]) >> w, _ceil_shift(a[1] * b[1], w)


def _exp_pos_small(f: Fraction, w: int) -> tuple[int, int]:
    """Bounds on 2**w * exp(f) for rational 0 <= f <= 1 by the Taylor series sum_j f**j / j!.

    Terms are built by ``t_j = t_{j-1} * f / j`` rounded down (low) and up (high). Stop at the first j >= 1
    with ``hi_j <= 1``; since ``f/(i+1) <= 1/2`` for i >= 1 the omitted tail is at most ``t_j <= hi_j``, added
    to hi.
    """
    a, c = f.numerator, f.denominator
    lo_t = hi_t = 1 << w
    lo_s = hi_s = 1 << w
    j = 0
    while True:
        j += 1
        lo_t = (lo_t * a) // (c * j)
        hi_t = -((-hi_t * a) // (c * j))
        lo_s += lo_t
        hi_s += hi_t
        if hi_t <= 1:
            return lo_s, hi_s + hi_t


def _recip(v: tuple[int, int], w: int) -> tuple[int, int]:
    """Bounds at scale 2**w of 1/V, given bounds v of V at scale 2**w (requires v[0] > 0)."""
    one2 = 1 << (2 * w)
    return one2 // v[1], -((-one2) // v[0])


def _pow(base: tuple[int, int], n: int, w: int) -> tuple[int, int]:
    """Bounds of base**n at scale 2**w by square-and-multiply in interval arithmetic."""
    result = (1 << w, 1 << w)
    while n:
        if n & 1:
            result = _mul(result, base, w)
        n >>= 1
        if n:
            base = _mul(base, base, w)
    return result


def exp_neg_bounds(x: Fraction, p: int) -> tuple[int, int]:
    """Integers ``(lo, hi)`` with ``lo <= 2**p * exp(-x) <= hi`` for any rational ``x`` and ``p >= 0``.

    ``x = n + f`` with integer ``n`` and ``0 <= f < 1``; ``exp(-x) = exp(-f) * exp(-1)**n`` (``n`` may be
    negative), each factor bracketed by :func:`_exp_pos_small` and interval reciprocals/powers at a working
    precision with enough guard bits that the bracket is a few units wide whenever ``2**p exp(-x) >= 1``.
    """
    if x == 0:
        return 1 << p, 1 << p
    n = x.numerator // x.denominator
    f = x - n
    big = abs(n)
    # guard bits: rounding in ~2 log2(|n|) products and the reciprocal; extra bits when exp(-x) > 1
    w = p + 2 * big.bit_length() + 40 + (int(-x * 3 // 2) + 2 if x < 0 else 0)
    e_f = _exp_pos_small(f, w)  # exp(f)
    val = _recip(e_f, w)  # exp(-f)
    if big:
        e1 = _exp_pos_small(Fraction(1), w)  # exp(1)
        step = _recip(e1, w) if n > 0 else e1  # exp(-sign(n))
        val = _mul(val, _pow(step, big, w), w)
    s = w - p
    return val[0] >> s, _ceil_shift(val[1], s)


def floor_exp_neg(x: Fraction, p: int = WORD_BITS) -> int:
    """Exactly ``floor(2**p * exp(-x))`` (refining the bracket until its two ends have the same floor)."""
    extra = 32
    while True:
        lo, hi = exp_neg_bounds(x, p + extra)
        if lo >> extra == hi >> extra:
            return lo >> extra
        if x == 0:  # unreachable: the bracket is exact at 0
            return 1 << p
        extra *= 2


Bounds = Callable[[int], tuple[int, int]]  # p -> (lo, hi) with lo <= 2**p * value <= hi


def floor_of(bounds: Bounds, p: int = WORD_BITS) -> int:
    """Exactly ``floor(2**p * v)`` for an irrational (or exactly bracketed) ``v`` given by its ``bounds``."""
    extra = 32
    while True:
        lo, hi = bounds(p + extra)
        if lo >> extra == hi >> extra:
            return lo >> extra
        extra *= 2


def folded_survival_bounds(b: Fraction, m: int, p: int) -> tuple[int, int]:
    """Bounds on ``2**p * S(m)``, ``S(m) = 2 a**m / (1 + a)`` with ``a = exp(-1/b)``, m >= 1.

    ``S(m) = P(|X| >= m)`` for the two-sided geometric X. With ``e, A`` bracketing ``2**q exp(-m/b)`` and
    ``2**q a``: ``2**q S(m) = 2 (2**q e^{-m/b}) 2**q / (2**q + 2**q a)``, bracketed by putting the low end of
    the numerator over the high end of the denominator and vice versa (all terms positive); 4 guard bits.
    """
    q = p + 4
    e_lo, e_hi = exp_neg_bounds(Fraction(m) / b, q)
    a_lo, a_hi = exp_neg_bounds(1 / b, q)
    one = 1 << q
    lo = ((2 * e_lo) << q) // (one + a_hi)
    hi = -((-((2 * e_hi) << q)) // (one + a_lo))
    return lo >> 4, _ceil_shift(hi, 4)


def folded_survival(b: Fraction, m: int) -> Bounds:
    """:func:`folded_survival_bounds` for fixed ``(b, m)`` as a bounds function of the precision."""

    def bounds(p: int) -> tuple[int, int]:
        return folded_survival_bounds(b, m, p)

    return bounds


def exp_neg(x: Fraction) -> Bounds:
    """:func:`exp_neg_bounds` for fixed ``x`` as a bounds function of the precision."""

    def bounds(p: int) -> tuple[int, int]:
        return exp_neg_bounds(x, p)

    return bounds


def threshold(x: Fraction) -> int:
    """The 32-bit decision threshold ``T(x) = min(floor(2**32 exp(-x)), 2**32 - 1)`` (see module
    docstring)."""
    return min(floor_exp_neg(x), MAX_WORD)


def exp_neg_table(
    x0: Fraction, d0: Fraction, dd: Fraction, stop_after: int, limit: int, count: int | None = None
) -> npt.NDArray[np.uint32]:
    """Thresholds ``T(x_k)`` for ``x_k = x0 + k*d0 + dd*k*(k-1)/2``, k = 0, 1, ...

    The table ends at the first ``k >= stop_after`` whose threshold is 0 (that entry included); callers choose
    ``stop_after`` so that ``x_k`` is increasing from there on, hence every later threshold is 0 as well.
    ``exp(-x_{k+1}) = exp(-x_k) * c_k`` with ``c_k = exp(-(d0 + k*dd))`` and ``c_{k+1} = c_k * exp(-dd)``, run
    in interval arithmetic at 2**-192 resolution; an entry whose bracket straddles an integer boundary
    (vanishingly rare) is recomputed exactly by :func:`floor_exp_neg`. With ``count``, the table also ends
    after ``count`` entries. Raises ValueError if more than ``limit`` entries are needed.
    """
    w = 192
    shift = w - WORD_BITS
    v = exp_neg_bounds(x0, w)
    c = exp_neg_bounds(d0, w)
    r = exp_neg_bounds(dd, w)
    out: list[int] = []
    k = 0
    while True:
        lo, hi = v[0] >> shift, v[1] >> shift
        t = lo if lo == hi else floor_exp_neg(x0 + k * d0 + dd * Fraction(k * (k - 1), 2))
        out.append(min(t, MAX_WORD))
        if (t == 0 and k >= stop_after) or len(out) == count:
            break
        k += 1
        if k >= limit:
            raise ValueError(f"threshold table would exceed {limit} entries")
        v = _mul(v, c, w)
        c = _mul(c, r, w)
    return np.array(out, dtype=np.uint32)


def folded_survival_table(b: Fraction, limit: int) -> npt.NDArray[np.uint32]:
    """Thresholds ``T[0] = 2**32 - 1`` and ``T[m] = min(floor(2**32 S(m)), 2**32 - 1)`` for m >= 1 up to and
    including the first zero, where ``S(m) = 2 a**m / (1 + a)`` (see :func:`folded_survival_bounds`).

    Same interval recurrence as :func:`exp_neg_table` (``exp(-m/b)`` times the bracketed constant
    ``2/(1+a)``), with exact per-entry recomputation when a bracket straddles an integer.
    """
    w = 192
    shift = w - WORD_BITS
    one = 1 << w
    a = exp_neg_bounds(1 / b, w)
    c = ((2 * one) << w) // (one + a[1]), -((-((2 * one) << w)) // (one + a[0]))  # 2/(1+a) at scale 2**w
    v = _mul(a, c, w)  # S(1)
    out: list[int] = [MAX_WORD]
    m = 1
    while True:
        lo, hi = v[0] >> shift, v[1] >> shift
        t = lo if lo == hi else floor_of(folded_survival(b, m))
        out.append(min(t, MAX_WORD))
        if t == 0:
            break
        m += 1
        if m >= limit:
            raise ValueError(f"threshold table would exceed {limit} entries")
        v = _mul(v, a, w)
    return np.array(out, dtype=np.uint32)


# ------------------------------------------------------------------------------------------------------------
# Lazy uniform real
# ------------------------------------------------------------------------------------------------------------
class LazyUniform:
    """A uniform real ``U`` in [0, 1), known so far as ``w/2**k <= U < (w+1)/2**k``; more bits on demand.

    ``less_than_exp_neg(x)`` decides ``U < exp(-x)`` exactly: with ``(lo, hi)`` bracketing ``2**k exp(-x)``,
    ``w+1 <= lo`` proves ``U < exp(-x)``, ``w >= hi`` proves the opposite; otherwise 64 fresh uniform bits are
    appended (``U`` stays uniform given its prefix) and the bracket is refined. For ``x != 0`` the target is
    irrational, so the loop ends with probability 1 (each round undecided with probability about 2**-60).
    """

    __slots__ = ("g", "k", "w")

    def __init__(self, g: Generator, w: int = 0, k: int = 0) -> None:
        self.g = g
        self.w = w
        self.k = k

    def less_than_exp_neg(self, x: Fraction) -> bool:
        return self.less_than(exp_neg(x))

    def less_than(self, bounds: Bounds) -> bool:
        """Exact ``U < v`` for the irrational ``v`` bracketed by ``bounds`` (same rule as above)."""
        while True:
            lo, hi = bounds(self.k)
            if self.w + 1 <= lo:
                return True
            if self.w >= hi:
                return False
            self.w = (self.w << EXTEND_BITS) | self.g.word()
            self.k += EXTEND_BITS


def decide(u: int, x: Fraction, g: Generator) -> bool:
    """Exact ``U < exp(-x)`` for the uniform real whose first 32 bits are ``u`` (scalar form of the table
    rule)."""
    t = threshold(x)
    if u < t:
        return True
    if u > t:
        return False
    return LazyUniform(g, u, WORD_BITS).less_than_exp_neg(x)


@lru_cache(maxsize=64)
def cached_threshold(x: Fraction) -> int:
    """Memoised :func:`threshold` for repeatedly used arguments."""
    return threshold(x)
