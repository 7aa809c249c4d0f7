"""Exact privacy accounting: budgets, composition, (ε, δ) conversions and MOE calibrations.

This is the public face of the privacy accountant; the implementation lives in small helper modules:

``_exact``        exact parsing of budgets (``parse_budget``, ``load_json_exact``), explicit rounding, the
50-digit
                  decimal context used for every transcendental evaluation;
``_composition``  the plan model (``Spend``, ``Sequential``, ``Parallel``) and ``compose`` → ``Total``; noise
                  calibrations ``gaussian_sigma2`` (Δ²/(2ρ)), ``geometric_scale`` (Δ/ε); stability scaling,
                  generalized parallel composition, pure → zCDP, unbounded → bounded neighbours;
``_divergence``   RDP of the geometric mechanism (the paper's τ and the exact discrete divergence), the α
grid,
                  CKS and Bun–Steinke conversions to (ε, δ);
``_moe``          noise variances, MOE formulas and MOE ↔ budget calibrations (SafeTab 95 %, PHSafe 90 %).

Rules (DESIGN §4): budgets and sensitivities are ``fractions.Fraction`` end to end; an infinite budget
(``None``, the JSON ``Infinity`` literal) means no noise and variance 0; (ε, δ) values and MOEs are 50-digit
``Decimal`` results for reporting, each with its method named, and are never turned back into budgets except
through :func:`round_rational` with a stated rule. Every formula's source is in its docstring; the papers'
printed numbers are reproduced in ``tests/privacy_accounting`` and the deviations documented in
``docs/accounting.md``.
"""

from __future__ import annotations

from dasflow.privacy._composition import (
    DEFINITIONS,
    Definition,
    Node,
    Parallel,
    Sequential,
    Spend,
    Total,
    compose,
    gaussian_sigma2,
    gaussian_sigma2_sq,
    geometric_scale,
    parallel_compose,
    puredp_to_zcdp,
    spends,
    stability_scale,
    unbounded_to_bounded,
    validate_shares,
)
from dasflow.privacy._divergence import (
    ALPHA_GRID,
    ALPHA_GRID_FLOAT,
    DELTA,
    Conversion,
    GeometricDivergence,
    cks_epsilon,
    geometric_rdp,
    geometric_rdp_exact,
    geometric_rdp_float,
    geometric_rdp_paper,
    rdp_to_approx_dp,
    zcdp_to_approx_dp,
    zcdp_to_approx_dp_analytic,
    zcdp_to_approx_dp_grid,
)
from dasflow.privacy._exact import (
    HP,
    PRECISION,
    RoundingMode,
    is_infinite_literal,
    load_json_exact,
    parse_budget,
    parse_fraction_open,
    parse_positive,
    parse_rational,
    round_rational,
    to_decimal,
)
from dasflow.privacy._moe import (
    DG_CONSTANT_EXACT,
    DG_CONSTANT_PAPER,
    PHSAFE_Z90,
    SAFETAB_Z95,
    BranchMoe,
    LevelCalibration,
    dgauss_coverage,
    dgauss_moe_exact,
    dgauss_moe_paper,
    dgauss_rho_for_moe,
    discrete_gaussian_variance,
    gaussian_error_factor,
    geometric_coverage,
    geometric_epsilon_exact,
    geometric_epsilon_for_moe,
    geometric_mean_abs,
    geometric_moe_exact,
    geometric_moe_paper,
    geometric_tail,
    geometric_variance,
    laplace_error_factor,
    phsafe_moe,
    phsafe_rho_for_moe,
    safetab_level_calibration,
    safetab_level_moes,
    zcdp_error_factor,
)

__all__ = [
    "ALPHA_GRID",
    "ALPHA_GRID_FLOAT",
    "DEFINITIONS",
    "DELTA",
    "DG_CONSTANT_EXACT",
    "DG_CONSTANT_PAPER",
    "HP",
    "PHSAFE_Z90",
    "PRECISION",
    "SAFETAB_Z95",
    "BranchMoe",
    "Conversion",
    "Definition",
    "GeometricDivergence",
    "LevelCalibration",
    "Node",
    "Parallel",
    "RoundingMode",
    "Sequential",
    "Spend",
    "Total",
    "cks_epsilon",
    "compose",
    "dgauss_coverage",
    "dgauss_moe_exact",
    "dgauss_moe_paper",
    "dgauss_rho_for_moe",
    "discrete_gaussian_variance",
    "gaussian_error_factor",
    "gaussian_sigma2",
    "gaussian_sigma2_sq",
    "geometric_coverage",
    "geometric_epsilon_exact",
    "geometric_epsilon_for_moe",
    "geometric_mean_abs",
    "geometric_moe_exact",
    "geometric_moe_paper",
    "geometric_rdp",
    "geometric_rdp_exact",
    "geometric_rdp_float",
    "geometric_rdp_paper",
    "geometric_scale",
    "geometric_tail",
    "geometric_variance",
    "is_infinite_literal",
    "laplace_error_factor",
    "load_json_exact",
    "parallel_compose",
    "parse_budget",
    "parse_fraction_open",
    "parse_positive",
    "parse_rational",
    "phsafe_moe",
    "phsafe_rho_for_moe",
    "puredp_to_zcdp",
    "rdp_to_approx_dp",
    "round_rational",
    "safetab_level_calibration",
    "safetab_level_moes",
    "spends",
    "stability_scale",
    "to_decimal",
    "unbounded_to_bounded",
    "validate_shares",
    "zcdp_error_factor",
    "zcdp_to_approx_dp",
    "zcdp_to_approx_dp_analytic",
    "zcdp_to_approx_dp_grid",
]
