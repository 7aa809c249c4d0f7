"""The phsafe adapter with the validation gate (see :mod:`validation.wrap`); registered under "phsafe"."""

from __future__ import annotations

from dasflow.pipeline.adapters import phsafe as _inner
from dasflow.pipeline.adapters import register
from validation.wrap import ValidatedAdapter

ADAPTER = ValidatedAdapter(_inner.ADAPTER)
register("phsafe", __name__)  # importing the inner module re-registered it; the gate takes its place
