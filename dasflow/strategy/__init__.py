"""Matrix mechanism strategies: Eigen-Design (Li & Miklau), error analysis and query-weight optimisation.

Public entry points: :func:`dasflow.strategy.topdown_weights.topdown_query_weights` (exact zCDP shares for
TopDown's marginal queries) and :func:`~dasflow.strategy.topdown_weights.optimize_marginal_weights` (with
its error report). See ``docs/eigen.md``.
"""

from dasflow.strategy.topdown_weights import (
    MarginalWeightPlan,
    optimize_marginal_weights,
    topdown_query_weights,
)

__all__ = ["MarginalWeightPlan", "optimize_marginal_weights", "topdown_query_weights"]
