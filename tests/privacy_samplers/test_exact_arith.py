"""The exact arithmetic under the samplers: exp bounds, 32-bit thresholds, tables, lazy uniform reals, tie
paths.

These are the pieces whose exactness the sampler docstrings rely on (ST9, W9: integer-only decisions).
Statistical checks: fixed seeds; for a random seed each assertion fails with probability ALPHA = 1e-6.
"""

from __future__ import annotations

import bisect
import decimal
import hashlib
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dasflow.privacy import _sampling_exact as ex
from dasflow.privacy import rng, samplers
from tests.privacy_samplers.exact_law import ALPHA
from tests.privacy_samplers.scripted import ScriptedGenerator

HP = decimal.Context(prec=400)


def exp_neg_decimal(x: Fraction, p: int) -> Decimal:
    """2**p exp(-x) to 400 digits (independent reference implementation)."""
    return HP.multiply(HP.power(2, p), HP.exp(HP.divide(-Decimal(x.numerator), Decimal(x.denominator))))


XS = [
    Fraction(0),
    Fraction(1, 2),
    Fraction(1),
    Fraction(3),
    Fraction(10**4, 3),
    Fraction(-5, 2),
    Fraction(44, 1),
    Fraction(1, 10**9),
    Fraction(123456789, 1000),
    Fraction(2, 3),
    Fraction(-40),
]


@pytest.mark.parametrize("x", XS)
@pytest.mark.parametrize("p", [0, 64, 200, 1000])
def test_exp_neg_bounds_bracket_and_are_tight(x: Fraction, p: int) -> None:
    lo, hi = ex.exp_neg_bounds(x, p)
    ref = exp_neg_decimal(x, p)
    assert Decimal(lo) <= ref <= Decimal(hi)
    assert hi - lo <= 2


@pytest.mark.parametrize("x", XS)
def test_threshold_is_exact_floor(x: Fraction) -> None:
    ref = exp_neg_decimal(x, 32)
    want = min(int(ref.to_integral_value(rounding=decimal.ROUND_FLOOR)), 2**32 - 1)
    assert ex.threshold(x) == want


def test_table_matches_direct_thresholds() -> None:
    s2 = Fraction(1234, 7)
    t = 14  # floor(sqrt(176.3)) + 1
    mu = s2 / t
    table = ex.exp_neg_table(mu * mu / (2 * s2), (1 - 2 * mu) / (2 * s2), 1 / s2, stop_after=13, limit=10**6)
    assert table[-1] == 0 and table[-2] != 0
    for k in range(len(table)):
        assert int(table[k]) == ex.threshold((k - mu) ** 2 / (2 * s2)), k
    geo = ex.exp_neg_table(Fraction(0), Fraction(3, 2), Fraction(0), stop_after=1, limit=10**6)
    assert [int(v) for v in geo] == [ex.threshold(Fraction(3, 2) * m) for m in range(len(geo))]
    assert (
        ex.exp_neg_table(Fraction(0), Fraction(1, 50), Fraction(0), stop_after=1, limit=10**6, count=7).size
        == 7
    )
    with pytest.raises(ValueError, match="exceed"):
        ex.exp_neg_table(Fraction(0), Fraction(1, 50), Fraction(0), stop_after=1, limit=100)


@pytest.mark.parametrize("x", [Fraction(1, 2), Fraction(3)])
def test_lazy_uniform_from_zero_bits_is_bernoulli_exp(x: Fraction) -> None:
    """Every decision made by the lazy real alone (no table): exact P = exp(-x) by a binomial test."""
    g = rng.seeded(int(x * 10))
    n = 20000
    hits = sum(ex.LazyUniform(g).less_than_exp_neg(x) for _ in range(n))
    p = float(exp_neg_decimal(x, 0))
    assert stats.binomtest(hits, n, p).pvalue > ALPHA


@pytest.mark.parametrize("x", [Fraction(1), Fraction(1, 3)])
def test_tie_resolution_has_the_conditional_probability(x: Fraction) -> None:
    """Force u == T: the answer must be True with probability frac(2**32 exp(-x)), the conditional law of
    U."""
    t = ex.threshold(x)
    frac = float(exp_neg_decimal(x, 32) - t)
    n = 4000
    out = samplers.bernoulli_exp_neg(x, n, ScriptedGenerator([t] * n, seed=3))
    assert stats.binomtest(int(out.sum()), n, frac).pvalue > ALPHA
    # neighbours of the tie are decided by the table alone
    assert samplers.bernoulli_exp_neg(x, 2, ScriptedGenerator([t - 1, t + 1])).tolist() == [True, False]


def test_decide_matches_table_rule() -> None:
    g = rng.seeded(2)
    x = Fraction(7, 5)
    t = ex.threshold(x)
    assert ex.decide(t - 1, x, g) is True
    assert ex.decide(t + 1, x, g) is False
    assert ex.decide(t, x, g) in (True, False)
    assert ex.decide(2**32 - 1, Fraction(0), g) is True  # p = 1: the tie at 2**32-1 resolves to True


def _definition_magnitude(u: int, asc: list[int]) -> int:
    """#{m >= 1 : u < T[m]} — the certain part of max{m : U < exp(-m/b)}; ``asc`` = T[1:] sorted (Python's
    ``bisect``, not the sampler's numpy search)."""
    return len(asc) - bisect.bisect_right(asc, u)


def folded_survival_decimal(b: Fraction, m: int, p: int) -> Decimal:
    a = HP.exp(HP.divide(-Decimal(b.denominator), Decimal(b.numerator)))
    return HP.multiply(HP.power(2, p), HP.divide(HP.multiply(2, HP.power(a, m)), HP.add(1, a)))


@pytest.mark.parametrize("b", [Fraction(1, 3), Fraction(1, 2), Fraction(7, 3), Fraction(50)])
def test_folded_survival_table_and_bounds(b: Fraction) -> None:
    """T[m] = floor(2**32 · 2a^m/(1+a)) exactly for every m; the bounds bracket the 400-digit value tightly."""
    table = ex.folded_survival_table(b, 10**6)
    assert int(table[0]) == 2**32 - 1 and table[-1] == 0 and table[-2] != 0
    step = max(1, len(table) // 120)
    for m in sorted({*range(1, len(table), step), len(table) - 2, len(table) - 1}):
        ref = folded_survival_decimal(b, m, 32)
        assert int(table[m]) == min(int(ref.to_integral_value(rounding=decimal.ROUND_FLOOR)), 2**32 - 1), m
    for m in (1, 2, 17):
        for p in (0, 64, 300):
            lo, hi = ex.folded_survival_bounds(b, m, p)
            assert Decimal(lo) <= folded_survival_decimal(b, m, p) <= Decimal(hi) and hi - lo <= 3


@pytest.mark.parametrize("folded", [False, True])
@pytest.mark.parametrize("b", [Fraction(1, 3), Fraction(2), Fraction(8), Fraction(50), Fraction(305)])
def test_vectorised_inversion_equals_definition(b: Fraction, folded: bool) -> None:
    """Guide-guessed indices are always verified: the result equals the integer definition for every word,
    including words at and next to every threshold (where a tie goes to the lazy real), at both ends of every
    bucket of the guide, and in buckets spanning several thresholds (small words, where the guess is wrong)."""
    tab = samplers._inversion_table(b, folded)
    thr = [int(v) for v in tab.t]
    special = {w for v in thr for w in (v - 1, v, v + 1) if 0 <= w < 2**32} | {0, 2**32 - 1}
    step = 1 << int(tab.shift)
    buckets = {w for p in range(tab.guide.size) for w in (p * step, p * step + step - 1)}
    words = sorted(special | buckets) + [int(w) for w in rng.seeded(4).uint32(3000)] \
        + [int(w) for w in rng.seeded(5).uint32(3000) % np.uint32(8 * step)]
    m = samplers._magnitudes_single(tab, len(words), ScriptedGenerator(words, seed=5))
    asc = sorted(thr[1:])
    for u, got in zip(words, m.tolist(), strict=True):
        want = _definition_magnitude(u, asc)
        tie = want + 1 < len(thr) and u == thr[want + 1]
        assert got == want or (tie and got >= want + 1), (u, got, want)


def test_guide_is_the_smallest_count_of_its_bucket() -> None:
    """Every guide entry is the count ``#{m >= 1 : T[m] > w}`` at its bucket's last word, and no larger than the
    count at any word of the bucket (the count falls as the word grows); a bucket spans few thresholds."""
    for b, folded in [(Fraction(4099, 66 * 8), True), (Fraction(8), True), (Fraction(305), False)]:
        tab = samplers._inversion_table(b, folded)
        thr = np.asarray(tab.t, dtype=np.int64)
        step = 1 << int(tab.shift)
        last = np.arange(1, tab.guide.size + 1, dtype=np.int64) * step - 1
        count = (thr[1:][None, :] > last[:, None]).sum(axis=1) if thr.size < 4000 else None
        if count is not None:
            assert np.array_equal(tab.guide, count)
        first = last - step + 1
        assert np.all(tab.guide <= samplers._counts_above(tab.asc, first.astype(np.uint32)))
        assert np.all(np.diff(tab.guide) <= 0) and tab.guide[-1] == 0
    # at scale 305 the buckets of small words span several thresholds: there the guess is wrong, and the
    # sampler's answer is the exact count all the same
    tab = samplers._inversion_table(Fraction(305), True)
    words = np.arange(0, 1 << 26, 97, dtype=np.uint32)
    guess = tab.guide[words >> tab.shift].astype(np.int64)
    guess += tab.t[guess + 1] > words
    exact = samplers._counts_above(tab.asc, words)
    assert np.count_nonzero(guess != exact) > 1000
    got = samplers._magnitudes_single(tab, words.size, ScriptedGenerator(words.tolist(), seed=1))
    ties = words == tab.t[exact + 1]
    assert np.array_equal(got[~ties], exact[~ties])


@pytest.mark.parametrize("m", [0, 1, 3])
def test_folded_tie_resolution_has_the_conditional_probability(m: int) -> None:
    """Force u == T[m+1] for |X|: P(|X| >= m+1 | tie) must be frac(2**32 S(m+1)) (S the folded survival)."""
    b = Fraction(2)
    tab = samplers._inversion_table(b, True)
    t = int(tab.t[m + 1])
    frac = float(folded_survival_decimal(b, m + 1, 32) - t)
    n = 3000
    got = samplers._magnitudes_single(tab, n, ScriptedGenerator([t] * n, seed=m))
    assert set(np.unique(got).tolist()) <= {m, m + 1}
    assert stats.binomtest(int(np.sum(got == m + 1)), n, frac).pvalue > ALPHA


@settings(max_examples=150, deadline=None, derandomize=True)
@given(
    num=st.integers(min_value=-(10**6), max_value=10**7),
    den=st.integers(min_value=1, max_value=10**6),
    p=st.integers(min_value=0, max_value=300),
)
def test_exp_neg_bounds_property(num: int, den: int, p: int) -> None:
    """For arbitrary rationals x in [-1, 1e7] and precisions: lo <= 2**p exp(-x) <= hi (400-digit reference)."""
    x = Fraction(num, den)
    if x < -50:
        x = x / 10**5  # keep 2**p exp(-x) within the reference's 400 digits
    lo, hi = ex.exp_neg_bounds(x, p)
    ref = exp_neg_decimal(x, p)
    assert Decimal(lo) <= ref <= Decimal(hi)
    assert hi - lo <= 2


def test_seeded_samples_are_pinned() -> None:
    """The seeded samplers' output at scales across every code path (one table, two-level geometric, large σ),
    pinned: a change to how a sampler finds its answers (such as the guide table that replaced a float
    logarithm's guess) must give the same sample for the same random words."""
    h = hashlib.sha256()
    for s2 in [Fraction(92416), Fraction(25), Fraction(1, 7), Fraction(4000, 3), Fraction(10**9, 3)]:
        h.update(samplers.discrete_gaussian(s2, 300_000, rng.seeded(11)).tobytes())
    for b in [Fraction(305), Fraction(1, 3), Fraction(4000), Fraction(5000), Fraction(123456, 7)]:
        h.update(samplers.two_sided_geometric(b, 300_000, rng.seeded(12)).tobytes())
    assert h.hexdigest() == "f351fa191a6a8b03e8a2639f777ac26f1753c57b9bd1ee2c87fc96641d03fa6e"
