"""Chain-based cumulative post-processing M_DPC* (Fioretto et al. Sec. 9.2, Model 3, Lemma 7).

Chain. The post-order traversal of T_G (columns j = 1..k in order, each a copy of the region tree, then the
dummy root n_0) gives the chain n_1..n_N. At each level the nodes appear j-major, region-minor, and the
chain-cumulative value of a level-l node is the running sum of the level-l counts in that order
(``chain_cumulative``).

Model 3: minimise sum_{i<N} (y_i - target_i)^2 s.t. y_N = n, y_{i-1} = y_i when n_i is the parent of n_{i-1}
(it follows its last child; includes n_0), y_{i-1} <= y_i otherwise, y_1 >= 0, y integer. Decoding per level:
hat_c = successive differences of the level's y values (``decode_chain``); the equalities give consistency,
the inequalities non-negativity, y_N = n faithfulness.

Two exact solvers of Model 3:

* ``solve_chain_tables``: the chain DP as the paper describes it -- C_i = (v - target_i)^2 + Phi_i with Phi_i the
  prefix-min of C_{i-1} (inequality) or C_{i-1} itself (equality), over domain windows widened until interior,
  O(d) per table; sequential, used on small instances and as the reference.
* ``solve_chain_isotonic`` (production): merging every equality block turns Model 3 into a weighted integer
  isotonic regression with bounds [0, n] and the n_0 block fixed at n, solved exactly by PAVA + exact rounding
  (``dasflow.postprocess.isotonic.integer_isotonic``). Its optimum equals the chain DP's (tested, O6).

PRIVACY WARNING (spec 2.7, P3): the L1 sensitivity of a level's chain-cumulative vector is |R_l| (one group
moving from size j to j+1 shifts every entry from (j, r) to (j+1, r-1)), not 1. ``chain_sensitivity`` returns
|R_l|.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dasflow.postprocess.isotonic import integer_isotonic
from dasflow.postprocess.tree_dp import TreeShape

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

__all__ = [
    "Chain",
    "build_chain",
    "chain_cumulative",
    "chain_sensitivity",
    "chain_targets",
    "decode_chain",
    "solve_chain_isotonic",
    "solve_chain_tables",
]


@dataclass(frozen=True)
class Chain:
    """The post-order chain of T_G: per position (excluding n_0, the last) its level, node, column and link.

    ``equal[i]`` is True when position i must equal position i - 1 (i is the parent of i - 1); position N-1 is
    n_0, linked by equality to the last (nation, k) position.
    """

    level: IntArray
    node: IntArray
    column: IntArray
    equal: npt.NDArray[np.bool_]
    sizes: tuple[int, ...]
    k: int

    @property
    def length(self) -> int:
        """N = k |R| + 1 (including n_0)."""
        return int(self.level.size) + 1


def _post_order(shape: TreeShape) -> tuple[IntArray, IntArray]:
    """Post-order (level, node) of one region tree, children in index order."""
    nl = shape.levels
    kids: list[list[IntArray]] = []
    for l in range(nl - 1):
        par = np.asarray(shape.parents[l], dtype=np.int64)
        starts = shape.child_starts(l)
        ends = np.r_[starts[1:], par.size]
        kids.append([np.arange(s, e, dtype=np.int64) for s, e in zip(starts, ends, strict=True)])
    lev: list[int] = []
    nod: list[int] = []

    def visit(l: int, r: int) -> None:
        if l < nl - 1:
            for c in kids[l][r]:
                visit(l + 1, int(c))
        lev.append(l)
        nod.append(r)

    visit(0, 0)
    return np.asarray(lev, dtype=np.int64), np.asarray(nod, dtype=np.int64)


def build_chain(shape: TreeShape, k: int) -> Chain:
    """The chain of T_G for ``k`` columns."""
    lev1, nod1 = _post_order(shape)
    m = lev1.size
    level = np.tile(lev1, k)
    node = np.tile(nod1, k)
    column = np.repeat(np.arange(k, dtype=np.int64), m)
    # in post-order, a step up one level is always a parent following its last child
    eq1 = np.r_[False, lev1[1:] == lev1[:-1] - 1]
    equal = np.tile(eq1, k)
    return Chain(level, node, column, equal, shape.sizes, k)


def chain_cumulative(counts: npt.ArrayLike) -> IntArray:
    """Chain-cumulative vector of one level: cumsum of the (regions, k) counts in j-major order."""
    arr = np.asarray(counts)
    out: IntArray = np.cumsum(arr.T.ravel()).astype(np.int64)
    return out


def chain_sensitivity(n_regions: int) -> int:
    """L1 sensitivity of a level's chain-cumulative vector under j-major chaining: |R_l| (spec 2.7)."""
    if n_regions < 1:
        raise ValueError("a level has at least one region")
    return n_regions


def chain_targets(chain: Chain, level_vectors: list[npt.NDArray[np.generic]]) -> FloatArray:
    """Place each level's (noisy) chain-cumulative vector (j-major order) on the chain positions."""
    out = np.empty(chain.level.size, dtype=np.float64)
    for l, vec in enumerate(level_vectors):
        sel = chain.level == l
        idx = chain.column[sel] * chain.sizes[l] + chain.node[sel]
        out[sel] = np.asarray(vec, dtype=np.float64)[idx]
    return out


def decode_chain(chain: Chain, y: IntArray) -> list[IntArray]:
    """Per-level counts (regions, k) from chain values (without n_0): differences within each level."""
    out: list[IntArray] = []
    for l, size in enumerate(chain.sizes):
        sel = chain.level == l
        vec = np.empty(size * chain.k, dtype=np.int64)
        vec[chain.column[sel] * size + chain.node[sel]] = y[sel]
        counts = np.diff(vec, prepend=np.int64(0))
        out.append(counts.reshape(chain.k, size).T.copy())
    return out


def solve_chain_isotonic(chain: Chain, targets: IntArray, total: int) -> IntArray:
    """Exact Model 3 optimum via equality-block merging + integer isotonic regression (production path).

    ``targets`` must be integers (noisy chain-cumulative values). Returns y for the positions before n_0.
    """
    t = np.asarray(targets)
    if not np.issubdtype(t.dtype, np.integer):
        raise ValueError("solve_chain_isotonic needs integer targets; use solve_chain_tables otherwise")
    t = t.astype(np.int64)
    block = np.cumsum(~chain.equal) - 1  # block id per position
    n_blocks = int(block[-1]) + 1
    sums = np.bincount(block, weights=t.astype(np.float64), minlength=n_blocks)
    sums_exact = np.zeros(n_blocks, dtype=np.int64)
    np.add.at(sums_exact, block, t)
    counts = np.bincount(block, minlength=n_blocks).astype(np.int64)
    del sums
    # the last block contains the (nation, k) chain that is equal to n_0: fixed at n
    free = n_blocks - 1
    y_blocks = np.empty(n_blocks, dtype=np.int64)
    y_blocks[:free] = integer_isotonic(sums_exact[:free], counts[:free], 0, total)
    y_blocks[free] = total
    out: IntArray = y_blocks[block]
    return out


def solve_chain_tables(
    chain: Chain, targets: npt.ArrayLike, total: int, radius: int, max_widenings: int = 40
) -> tuple[IntArray, int]:
    """The paper's chain DP (Lemma 7, Thm 5) over windows [max(0, t - m), t + m], widened until interior.

    Returns (y, widening rounds). Sequential O(N d); for small instances and as the reference solver.
    """
    tg = np.asarray(targets, dtype=np.float64)
    n = tg.size
    rad = np.full(n, int(radius), dtype=np.int64)
    for rounds in range(max_widenings + 1):
        lo = np.maximum(0, np.floor(tg - rad)).astype(np.int64)
        hi = np.minimum(total, np.ceil(tg + rad)).astype(np.int64)
        y, ok = _chain_pass(chain, tg, lo, hi, total)
        if not ok:
            rad *= 2
            continue
        assert y is not None
        touch = ((y == lo) & (lo > 0)) | ((y == hi) & (hi < total))
        if not np.any(touch):
            return y, rounds
        rad[touch] *= 2
    raise RuntimeError("chain DP did not reach an interior optimum")


def _chain_pass(
    chain: Chain, tg: FloatArray, lo: IntArray, hi: IntArray, total: int
) -> tuple[IntArray | None, bool]:
    n = tg.size
    tables: list[FloatArray] = []
    los = lo.copy()
    his = hi.copy()
    prev: FloatArray | None = None
    for i in range(n):
        v = np.arange(los[i], his[i] + 1, dtype=np.int64)
        own = (v - tg[i]) ** 2
        if prev is None:
            cur = own
        else:
            plo, phi = int(los[i - 1]), int(his[i - 1])
            if chain.equal[i]:
                phi_v = np.full(v.size, np.inf)
                inside = (v >= plo) & (v <= phi)
                phi_v[inside] = prev[v[inside] - plo]
            else:
                pm = np.minimum.accumulate(prev)
                phi_v = np.full(v.size, np.inf)
                ok = v >= plo
                phi_v[ok] = pm[np.minimum(v[ok], phi) - plo]
            cur = own + phi_v
        if not np.any(np.isfinite(cur)):
            return None, False
        tables.append(cur)
        prev = cur
    # n_0: equality with the last position, value = total
    assert prev is not None
    if not (los[-1] <= total <= his[-1]) or not np.isfinite(prev[total - los[-1]]):
        return None, False
    y = np.empty(n, dtype=np.int64)
    y[-1] = total
    for i in range(n - 1, 0, -1):
        t_prev = tables[i - 1]
        plo = int(los[i - 1])
        if chain.equal[i]:
            y[i - 1] = y[i]
        else:
            upto = min(int(y[i]), int(his[i - 1])) - plo
            y[i - 1] = plo + int(np.argmin(t_prev[: upto + 1]))
    return y, True
