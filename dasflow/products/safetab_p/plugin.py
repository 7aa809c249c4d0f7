"""SafeTab-P in the DAG: the production ``config.json`` as-is; ``person-records.txt`` — or the same records
split into several files ``person-records/*.txt`` (e.g. one per state; read one file at a time, counts summed
before noise: the partitioned path of ``dasflow.products.safetab_p.product``) — under the release's
``safetab-p`` input prefix (confidential); ``GRF-C.txt`` (and optionally the four iteration files; else the
packaged 2020 files) under ``safetab-p_public`` (public).

Adaptivity: stage 2 reads the committed stage-1 noisy totals of the same release (``measure_adaptive``); the
plan lists every stage-1 key before any stage-2 key, and every budget is fixed in the plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from dasflow.errors import InputError, IntegrityError, LedgerRefusal
from dasflow.io.files import input_prefix, local_dir, local_file
from dasflow.io.store import ObjectStore
from dasflow.privacy import accounting, relations, rng
from dasflow.privacy.measurement import MeasurementSpec, NoisyMeasurement
from dasflow.products.plugin import (
    BudgetPlan,
    CliCommand,
    DemoEntry,
    InputChecks,
    InputDeclaration,
    ProductPlugin,
    budget_text,
    config_json,
)
from dasflow.products.safetab_p import SafeTabP, SafeTabPConfig, checks, load_public, moe, outputs, parse_config
from dasflow.products.safetab_p import cli as safetab_cli
from dasflow.products.safetab_p import load_config as load_safetab_config
from dasflow.products.safetab_p.measure import (
    WithStage1,
    measure_stage1,
    measure_stage2,
    segment_ids,
    segment_regions,
    stage1_key,
)
from dasflow.products.safetab_p.product import PERSON_DIR, ground_truth_config, measure_all, person_files
from dasflow.products.safetab_p.records import (
    GRFC_FILE,
    PERSON_COLUMNS,
    PERSON_FILE,
    encode_persons,
    read_pipe_file,
)
from dasflow.products.safetab_p.tabulate import sum_cells
from dasflow.validation.configs import check_infinity, check_keys

#: keys the SafeTab-P production config may carry (safetab-p-production.md)
SAFETAB_LEVEL_SUFFIXES = ("usa", "state", "county", "tract", "place", "aiannh", "pr_state", "pr_county",
                          "pr_tract", "pr_place")
SAFETAB_KEYS = frozenset({
    *(f"privacy_budget_p_level_{lv}_{s}" for lv in (1, 2) for s in SAFETAB_LEVEL_SUFFIXES),
    "privacy_budget_p_stage_1_fraction", "thresholds_p", "zero_suppression_chance", "allow_negative_counts",
    "run_us", "run_pr", "max_race_codes", "privacy_defn", "reader", "state_filter_us",
    "ignore_region_granularity"})  # dasflow's opt-out of the Census region granularity (docs/safetab_p.md)
SAFETAB_REQUIRED = frozenset({"max_race_codes", "privacy_budget_p_stage_1_fraction", "thresholds_p",
                              "privacy_defn"})

class PipelineSafeTabP(SafeTabP):
    """SafeTab-P with the plan ordered stage 1 first and stage 2 fed from the earlier noisy measurements."""

    def plan(self, config: SafeTabPConfig | Mapping[str, Any], public: Mapping[str, Any]) -> list[MeasurementSpec]:
        specs = super().plan(config, public)
        return sorted(specs, key=lambda s: int(s.detail["stage"]))  # stable: plan order within a stage

    def measure_adaptive(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, rng: Any,
                         earlier: Mapping[str, NoisyMeasurement]) -> NoisyMeasurement:
        if int(spec.detail["stage"]) == 2:  # reads its own stage-1 key only (the plan measures it earlier)
            key = stage1_key(spec)
            if key not in earlier:
                raise LedgerRefusal(f"{spec.key}: its stage-1 key {key} is not measured before it; refused "
                                    "before any noise")
            prepared = WithStage1(prepared, {key: earlier[key].table})  # an overlay: nothing is copied
        return self.measure(prepared, spec, rng)

    # region segments (SegmentedMeasure): a key whose group domain is larger than plan.SEGMENT_GROUPS is drawn
    # one range of regions at a time, its sparse counts read from the partitions holding the range

    def segments(self, spec: MeasurementSpec) -> list[str] | None:
        """The key's region segments when its plan entry has ``segment_regions`` (public: region counts of the
        frozen plan); None for a key drawn whole."""
        return segment_ids(spec)

    def segment_parts(self, spec: MeasurementSpec, segment: str) -> list[str] | None:
        """None: every partition; the segment's rows are read by group range (``PartitionedPrepared.rows``
        skips the partitions whose row groups miss it)."""
        return None

    def measure_segment(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec, segment: str,
                        rng: Any) -> NoisyMeasurement:
        """Stage 1 of one segment (stage 2 needs its stage-1 segment: :meth:`measure_segment_adaptive`)."""
        if int(spec.detail["stage"]) != 1:
            raise LedgerRefusal(f"{spec.key}: stage 2 of a segment needs its stage-1 segment; refused before any "
                                "noise")
        return measure_stage1(prepared, spec, rng.spawn(spec.key).spawn(segment), segment_regions(spec, segment))

    def measure_segment_adaptive(self, prepared: Mapping[str, pd.DataFrame], spec: MeasurementSpec,
                                 segment: str, rng: Any,
                                 earlier: Callable[[str, str], NoisyMeasurement]) -> NoisyMeasurement:
        """One segment of a stage-1 key, or of a stage-2 key with its query shapes from the same segment of the
        committed stage-1 key (the same groups). Generator spawned from the key, then the segment. Privacy:
        each group's answers get the noise of the plan's budget exactly as in :meth:`measure`; the segments are
        disjoint region ranges of the one planned key, and stage 2 reads only earlier noisy totals."""
        if int(spec.detail["stage"]) == 1:
            return self.measure_segment(prepared, spec, segment, rng)
        stage1 = earlier(stage1_key(spec), segment).table
        return measure_stage2(prepared, spec, rng.spawn(spec.key).spawn(segment), segment_regions(spec, segment),
                              stage1)



class SafeTabPPlugin(ProductPlugin[SafeTabPConfig]):
    title = 'SafeTab-P'
    name = "safetab-p"
    validation_cost = 1.38  # validate CPU µs per person at 331 M persons (BENCHMARKS.md, fifth national run)
    #: add/remove one person; keys are 0/+1 group counts, so → change-one ρ × 2, ε × 2
    relation = relations.add_remove_product(change=relations.COUNTS_CHANGE)
    may_be_empty = True  # publishes only what its adaptive thresholds allow
    input_declarations = (
        InputDeclaration("safetab-p", "confidential/safetab-p/", confidential=True),
        InputDeclaration("safetab-p_public", "public/safetab-p/", confidential=False),
    )
    synth_format = "safetab_p"
    demo = DemoEntry(inputs={"safetab-p": "confidential/synth/safetab_p/", "safetab-p_public": "public/safetab-p/"},
                     config_file="safetab-p-config.json",
                     public_files={"safetab_p/GRF-C.txt": "public/safetab-p/GRF-C.txt"})

    def product(self, config: SafeTabPConfig) -> PipelineSafeTabP:
        return PipelineSafeTabP()

    def check_config(self, raw: Mapping[str, Any], source: str) -> None:
        """Only the production config's keys (a typo would otherwise silently mean "budget 0, not tabulated");
        ``Infinity`` only in level budgets."""
        check_keys(raw, SAFETAB_KEYS, SAFETAB_REQUIRED, source)
        check_infinity(raw, "", "privacy_budget_p_level_", source)

    def load_config(self, text: str, universe: str) -> SafeTabPConfig:
        raw = config_json(text, "safetab-p")
        config = parse_config(raw, source="safetab-p config")
        runs = config.run_us if universe == "US" else config.run_pr
        if not runs:
            raise InputError(f"SafeTab-P config does not run the release universe {universe}",
                             file="safetab-p config", column="run_us" if universe == "US" else "run_pr")
        return config

    def _universe(self, config: SafeTabPConfig) -> str:
        return "US" if config.run_us else "PR"

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: SafeTabPConfig) -> dict[str, Any]:
        folder = local_dir(store, input_prefix(inputs, "safetab-p_public", "public/safetab-p/"))
        if not (folder / GRFC_FILE).is_file():
            raise InputError(f"missing {GRFC_FILE}", file=str(folder / GRFC_FILE))
        return load_public(folder, folder, self._universe(config), config, lazy=True)  # type: ignore[arg-type]

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str],
                                 config: SafeTabPConfig) -> dict[str, Any]:
        """``person-records.txt`` read into memory, or a split ``person-records/*.txt`` listed (streamed by
        ``prepare`` one file at a time); both present is refused."""
        prefix = input_prefix(inputs, "safetab-p", "confidential/safetab-p/")
        split = [k for k in store.list(prefix + PERSON_DIR + "/") if k.endswith(".txt")]
        if split:
            if store.exists(prefix + PERSON_FILE):
                raise InputError(f"both {PERSON_FILE} and {PERSON_DIR}/ are present: give one person-records "
                                 "input", file=prefix + PERSON_FILE)
            folder = local_dir(store, prefix + PERSON_DIR + "/")
            return {"person_files": [str(f) for f in person_files(folder)], "source": PERSON_DIR}
        path = local_file(store, prefix + PERSON_FILE)
        return {"persons": read_pipe_file(path, PERSON_COLUMNS), "source": PERSON_FILE}

    def _split_files(self, store: ObjectStore, prefix: str) -> list[str]:
        """The file names of a split ``person-records/*.txt`` input (directly in the folder), in name order."""
        folder = prefix + PERSON_DIR + "/"
        return sorted(k[len(folder):] for k in store.list(folder)
                      if k.endswith(".txt") and "/" not in k[len(folder):])

    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: SafeTabPConfig) -> list[str] | None:
        """The files of a split input (``person-records/{id}.txt``, e.g. one per state: ids are the file names
        without ``.txt``), or None for one ``person-records.txt``.

        Exactness: every prepared count is a tabulation — per (population group, sex × AGE23 cell) of a (region
        type, level), the number of persons whose flat map reaches the group — and a person's groups depend on
        that person alone, so the tabulation of all files is the sum of the files' tabulations (USA and AIANNH
        groups, which span states, included; :meth:`combine_prepared`). Stage 1's totals and stage 2's cells
        at every candidate detail are sums of these cells, so both read exactly the counts of the unpartitioned
        path: the same function of the data, computed in parts, with every sensitivity of the plan unchanged
        (the files are disjoint person sets, so the add/remove-one-person neighbour changes one file)."""
        prefix = input_prefix(inputs, "safetab-p", "confidential/safetab-p/")
        names = self._split_files(store, prefix)
        if not names:
            return None
        if store.exists(prefix + PERSON_FILE):
            raise InputError(f"both {PERSON_FILE} and {PERSON_DIR}/ are present: give one person-records input",
                             file=prefix + PERSON_FILE)
        return [n[:-len(".txt")] for n in names]

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: SafeTabPConfig,
                         partition: str) -> dict[str, Any]:
        """One file of the split input, listed as a split input of one file (``prepare`` validates it and reads
        it in slices), encoded slice by slice against the GRF-C blocks of the states the slice's persons name
        only (``slice_states``: :func:`.product.slice_geography`; a block's key holds its state, so each person
        finds the same block and regions as in the whole GRF-C); errors name ``person-records/{partition}.txt``.
        Only the first partition writes the public domains (``public_frames``: region IDs, iteration lists —
        the same in every partition, from public inputs only), so the other partitions neither write nor
        re-read them."""
        prefix = input_prefix(inputs, "safetab-p", "confidential/safetab-p/")
        path = local_file(store, f"{prefix}{PERSON_DIR}/{partition}.txt")
        first = self._split_files(store, prefix)[0][:-len(".txt")]
        return {"person_files": [str(path)], "source": PERSON_DIR, "slice_states": True,
                "public_frames": partition == first}

    def combine_prepared(self, name: str, parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
        """Count tabulations (``counts/...``) summed per (GROUP, CELL) (:func:`.tabulate.sum_cells`); the public
        domains (region IDs, iteration lists) are the same in every partition: the first, after checking that
        every part equals it (``IntegrityError`` otherwise; only the first partition writes them,
        :meth:`partition_inputs`)."""
        if not parts:
            raise IntegrityError(f"prepared {name!r}: no partition holds it")
        if name.startswith("counts/"):
            return sum_cells(parts)
        for i, part in enumerate(parts[1:], start=1):
            if not part.equals(parts[0]):
                raise IntegrityError(f"prepared {name!r}: partition {i} does not have the public domain of "
                                     "partition 0")
        return parts[0]

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: SafeTabPConfig) -> dict[str, Any]:
        """Every person row checked (codes, order, ages, QSPAN, blocks in GRF-C) before any noise; a split
        input file by file (one file's persons in memory at a time)."""
        args = (public["geography"], public["iterations"], config.max_race_codes, config.state_filter_us)
        if "person_files" in confidential:
            rows = 0
            for f in confidential["person_files"]:  # over files, not records
                table = read_pipe_file(f, PERSON_COLUMNS)
                encode_persons(table, *args, f"{PERSON_DIR}/{Path(f).name}")
                rows += int(table.num_rows)
            return {"persons": rows, "files": len(confidential["person_files"]), "universe": public["universe"],
                    "encoded": "PersonArrays"}
        persons = encode_persons(confidential["persons"], *args, PERSON_FILE)
        return {"persons": int(confidential["persons"].num_rows), "universe": public["universe"],
                "encoded": type(persons).__name__}

    def file_name(self, table: str, universe: str) -> str:
        """``t1/t1_US.csv``, ``t2/t2_US.csv`` (safetab-p-production.md), pipe-delimited."""
        return f"{table}/{table}_{universe}.csv"

    def preflight(self, store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
        checks.preflight(store, inputs, public=public)

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                     config: SafeTabPConfig) -> InputChecks:
        return checks.input_checks(confidential, public, config)

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                      config: SafeTabPConfig, chunk_rows: int) -> InputChecks:
        """The same checks with the person records (one file or a split input) read in chunks."""
        return checks.stream_checks(store, inputs, public, config, chunk_rows)

    def output_header(self, file: str) -> list[str] | None:
        return checks.output_header(file)

    def invariants(self, public: Mapping[str, Any], config: SafeTabPConfig) -> list[str]:
        return ["safetab-p: none (every count is noisy; no totals are held invariant)"]

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: SafeTabPConfig,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
        """SafeTab-P's ground-truth twin: every tabulated level at infinite budget (no noise, same adaptivity), as
        :func:`~dasflow.products.safetab_p.outputs.truth_tables` (T1 unsorted, its keys categoricals)."""
        cfg = ground_truth_config(config)
        public = self.public_inputs(store, inputs, cfg)
        prepared = SafeTabP().prepare(self.confidential_inputs(store, inputs, cfg), public)
        _, measurements = measure_all(public, prepared, rng.seeded(0))  # σ² = 0: the generator is never used
        tables = outputs.truth_tables(measurements, public["config"])
        return {self.file_name(n, universe): f for n, f in tables.items()}

    def cell_moes(self, specs: Sequence[MeasurementSpec], published: Mapping[str, pd.DataFrame],
                  public: Mapping[str, Any], universe: str, cache: dict[Any, Any]) -> dict[str, np.ndarray]:
        """The stated MOE of every published t1/t2 row (:mod:`dasflow.products.safetab_p.moe`: from the plan,
        the public iteration index and the published tables only)."""
        names = {t: self.file_name(t, universe) for t in ("t1", "t2")}
        if not all(n in published for n in names.values()):
            return {}
        cache_key = ("safetab_keys", tuple((s.key, s.noise, s.detail.get("total_only_noise")) for s in specs))
        if cache_key not in cache:
            cache[cache_key] = moe.key_table(specs, public)
        t1, t2 = moe.cell_moes(published[names["t1"]], published[names["t2"]], cache[cache_key])
        return {names["t1"]: t1, names["t2"]: t2}

    def budget_format(self, raw: Mapping[str, Any] | None) -> bool:
        """A SafeTab-P ``PARAMETERS_DIR`` (a directory) or a ``config.json`` with ``privacy_budget_p_*`` keys."""
        return raw is None or (isinstance(raw, Mapping) and any(str(k).startswith("privacy_budget_p_") for k in raw))

    def budget_plan(self, path: Path) -> BudgetPlan:
        """Each tabulated (region type, level) budget split between stage 1 (γ) and stage 2 (1 − γ), for each
        universe the config runs."""
        if path.is_dir():
            cfg = load_safetab_config(path)
        else:
            cfg = parse_config(accounting.load_json_exact(path.read_text(encoding="utf-8")), source=str(path))
        rows: list[dict[str, Any]] = []
        parts: dict[str, list[tuple[str, Fraction | None]]] = {}
        universes: tuple[tuple[Literal["US", "PR"], bool], ...] = (("US", cfg.run_us), ("PR", cfg.run_pr))
        for universe, runs in universes:
            if not runs:
                continue
            parts[universe] = []
            for rt, lv in cfg.tabulated(universe):
                rho = cfg.budgets[(rt, lv)]
                for stage, share in ((1, cfg.gamma), (2, 1 - cfg.gamma)):
                    b = None if rho is None else rho * share
                    parts[universe].append((cfg.privacy_defn, b))
                    rows.append({"product": self.name, "universe": universe, "key": f"{rt}/{lv}/stage{stage}",
                                 "level": f"({rt}, {lv})", "definition": cfg.privacy_defn, "budget": budget_text(b)})
        return BudgetPlan(rows, parts)

    def cli(self) -> CliCommand:
        return CliCommand(self.name, "SafeTab-P with the Census production file formats",
                          safetab_cli.add_arguments, safetab_cli.run)


PLUGIN = SafeTabPPlugin()
