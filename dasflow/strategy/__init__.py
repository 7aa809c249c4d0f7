"""Matrix mechanism strategies: Eigen-Design (Li & Miklau), error analysis and query-weight optimisation.

Entry points: :func:`topdown_query_weights` (exact zCDP shares for TopDown's marginal queries) and
:func:`optimize_marginal_weights` (the same with its error report); :func:`eigen_design` (Program 2) with
:mod:`dasflow.strategy.error` (Eq. 1, svdb) and :mod:`dasflow.strategy.workloads`. See ``docs/eigen.md``.
Everything here is data-independent: nothing reads a histogram.
"""

from dasflow.strategy.eigen import EigenStrategy, eigen_design
from dasflow.strategy.program1 import WeightingResult, solve_weighting
from dasflow.strategy.topdown_weights import (
    MarginalWeightPlan,
    optimize_marginal_weights,
    topdown_query_weights,
)

__all__ = [
    "EigenStrategy",
    "MarginalWeightPlan",
    "WeightingResult",
    "eigen_design",
    "optimize_marginal_weights",
    "solve_weighting",
    "topdown_query_weights",
]
