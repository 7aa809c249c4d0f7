"""The ``matrix`` product (Product interface of :mod:`dasflow.products.base`).

A histogram over a Cartesian schema, a workload of marginal tables and a zCDP budget ρ. The strategy is the
set of candidate 0/1 marginals weighted by the optimal shares α of
:func:`dasflow.strategy.topdown_weights.optimize_marginal_weights` (eigen-design.md §7 option (1)): the
strategy is integral, so every measurement is an exact discrete Gaussian.

Privacy argument. Each planned key measures one marginal ``Q_q x`` (add/remove-one neighbours: one person
changes one cell of the histogram and one cell of each marginal, L2 sensitivity 1) with discrete Gaussian noise
of ``σ_q² = 1/(2 α_q ρ)`` (``accounting.gaussian_sigma2``), which is ``α_q ρ``-zCDP (CKS 2020). The shares are
exact Fractions with ``Σ α_q = 1``, so sequential composition gives ρ-zCDP. The shares are chosen from the
workload and schema only (data-independent), so choosing them costs no privacy. Post-processing (weighted
least squares, answers and their expected error) reads only the noisy measurements and the configuration.

Eigen-Design strategies (irrational eigen-queries) are not measured by this product: the discrete Gaussian's
guarantee is for integer-valued queries and no exact continuous sampler exists in the privacy core. They
serve as the optimality benchmark (lower bound and ratios) in the error report and in ``benchmarks/eigen.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd

from dasflow.errors import InputError
from dasflow.privacy import accounting, samplers
from dasflow.products.base import (
    MECHANISM_COLUMN,
    NOISY_COLUMN,
    VARIANCE_COLUMN,
    Estimates,
    MeasurementSpec,
    NoisyMeasurement,
    Prepared,
)
from dasflow.products.matrix.config import MatrixConfig
from dasflow.products.matrix.estimate import marginal_of, table_variance, wls_estimate
from dasflow.strategy.topdown_weights import MarginalWeightPlan, optimize_marginal_weights

__all__ = ["ESTIMATE_COLUMN", "MatrixProduct"]

ESTIMATE_COLUMN = "ESTIMATE"
COUNT_COLUMN = "COUNT"


class MatrixProduct:
    """Optimal-share marginal measurements with least-squares answers (see module docstring)."""

    name = "matrix"

    def __init__(self, config: MatrixConfig) -> None:
        self.config = config
        self._weights: MarginalWeightPlan | None = None

    # -- strategy ---------------------------------------------------------------------------------------
    def weights(self) -> MarginalWeightPlan:
        """The optimal exact shares and their error report (data-independent, computed once)."""
        if self._weights is None:
            cfg = self.config
            try:
                self._weights = optimize_marginal_weights(
                    cfg.schema, {k: list(v) for k, v in cfg.workload.items()},
                    {k: list(v) for k, v in cfg.candidates.items()},
                    workload_weights=cfg.workload_weights or None, denominator=cfg.denominator)
            except InputError as exc:
                raise InputError(str(exc), file=cfg.source, column="candidates") from exc
        return self._weights

    def _key(self, query: str) -> str:
        return f"{self.name}/{self.config.level}/{query}"

    def _axes(self, attrs: tuple[str, ...]) -> list[int]:
        names = list(self.config.schema)
        return [names.index(a) for a in attrs]

    # -- plan -------------------------------------------------------------------------------------------
    def plan(self, config: MatrixConfig | None, public: Mapping[str, Any]) -> list[MeasurementSpec]:
        """One key per candidate marginal with a positive share: budget α_q ρ, σ² = 1/(2 α_q ρ)."""
        cfg = config if isinstance(config, MatrixConfig) else self.config
        if cfg is not self.config:
            self.config, self._weights = cfg, None
        plan = self.weights()
        specs = []
        for query, share in plan.shares.items():
            attrs = cfg.candidates[query]
            budget = cfg.rho * share
            sigma2 = accounting.gaussian_sigma2(budget, 1)
            specs.append(MeasurementSpec(
                product=self.name, key=self._key(query), level=cfg.level, privacy_defn="zcdp",
                mechanism="discrete_gaussian", budget=budget, sensitivity=Fraction(1), noise=sigma2,
                cells=math.prod(cfg.schema[a] for a in attrs), variance=sigma2,
                detail={"query": query, "attributes": list(attrs), "share": str(share),
                        "neighbours": "add_remove",
                        "sensitivity_note": "one person changes one cell of each marginal: Δ₂² = 1",
                        "workload_tse": plan.expected_tse(cfg.rho),
                        "lower_bound_tse": plan.lower_bound / (2 * float(cfg.rho)),
                        "rounding_loss": plan.rounding_loss},
            ))
        return specs

    # -- prepare ----------------------------------------------------------------------------------------
    def histogram(self, records: pd.DataFrame, source: str) -> np.ndarray:
        """Tabulate records (one row per person, one integer-coded column per attribute) into the histogram."""
        cfg = self.config
        codes = []
        for a, d in cfg.schema.items():
            if a not in records.columns:
                raise InputError(f"missing attribute column {a!r}", file=source, column=a)
            col = pd.to_numeric(records[a], errors="coerce").to_numpy(dtype=np.float64)
            bad = ~np.isfinite(col) | (col != np.floor(col)) | (col < 0) | (col >= d)
            if bad.any():
                i = int(np.argmax(bad))
                raise InputError(f"value {records[a].iloc[i]!r} is not a code in 0..{d - 1}", file=source,
                                 row=i + 2, column=a)
            codes.append(col.astype(np.int64))
        shape = tuple(cfg.schema.values())
        if not codes[0].size:
            return np.zeros(shape, dtype=np.int64)
        flat = np.ravel_multi_index(tuple(codes), shape)
        return np.bincount(flat, minlength=math.prod(shape)).reshape(shape).astype(np.int64)

    def _frame(self, attrs: tuple[str, ...], values: np.ndarray, column: str) -> pd.DataFrame:
        shape = [self.config.schema[a] for a in attrs]
        grid = np.indices(shape).reshape(len(shape), -1) if shape else np.zeros((0, 1), dtype=np.int64)
        data: dict[str, Any] = {a: grid[i] for i, a in enumerate(attrs)}
        data[column] = np.asarray(values).reshape(-1)
        return pd.DataFrame(data)

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Validate and tabulate the records; one marginal table per planned key (stability 1 each)."""
        source = str(inputs.get("records_source", "<records>"))
        records = inputs.get("records")
        if not isinstance(records, pd.DataFrame):
            raise InputError("inputs['records'] must be a DataFrame", file=source)
        hist = self.histogram(records, source)
        out: Prepared = {}
        for query in self.weights().shares:
            attrs = self.config.candidates[query]
            out[self._key(query)] = self._frame(attrs, marginal_of(hist, self._axes(attrs)).astype(np.int64),
                                                COUNT_COLUMN)
        return out

    # -- measure ----------------------------------------------------------------------------------------
    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        """Exact discrete Gaussian noise on one planned marginal; the true counts are not kept."""
        if spec.mechanism != "discrete_gaussian":
            raise InputError(f"{spec.key}: the matrix product measures only with the discrete Gaussian")
        table = prepared[spec.key]
        counts = table[COUNT_COLUMN].to_numpy(dtype=np.int64)
        noise = samplers.discrete_gaussian(spec.noise, counts.size, rng.spawn(spec.key))
        out = table.drop(columns=[COUNT_COLUMN]).copy()
        out[NOISY_COLUMN] = counts + noise
        out[VARIANCE_COLUMN] = float(spec.variance)
        out[MECHANISM_COLUMN] = spec.mechanism
        return NoisyMeasurement(spec=spec, table=out, rng_mode=str(rng.mode))

    # -- postprocess ------------------------------------------------------------------------------------
    def postprocess(self, measurements: Mapping[str, NoisyMeasurement], public: Mapping[str, Any]
                    ) -> Estimates:
        """Weighted least squares over all measured marginals; every workload table with its variance."""
        cfg = self.config
        shape = list(cfg.schema.values())
        triples = []
        for m in measurements.values():
            attrs = tuple(m.spec.detail["attributes"])
            axes = self._axes(attrs)
            dims = [cfg.schema[a] for a in attrs]
            arr = np.zeros(dims, dtype=np.float64)
            if attrs:
                idx = np.ravel_multi_index(tuple(m.table[a].to_numpy(dtype=np.int64) for a in attrs), dims)
                arr.reshape(-1)[idx] = m.table[NOISY_COLUMN].to_numpy(dtype=np.float64)
            else:
                arr = np.asarray(float(m.table[NOISY_COLUMN].iloc[0]))
            if m.spec.noise <= 0:
                raise InputError(f"{m.spec.key}: zero-variance measurements are not supported here")
            triples.append((axes, arr, float(m.spec.noise)))
        if not triples:
            raise InputError("no measurements to post-process")
        xhat = wls_estimate(shape, triples)
        sig = [(axes, s2) for axes, _, s2 in triples]
        out: Estimates = {}
        for name, attrs in cfg.workload.items():
            axes = self._axes(attrs)
            var = table_variance(shape, axes, sig)
            if not math.isfinite(var):
                raise InputError(f"workload table {name!r} is not answerable from the measurements")
            frame = self._frame(attrs, marginal_of(xhat, axes), ESTIMATE_COLUMN)
            frame[VARIANCE_COLUMN] = var
            out[name] = frame
        return out

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]:
        """Release files: one CSV-ready table per workload table (attribute codes, ESTIMATE, VARIANCE)."""
        return {f"{self.config.level}_{name}": df.copy() for name, df in estimates.items()}
