"""The topdown adapter with the validation gate (see :mod:`validation.wrap`); registered under "topdown"."""

from __future__ import annotations

from dasflow.pipeline.adapters import register
from dasflow.pipeline.adapters import topdown as _inner
from validation.wrap import ValidatedAdapter

ADAPTER = ValidatedAdapter(_inner.ADAPTER)
register("topdown", __name__)  # importing the inner module re-registered it; the gate takes its place
