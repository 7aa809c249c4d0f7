"""SafeTab-P as a dasflow Product (DESIGN §3), plus helpers that run one universe end to end.

``public`` (a plain mapping) holds ``config`` (:class:`SafeTabPConfig`), ``iterations`` (:class:`IterationIndex`),
``geography`` (:class:`Geography`, from the public GRF-C) and ``universe`` ("US" | "PR"); :func:`load_public` builds
it. ``inputs`` holds either ``persons`` (the person-records table, all columns strings) or ``person_files``
(paths of a person-records input split into several files, e.g. one per state: the partitioned path), and
``source`` (the file or folder name).

Partitioned path (``person_files``): ``prepare`` reads one file at a time, validates and encodes it, counts its
persons into sparse per-(region, race combination | QSPAN code, sex × age bin) counts per region type, and
discards the persons; the counts of all files are then summed (:meth:`PersonCounts.merge`) and flat-mapped and
tabulated exactly as in the in-memory path. Peak memory: one file's table, one slice (``SLICE_ROWS``) of
encoded persons, and the counts. USA (and any
region spanning several files) is summed BEFORE noise: each population group still gets exactly one noisy
count, never a sum of per-file noisy counts, so the privacy analysis is unchanged. Every file is validated
before ``prepare`` returns, i.e. before any noise.

Per-state preparation (the DAG's preprocessing partitions, ``SafeTabPPlugin.partitions``): ``prepare`` on each
file alone gives each (region type, level) tabulation of that file's persons; the tabulations of the files add up
row by row (:func:`~dasflow.products.safetab_p.tabulate.sum_cells`) to the tabulation of all persons, because a
tabulation is a count per (population group, cell) and the files hold disjoint persons.

Adaptive stage: ``measure(prepared, spec_stage2, rng)`` reads the committed stage-1 NoisyMeasurement's table from
``prepared[<stage-1 key>]`` — add it with :func:`~dasflow.products.safetab_p.measure.with_stage1` after committing
stage 1. The stage-2 budget is fixed in the plan; only its query shape depends on the stage-1 noisy totals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from dasflow.errors import InputError
from dasflow.products.base import Estimates, MeasurementSpec, NoisyMeasurement, Prepared
from dasflow.products.partition import CombinedEstimates
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
from dasflow.products.safetab_p.plan import level_of
from dasflow.products.safetab_p.plan import plan as make_plan
from dasflow.products.safetab_p.records import (
    GRFC_COLUMNS,
    GRFC_FILE,
    PERSON_COLUMNS,
    PERSON_FILE,
    Geography,
    LazyGeography,
    encode_persons,
    load_geography,
    pipe_chunks,
    read_pipe_file,
    slice_states,
)
from dasflow.products.safetab_p.regions import Universe, iteration_set
from dasflow.products.safetab_p.tabulate import PersonCounts, tabulate_cells

PERSON_DIR = "person-records"  # DATA_DIR/person-records/*.txt: a split (e.g. per-state) person-records input
#: rows encoded at a time: bounds the working set (and keeps numpy temporaries out of fresh, page-faulting mmaps)
SLICE_ROWS = 1 << 20


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
                config: SafeTabPConfig | None = None, *, lazy: bool = False) -> dict[str, Any]:
    """Public inputs of one run: config, iteration index, GRF-C geography (no private data). ``lazy``: a
    :class:`LazyGeography` (the region IDs from one streamed pass; the block rows read only when used, or one
    partition's states at a time)."""
    cfg = config if config is not None else load_config(parameters_dir)
    it_dir = find_iteration_dir(parameters_dir, data_dir)
    index = load_iterations(it_dir) if it_dir is not None else packaged_iterations()
    grfc_path = Path(data_dir) / GRFC_FILE
    geo: Geography
    if lazy:
        geo = LazyGeography(grfc_path, universe, cfg.state_filter_us)
    else:
        grfc = read_pipe_file(grfc_path, GRFC_COLUMNS, extra_columns=True)
        geo = load_geography(grfc, universe, cfg.state_filter_us, str(grfc_path))
    return {"config": cfg, "iterations": index, "geography": geo, "universe": universe}


def person_files(folder: str | Path) -> list[Path]:
    """The files of a split person-records input: every ``*.txt`` in ``folder``, in name order."""
    d = Path(folder)
    files = sorted(p for p in d.glob("*.txt") if p.is_file())
    if not files:
        raise InputError(f"no person-records files (*.txt) in {PERSON_DIR}/", file=str(d))
    return files


def load_inputs(data_dir: str | Path) -> dict[str, Any]:
    """The private person records (validated by ``prepare``): ``DATA_DIR/person-records.txt`` is read into
    memory; a split input ``DATA_DIR/person-records/*.txt`` (each file with the header, e.g. one per state) is
    only listed — ``prepare`` streams it file by file."""
    path = Path(data_dir) / PERSON_FILE
    folder = Path(data_dir) / PERSON_DIR
    if folder.is_dir():
        if path.exists():
            raise InputError(f"both {PERSON_FILE} and {PERSON_DIR}/ are present: give one person-records input",
                             file=str(path))
        return {"person_files": [str(f) for f in person_files(folder)], "source": str(folder)}
    return {"persons": read_pipe_file(path, PERSON_COLUMNS), "source": str(path)}


def _person_slices(inputs: Mapping[str, Any]) -> Iterator[tuple[pa.Table, str, int]]:
    """(slice, source, file rows before it) of each person-records input, in slices of ``SLICE_ROWS`` rows:
    the in-memory table sliced, or each file of a split input streamed (:func:`.records.pipe_chunks`: one slice of
    one file in memory at a time, not the file)."""
    if "person_files" in inputs:
        for f in inputs["person_files"]:  # over files (partitions), not records
            for chunk in pipe_chunks(f, str(f), SLICE_ROWS):  # over slices of 1 M rows, not records
                yield pa.table(chunk.columns), str(f), chunk.offset
        return
    table = inputs["persons"]
    for start in range(0, max(table.num_rows, 1), SLICE_ROWS):  # over slices of ~1 M rows, not records
        yield table.slice(start, SLICE_ROWS), str(inputs.get("source", PERSON_FILE)), start


def slice_geography(inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Callable[[pa.Table], Geography]:
    """The geography a slice of persons is encoded against: for a partition (``inputs["slice_states"]``) and a
    :class:`LazyGeography`, the blocks of the states the slice's TABBLKST names only (region indices into the
    same national region IDs, so every count lands in the same cell; the last slice's geography is kept for
    the next slice of the same states: a state's file builds one); else the whole run's. Found from the
    slice itself: the file is parsed once (a pre-pass over it for its states cost ≈ 10 % of SafeTab-P's
    preprocessing)."""
    geo: Geography = public["geography"]
    if not (inputs.get("slice_states") and isinstance(geo, LazyGeography)):
        return lambda table: geo
    lazy = geo
    held: dict[tuple[int, ...], Geography] = {}

    def of(table: pa.Table) -> Geography:
        states = slice_states(table.column("TABBLKST"))
        if states not in held:
            held.clear()
            held[states] = lazy.part(states)
        return held[states]

    return of


def person_counts(inputs: Mapping[str, Any], public: Mapping[str, Any],
                  region_types: Sequence[str]) -> Iterator[tuple[str, PersonCounts]]:
    """(region type, counts) of the run's persons, for each requested region type.

    Each input (the in-memory table, or each file of a split input, streamed) is processed in slices of at most
    ``SLICE_ROWS`` rows: validated and encoded (errors name the file's own row), counted per region type, then
    dropped; the slices' counts are summed (:meth:`PersonCounts.merge`) before anything is yielded, so every
    row of every file is validated before the first count leaves this function (and before any noise). Slicing
    bounds the working set: one slice's encoded persons, never the whole input's."""
    cfg: SafeTabPConfig = public["config"]
    geo_of = slice_geography(inputs, public)
    index: IterationIndex = public["iterations"]
    parts: dict[str, list[PersonCounts]] = {rt: [] for rt in region_types}
    for table, source, start in _person_slices(inputs):
        persons = encode_persons(table, geo_of(table), index, cfg.max_race_codes, cfg.state_filter_us, source,
                                 row_offset=start)
        for rt, counts in PersonCounts.per_region_type(persons, region_types).items():
            parts[rt].append(counts)
        del persons, table
    combos = PersonCounts.unify_combos(parts[region_types[0]]) if region_types else None
    for rt in region_types:
        merged = PersonCounts.merge(parts.pop(rt), combos)
        yield rt, merged


def _config(config: SafeTabPConfig | Mapping[str, Any]) -> SafeTabPConfig:
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

    def plan(self, config: SafeTabPConfig | Mapping[str, Any], public: Mapping[str, Any]) -> list[MeasurementSpec]:
        """Every (region type, level, stage) key with its exact budget (see :mod:`.plan`)."""
        return make_plan(_config(config), public["iterations"], public["geography"])

    def prepare(self, inputs: Mapping[str, Any], public: Mapping[str, Any]) -> Prepared:
        """Validate all person rows (every file of a split input), then flat-map and count per tabulated
        (region type, level) over the region type's iteration set (granularity rule, :func:`.plan.level_of`):
        one row per non-zero (GROUP, CELL) (:func:`.tabulate.tabulate_cells`); see the module docstring for the
        partitioned path.

        Also carries the public domains (region IDs, iteration lists) so that ``measure`` is self-contained,
        unless ``inputs["public_frames"]`` is False (a preprocessing partition other than the first: the domains
        come from public inputs only and are the same in every partition, so one copy is written).
        """
        cfg: SafeTabPConfig = public["config"]
        geo: Geography = public["geography"]
        index: IterationIndex = public["iterations"]
        universe = geo.universe
        prepared: Prepared = {}
        tab = cfg.tabulated(universe)
        levels = {(rt, lv): level_of(cfg, index, rt, lv) for rt, lv in tab}  # region granularity applied
        public_frames = bool(inputs.get("public_frames", True))
        for rt, lv in tab if public_frames else ():
            level = levels[(rt, lv)]
            prepared[iterations_key(lv, iteration_set(rt, cfg.ignore_region_granularity))] = pd.DataFrame(
                {"ITERATION_CODE": level.iteration_codes.astype(object), "TOTAL_ONLY": level.total_only})
        for rt, counts in person_counts(inputs, public, list(dict.fromkeys(rt for rt, _ in tab))):
            if public_frames:
                prepared[regions_key(universe, rt)] = pd.DataFrame({"REGION_ID": geo.region_ids[rt]})
            for lv in (lv for r, lv in tab if r == rt):
                prepared[sparse_key(universe, rt, lv)] = tabulate_cells(counts, levels[(rt, lv)])
            del counts
        return prepared

    def measure(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, rng: Any) -> NoisyMeasurement:
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

    def postprocess_stream(self, measurements: Mapping[str, NoisyMeasurement],
                           public: Mapping[str, Any]) -> CombinedEstimates:
        """:meth:`postprocess` with T2 streamed one stage-2 key at a time (the DAG's post-processing)."""
        return outputs.postprocess_stream(measurements, public["config"])

    def tables(self, estimates: Estimates) -> dict[str, pd.DataFrame]:
        """The t1/t2 release files."""
        return outputs.tables(estimates)

    def table_chunks(self, estimates: Mapping[str, pd.DataFrame]) -> Iterator[tuple[str, pd.DataFrame]]:
        """The release files as ``(table, chunk)`` pairs: t1 whole (it is sorted), then t2 one stored row group
        (one stage-2 key) at a time when the estimates are read from the store (``row_groups``), else whole;
        the chunks concatenate to :meth:`tables`' files."""
        yield "t1", outputs.release_t1(estimates["t1"])
        row_groups = getattr(estimates, "row_groups", None)
        chunks = row_groups("t2") if callable(row_groups) else iter([estimates["t2"]])
        for chunk in chunks:
            yield "t2", chunk[outputs.T2_COLUMNS].reset_index(drop=True)


@dataclasses.dataclass
class RunResult:
    """Everything one in-process run produced."""

    specs: list[MeasurementSpec]
    measurements: dict[str, NoisyMeasurement]
    tables: dict[str, pd.DataFrame]
    budget: Fraction | None


def run_universe(public: Mapping[str, Any], inputs: Mapping[str, Any], rng: Any) -> RunResult:
    """plan → prepare (validates) → stage 1 → stage 2 per level → postprocess → tables, for one universe."""
    return run_prepared(public, SafeTabP().prepare(inputs, public), rng)


def measure_all(public: Mapping[str, Any], prepared: Mapping[str, pd.DataFrame], rng: Any
                ) -> tuple[list[MeasurementSpec], dict[str, NoisyMeasurement]]:
    """The plan and every key's measurement: stage 1, then stage 2 per level, from the output of ``prepare``."""
    product = SafeTabP()
    specs = product.plan(public["config"], public)
    measurements: dict[str, NoisyMeasurement] = {}
    for spec in specs:
        if spec.detail["stage"] == 1:
            measurements[spec.key] = product.measure(prepared, spec, rng)
            prepared = with_stage1(prepared, measurements[spec.key])
    for spec in specs:
        if spec.detail["stage"] == 2:
            measurements[spec.key] = product.measure(prepared, spec, rng)
    return specs, measurements


def run_prepared(public: Mapping[str, Any], prepared: Mapping[str, pd.DataFrame], rng: Any) -> RunResult:
    """stage 1 → stage 2 per level → postprocess → tables, from the output of ``prepare``."""
    product = SafeTabP()
    specs, measurements = measure_all(public, prepared, rng)
    est = product.postprocess(measurements, public)
    total: Fraction | None = Fraction(0)
    for s in specs:
        total = None if total is None or s.budget is None else total + s.budget
    return RunResult(specs, measurements, product.tables(est), total)
