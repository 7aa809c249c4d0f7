"""SafeTab-P as a dasflow Product (DESIGN §3), plus helpers that run one universe end to end.

``public`` (a plain mapping) holds ``config`` (:class:`SafeTabPConfig`), ``iterations``
(:class:`IterationIndex`),
``geography`` (:class:`Geography`, from the public GRF-C) and ``universe`` ("US" | "PR");
:func:`load_public` builds
it. ``inputs`` holds ``persons`` (the person-records table, all columns strings) and ``source`` (its file
name).

Adaptive stage: ``measure(prepared, spec_stage2, rng)`` reads the committed stage-1 NoisyMeasurement's
table from
``prepared[<stage-1 key>]`` — add it with :func:`~dasflow.products.safetab_p.measure.with_stage1` after
committing
stage 1. The stage-2 budget is fixed in the plan; only its query shape depends on the stage-1 noisy totals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from dasflow.errors import InputError
from dasflow.products.base import Estimates, MeasurementSpec, NoisyMeasurement, Prepared
from dasflow.products.safetab_p import outputs
from dasflow.products.safetab_p.config import SafeTabPConfig, load_config, parse_config
from dasflow.products.safetab_p.iterations import (
    ITERATION_FILES,
    IterationIndex,
    load_iterations,
    packaged_iterations,
)
from dasflow.products.safetab_p.measure import (
    iterations_key,
    measure_stage1,
    measure_stage2,
    regions_key,
    sparse_key,
    with_stage1,
)
from dasflow.products.safetab_p.plan import plan as make_plan
from dasflow.products.safetab_p.records import (
    GRFC_COLUMNS,
    GRFC_FILE,
    PERSON_COLUMNS,
    PERSON_FILE,
    Geography,
    encode_persons,
    load_geography,
    read_pipe_file,
)
from dasflow.products.safetab_p.regions import Universe
from dasflow.products.safetab_p.tabulate import PersonCounts, tabulate_level


def find_iteration_dir(parameters_dir: str | Path, data_dir: str | Path) -> Path | None:
    """Where the four iteration files are: PARAMETERS_DIR, else DATA_DIR, else None (= the packaged 2020
    files)."""
    for d in (Path(parameters_dir), Path(data_dir)):
        present = [(d / f).is_file() for f in ITERATION_FILES]
        if all(present):
            return d
        if any(present):
            missing = [f for f, p in zip(ITERATION_FILES, present, strict=True) if not p]
            raise InputError(f"incomplete iteration files: missing {', '.join(missing)}", file=str(d))
    return None


def load_public(parameters_dir: str | Path, data_dir: str | Path, universe: Universe,
                config: SafeTabPConfig | None = None) -> dict[str, Any]:
    """Public inputs of one run: config, iteration index, GRF-C geography (no private data)."""
    cfg = config if config is not None else load_config(parameters_dir)
    it_dir = find_iteration_dir(parameters_dir, data_dir)
    index = load_iterations(it_dir) if it_dir is not None else packaged_iterations()
    grfc_path = Path(data_dir) / GRFC_FILE
    grfc = read_pipe_file(grfc_path, GRFC_COLUMNS, extra_columns=True)
    geo = load_geography(grfc, universe, cfg.state_filter_us, str(grfc_path))
    return {"config": cfg, "iterations": index, "geography": geo, "universe": universe}


def load_inputs(data_dir: str | Path) -> dict[str, Any]:
    """The private person records (read only; validated by ``prepare``)."""
    path = Path(data_dir) / PERSON_FILE
    return {"persons": read_pipe_file(path, PERSON_COLUMNS), "source": str(path)}


def _config(config: Any) -> SafeTabPConfig:
    if isinstance(config, SafeTabPConfig):
        return config
    if isinstance(config, Mapping):
        return parse_config(config)
    raise TypeError(f"not a SafeTab-P config: {type(config).__name__}")


def ground_truth_config(cfg: SafeTabPConfig) -> SafeTabPConfig:
    """The ground-truth twin: every tabulated level's budget set to infinity (no noise, same adaptivity
    rules)."""
    budgets = {k: (v if v == 0 else None) for k, v in cfg.budgets.items()}
    return dataclasses.replace(cfg, budgets=budgets)


class SafeTabP:
    """The SafeTab-P product (``name = "safetab-p"``); see the module docstring for ``public``/``inputs``."""

    name = "safetab-p"

    def plan(self, config: Any, public: Mapping[str, Any]) -> list[MeasurementSpec]:
        """Every (region type, level, stage) key with its exact budget (see :mod:`.plan`)."""
        return make_plan(_config(config), public["iterations"], public["geography"])

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Validate all person rows, then flat-map and count per tabulated (region type, level).

        Also carries the public domains (region IDs, iteration lists) so that ``measure`` is self-contained.
        """
        cfg: SafeTabPConfig = public["config"]
        geo: Geography = public["geography"]
        index: IterationIndex = public["iterations"]
        table: pa.Table = inputs["persons"]
        persons = encode_persons(table, geo, index, cfg.max_race_codes, cfg.state_filter_us,
                                 str(inputs.get("source", PERSON_FILE)))
        universe = geo.universe
        prepared: Prepared = {}
        tab = cfg.tabulated(universe)
        for lv in sorted({lv for _, lv in tab}):
            level = index.levels[lv]
            prepared[iterations_key(lv)] = pd.DataFrame(
                {"ITERATION_CODE": level.iteration_codes.astype(object), "TOTAL_ONLY": level.total_only})
        for rt in dict.fromkeys(rt for rt, _ in tab):
            prepared[regions_key(universe, rt)] = pd.DataFrame({"REGION_ID": geo.region_ids[rt]})
            counts = PersonCounts(persons, rt)
            for lv in (lv for r, lv in tab if r == rt):
                prepared[sparse_key(universe, rt, lv)] = tabulate_level(counts, index.levels[lv])
        return prepared

    def measure(self, prepared: Prepared, spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
        """Noise for one key; the generator is ``rng.spawn(spec.key)`` (deterministic per key in test
        mode)."""
        child = rng.spawn(spec.key) if hasattr(rng, "spawn") else rng
        if spec.detail["stage"] == 1:
            return measure_stage1(prepared, spec, child)
        return measure_stage2(prepared, spec, child)

    def postprocess(self, measurements: Mapping[str, NoisyMeasurement],
                    public: Mapping[str, Any]) -> Estimates:
        """T1/T2 from the stage-2 measurements (pure post-processing)."""
        return outputs.postprocess(measurements, public["config"])

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]:
        """The t1/t2 release files."""
        return outputs.tables(estimates)


@dataclasses.dataclass
class RunResult:
    """Everything one in-process run produced."""

    specs: list[MeasurementSpec]
    measurements: dict[str, NoisyMeasurement]
    tables: dict[str, pd.DataFrame]
    budget: Fraction | None


def run_universe(public: Mapping[str, Any], inputs: Mapping[str, Any], rng: Any) -> RunResult:
    """plan → prepare (validates) → stage 1 → stage 2 per level → postprocess → tables, for one universe."""
    product = SafeTabP()
    specs = product.plan(public["config"], public)
    prepared = product.prepare(inputs, public)
    measurements: dict[str, NoisyMeasurement] = {}
    for spec in specs:
        if spec.detail["stage"] == 1:
            measurements[spec.key] = product.measure(prepared, spec, rng)
            prepared = with_stage1(prepared, measurements[spec.key])
    for spec in specs:
        if spec.detail["stage"] == 2:
            measurements[spec.key] = product.measure(prepared, spec, rng)
    est = product.postprocess(measurements, public)
    total: Fraction | None = Fraction(0)
    for s in specs:
        total = None if total is None or s.budget is None else total + s.budget
    return RunResult(specs, measurements, product.tables(est), total)
