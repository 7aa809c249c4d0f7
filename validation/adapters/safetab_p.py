"""The safetab-p adapter with the validation gate (see :mod:`validation.wrap`); registered under "safetab-p"."""

from __future__ import annotations

from dasflow.pipeline.adapters import register
from dasflow.pipeline.adapters import safetab_p as _inner
from validation.wrap import ValidatedAdapter

ADAPTER = ValidatedAdapter(_inner.ADAPTER)
register("safetab-p", __name__)  # importing the inner module re-registered it; the gate takes its place
