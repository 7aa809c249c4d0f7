"""PHSafe: the 2020 Census S-DHC household tables PH1–PH8 (spec: phsafe.md, phsafe-production.md).

Public API: :data:`PHSAFE` (the Product, ``name = "phsafe"``), :func:`load_config`, :func:`plan`,
:func:`run_private`, :func:`run_non_private`, :func:`truncate_and_join`, :func:`validate_output`.
See ``docs/phsafe.md``.
"""

from __future__ import annotations

from dasflow.products.phsafe.config import PHSafeConfig, load_config, parse_config
from dasflow.products.phsafe.outputs import validate_output
from dasflow.products.phsafe.planning import plan, rho_for_moe
from dasflow.products.phsafe.product import PHSAFE, PHSafe, run_non_private, run_private
from dasflow.products.phsafe.truncate import truncate_and_join

__all__ = [
    "PHSAFE",
    "PHSafe",
    "PHSafeConfig",
    "load_config",
    "parse_config",
    "plan",
    "rho_for_moe",
    "run_non_private",
    "run_private",
    "truncate_and_join",
    "validate_output",
]
