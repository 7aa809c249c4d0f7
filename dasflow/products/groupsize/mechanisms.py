"""Group-size mechanisms of Fioretto, Van Hentenryck & Zhu (AIJ 2021) over per-level count arrays.

Every mechanism = one noisy *query* per level (ε/L or ρ/L each; parallel composition over the disjoint regions
of a level, sequential over the L levels) + a post-processor that sees only the noisy arrays and public facts
(the tree, n, k, the noise variances that size the windows):

=========  =============  ===============================  ==========================================
mechanism  query          L1 sens. (pure) / Δ² (zCDP)      post-processing
=========  =============  ===============================  ==========================================
M_DP       counts c^r     2 / 2        (Lemma 4)           exact tree DP (Algorithm 1)
M_H-R      counts c^r     2 / 2                            relaxed QP (Clarabel IPM) + rounding; has #CV
TopDown    counts c^r     2 / 2                            two-level L2 + largest remainder (Sec. 10)
M_DPC      Λ(c^r)         1 / 1        (Lemma 6)           PAVA per region, round, Λ⁻¹, tree DP
M_HC-R     Λ(c^r)         1 / 1                            relaxed cumulative QP + rounding; has #CV
M_DPC*-R   Λ(c^r)         1 / 1                            chain-cumulative targets derived from the noisy
                                                           per-region Λ, then the exact chain DP (Model 3)
M_DPC*     chain vector   |R_l| / |R_l| (spec 2.7)         exact chain DP (Model 3)
=========  =============  ===============================  ==========================================

Neighbouring datasets (the fixed-group-set relation the sensitivities need, spec 1.3): one person joins or
leaves an existing group that stays occupied; sizes are top-coded at k ("k or more"), so a group of size j
moves to j ± 1 inside G = {1..k} or stays in the top bucket. n (occupied units) is public and invariant. Under
this relation c^r changes by at most (-1, +1) in one region (L1 2, L2² 2), Λ(c^r) in one entry by 1 (L1 1, L2²
1), and the j-major chain vector of a level in |R_l| consecutive entries by 1 (L1 |R_l|, L2² |R_l|).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import numpy.typing as npt

from dasflow.postprocess.chain_dp import (
    build_chain,
    chain_cumulative,
    chain_sensitivity,
    chain_targets,
    decode_chain,
    solve_chain_isotonic,
)
from dasflow.postprocess.isotonic import cumulative, cumulative_inverse, isotonic_nonneg
from dasflow.postprocess.relaxed_qp import QPResult, QPSolver, relaxed_counts_qp, relaxed_cumulative_qp, round_half_up
from dasflow.postprocess.tree_dp import LevelCost, TreeShape, solve_tree, window_radius
from dasflow.postprocess.twolevel_topdown import twolevel_topdown

IntArray = npt.NDArray[np.int64]
Query = Literal["counts", "cumulative", "chain"]
Norm = Literal["l1", "l2sq"]

MECHANISM_QUERY: dict[str, Query] = {
    "M_DP": "counts",
    "M_H-R": "counts",
    "TopDown": "counts",
    "M_DPC": "cumulative",
    "M_HC-R": "cumulative",
    "M_DPC*-R": "cumulative",
    "M_DPC*": "chain",
}
EXACT_MECHANISMS = ("M_DP", "M_DPC", "M_DPC*", "M_DPC*-R", "TopDown")

__all__ = [
    "EXACT_MECHANISMS",
    "MECHANISM_QUERY",
    "PostResult",
    "postprocess",
    "query_sensitivity",
    "true_query",
]


def query_sensitivity(query: Query, n_regions: int, norm: Norm) -> int:
    """L1 sensitivity (``norm="l1"``) or squared L2 sensitivity (``"l2sq"``) of one level's query.

    The two coincide for these queries because every affected entry changes by exactly 1.
    """
    if query == "counts":
        return 2
    if query == "cumulative":
        return 1
    if query == "chain":
        return chain_sensitivity(n_regions)
    raise ValueError(f"unknown query {query!r}")


def true_query(counts: npt.ArrayLike, query: Query) -> IntArray:
    """The exact query answer of one level from its (regions, k) counts (prepare step; confidential)."""
    c = np.asarray(counts, dtype=np.int64)
    if query == "counts":
        return c.copy()
    if query == "cumulative":
        return np.asarray(cumulative(c), dtype=np.int64)
    if query == "chain":
        return chain_cumulative(c)
    raise ValueError(f"unknown query {query!r}")


@dataclass(frozen=True)
class PostResult:
    """Released counts per level (regions, k), post-processing seconds and solver notes."""

    levels: tuple[IntArray, ...]
    seconds: float
    note: str = ""


def _qp_note(res: QPResult) -> str:
    """Solver status plus the KKT certificate (duality gap, primal residual, stationarity) of the relaxed QP."""
    if res.kkt is None:
        return f"qp_status={res.status}"
    k = res.kkt
    return (f"qp_status={res.status} gap={k.gap:.2e} rel_gap={k.relative_gap:.1e} "
            f"primal_res={k.primal_residual:.1e} stationarity={k.stationarity:.1e}")


def _radii(variances: Sequence[float], multiplier: float) -> list[int]:
    return [window_radius(v, multiplier) for v in variances]


def postprocess(
    mechanism: str,
    shape: TreeShape,
    noisy: Sequence[npt.NDArray[np.generic]],
    total: int,
    variances: Sequence[float],
    *,
    window_multiplier: float = 1.0,
    qp_time_limit: float | None = None,
    qp_solver: QPSolver = "clarabel",
) -> PostResult:
    """Post-process one mechanism's noisy level arrays (P4: noisy arrays + public facts only).

    ``noisy[l]`` is (regions, k) for counts/cumulative, the 1-D j-major vector for the chain query;
    ``variances[l]`` is the per-cell noise variance at level l (sizes the DP windows). ``qp_solver`` picks the
    relaxed-QP solver of M_H-R / M_HC-R ("tree" = the structured exact solver, M_H-R only).
    """
    if mechanism not in MECHANISM_QUERY:
        raise ValueError(f"unknown mechanism {mechanism!r}; choose one of {sorted(MECHANISM_QUERY)}")
    if len(noisy) != shape.levels or len(variances) != shape.levels:
        raise ValueError("need one noisy array and one variance per level")
    t0 = time.perf_counter()
    note = ""
    arrays = [np.asarray(a) for a in noisy]
    if mechanism == "M_DP":
        costs = [LevelCost(a, r) for a, r in zip(arrays, _radii(variances, window_multiplier), strict=True)]
        sol = solve_tree(shape, costs, total)
        levels = sol.values
        note = f"widenings={sol.widenings}"
    elif mechanism == "M_DPC":
        bar = [
            np.asarray(cumulative_inverse(round_half_up(isotonic_nonneg(a))), dtype=np.int64) for a in arrays
        ]
        costs = [LevelCost(b, r) for b, r in zip(bar, _radii(variances, window_multiplier), strict=True)]
        sol = solve_tree(shape, costs, total)
        levels = sol.values
        note = f"widenings={sol.widenings}"
    elif mechanism in ("M_DPC*", "M_DPC*-R"):
        k = int(arrays[0].shape[-1]) if mechanism == "M_DPC*-R" else int(arrays[0].size)
        chain = build_chain(shape, k)
        if mechanism == "M_DPC*-R":
            vecs = [chain_cumulative(np.asarray(cumulative_inverse(a), dtype=np.int64)) for a in arrays]
        else:
            vecs = [np.asarray(a, dtype=np.int64).ravel() for a in arrays]
        tg = chain_targets(chain, list(vecs)).astype(np.int64)
        y = solve_chain_isotonic(chain, tg, total)
        levels = tuple(decode_chain(chain, y))
    elif mechanism == "TopDown":
        levels = tuple(twolevel_topdown(shape, list(arrays), total))
    elif mechanism == "M_H-R":
        res = relaxed_counts_qp(shape, list(arrays), total, qp_time_limit, qp_solver)
        levels = res.rounded
        note = _qp_note(res)
    else:  # M_HC-R
        res = relaxed_cumulative_qp(shape, list(arrays), total, qp_time_limit, qp_solver)
        levels = res.rounded
        note = _qp_note(res)
    return PostResult(tuple(np.asarray(x, dtype=np.int64) for x in levels), time.perf_counter() - t0, note)
