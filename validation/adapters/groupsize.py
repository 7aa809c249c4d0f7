"""The groupsize adapter with the validation gate (see :mod:`validation.wrap`); registered under "groupsize"."""

from __future__ import annotations

from dasflow.pipeline.adapters import groupsize as _inner
from dasflow.pipeline.adapters import register
from validation.wrap import ValidatedAdapter

ADAPTER = ValidatedAdapter(_inner.ADAPTER)
register("groupsize", __name__)  # importing the inner module re-registered it; the gate takes its place
