"""Accuracy experiments: repeated seeded runs and budget sweeps of a release's products on synthetic inputs,
with the error of the *published* tables against the truth (``dasflow experiment``; docs/experiment.md).

No Prefect import here: ``flows/experiment.py`` is the Prefect wrapper.
"""

from dasflow.experiment.metrics import COLUMNS, metrics
from dasflow.experiment.runner import Experiment, method_sha256, run_experiment
from dasflow.experiment.scaling import parse_scales, scale_plan, scale_spec

__all__ = ["COLUMNS", "Experiment", "method_sha256", "metrics", "parse_scales", "run_experiment", "scale_plan",
           "scale_spec"]
