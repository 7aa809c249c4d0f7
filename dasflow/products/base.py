"""The Product interface every dasflow product implements (DESIGN.md §3).

A product is five plain functions over plain data:

``plan(config, public) -> list[MeasurementSpec]``
    Data-independent: every measurement key with its mechanism, sensitivity, budget and noise scale. The plan
    is what the privacy ledger checks against the release's cap before any noise is drawn, so nothing that
    depends on confidential data may enter it.
``prepare(inputs, public) -> Prepared``
    Stability-accounted transformations of the confidential inputs (filters, joins, flat maps) into
    per-measurement tabulations; the stability of each transformation is already in the plan's sensitivity.
``measure(prepared, spec, rng) -> NoisyMeasurement``
    Draws noise for exactly one planned key (exact integer samplers only).
``postprocess(measurements, public) -> Estimates``
    Pure post-processing: it takes noisy measurements and public inputs only.
``tables(estimates) -> dict[str, DataFrame]``
    Release files in the formats the Census published.

Privacy argument: the release is a post-processing of the measurements; each measurement is a mechanism with
the planned budget applied to a transformation whose stability the plan accounts for, so the sequential
composition of the plan's entries bounds the release's privacy loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

import pandas as pd

from dasflow.privacy.measurement import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    MeasurementSpec,
    Mechanism,
    NoisyMeasurement,
    PrivacyDefinition,
)

__all__ = [
    "MECHANISM_COLUMN",
    "NOISY_COLUMN",
    "VARIANCE_COLUMN",
    "C_contra",
    "Estimates",
    "MeasurementSpec",
    "Mechanism",
    "NoisyMeasurement",
    "Prepared",
    "PrivacyDefinition",
    "Product",
]

Prepared = dict[str, pd.DataFrame]
Estimates = dict[str, pd.DataFrame]


#: a product's config type (contravariant: a product accepting a general config accepts a specific one)
C_contra = TypeVar("C_contra", contravariant=True)


@runtime_checkable
class Product(Protocol[C_contra]):
    """What the DAG needs from a product (see the module docstring); generic over its config type."""

    name: str

    def plan(self, config: C_contra, public: Mapping[str, Any]) -> list[MeasurementSpec]: ...

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared: ...

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement: ...

    def postprocess(
        self, measurements: Mapping[str, NoisyMeasurement], public: Mapping[str, Any]
    ) -> Estimates: ...

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]: ...


@runtime_checkable
class SegmentedMeasure(Protocol):
    """Optional: a product whose keys may be drawn in disjoint public segments of their measured units (TopDown:
    one state, or a run of small states, at a time below the state level), so the measure stage holds one
    segment's counts at a time.

    ``segments(spec)`` lists a key's segment ids from public inputs only (None: drawn whole by ``measure``);
    ``segment_parts(spec, segment)`` names the preprocessing partitions holding a segment's counts (None: every
    partition, the product reading only its segment's rows — ``PartitionedPrepared.rows``).
    ``measure_segment`` draws one segment from ``prepared`` (those partitions' frames, or all frames of an
    unpartitioned preprocess). An adaptive product may also define ``measure_segment_adaptive(prepared, spec,
    segment, rng, earlier)``, ``earlier(key, segment)`` giving the committed segment of a key measured before
    this one (the same segment ids). Privacy: the segments partition the key's measured units and each unit's
    noise is the key's planned mechanism, so the key's spec, budget and sensitivity are those of one ``measure``
    call (the ledger commits them as one key)."""

    def segments(self, spec: MeasurementSpec) -> list[str] | None: ...

    def segment_parts(self, spec: MeasurementSpec, segment: str) -> list[str] | None: ...

    def measure_segment(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, segment: str,
                        rng: Any) -> NoisyMeasurement: ...


@runtime_checkable
class StreamedPostprocess(Protocol):
    """Optional: a product whose post-processing in the DAG writes its large estimates as streams
    (``postprocess_stream``: ``postprocess``'s estimates, some as ``TableStream`` s written one chunk at a time
    and some as callables computed when reached, in the mapping's order), so the post-processing stage does not
    hold a national table; its release tables then come from ``table_chunks`` over the stored estimates.
    Privacy: the same pure post-processing of committed measurements as ``postprocess``."""

    def postprocess_stream(self, measurements: Mapping[str, NoisyMeasurement],
                           public: Mapping[str, Any]) -> Mapping[str, Any]: ...

