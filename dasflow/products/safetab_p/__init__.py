"""SafeTab-P: detailed race/ethnicity population tables (T1 totals, T2 Sex × Age), adaptive two-stage.

Public API: :class:`SafeTabP` (the Product), :func:`load_public`, :func:`load_inputs`, :func:`run_universe`,
:func:`ground_truth_config`, :func:`~dasflow.products.safetab_p.measure.with_stage1`,
:func:`~dasflow.products.safetab_p.config.load_config`. See ``docs/safetab_p.md``.
"""

from dasflow.products.safetab_p.config import SafeTabPConfig, load_config, parse_config
from dasflow.products.safetab_p.measure import with_stage1
from dasflow.products.safetab_p.product import (
    RunResult,
    SafeTabP,
    ground_truth_config,
    load_inputs,
    load_public,
    run_universe,
)

__all__ = ["RunResult", "SafeTabP", "SafeTabPConfig", "ground_truth_config", "load_config", "load_inputs",
           "load_public", "parse_config", "run_universe", "with_stage1"]
