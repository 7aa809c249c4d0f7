"""The ``matrix`` product: a histogram, a marginal workload file and a zCDP budget → an optimal exact strategy.

See :mod:`dasflow.products.matrix.product` and ``docs/eigen.md``.
"""

from dasflow.products.matrix.config import MatrixConfig, load_config, parse_config
from dasflow.products.matrix.product import MatrixProduct

__all__ = ["MatrixConfig", "MatrixProduct", "load_config", "parse_config"]
