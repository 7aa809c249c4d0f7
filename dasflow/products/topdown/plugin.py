"""TopDown in the DAG: PL 94-171-style persons histogram on the optimised geographic spine.

Inputs: person files (Parquet; block TABBLKST/TABBLKCOU/TABTRACTCE/TABBLK and the 0-based HHGQ, VOTINGAGE,
HISPANIC, CENRACE codes, as the synthetic census's ``topdown`` format) under the release's ``topdown`` prefix
(confidential); under ``topdown_public``: ``GRF-C.txt`` (the public block geography, pipe-delimited, one row
per block), ``invariants.json`` (``{"total": N, "state": {"01": n1, ...}}``: the nation's and each state's
population, held invariant, public in the DAS) and ``block_facts.csv`` (per block: housing units ``HU`` and GQ
facilities ``GQ1``…``GQ7``, the structural-zero facts; format in :mod:`dasflow.products.topdown.invariants`,
built from a unit file by ``invariants.build_block_facts``).

Config (JSON)::

    {"preset": "pl94_persons", "fanout_cutoff": 8, "budget": "1", "privacy_defn": "zcdp",
     "beta": ["104/4099", ...] (default: the 2020 PL94 person shares), "strategy": "pl94" | "detailed",
     "invariants": ["total", "state"] (default; [] for none), "structural_zeros": true (default with HHGQ),
     "total_invariant": true (older switch: false = no invariants),
     "segment_blocks": 25000 (the public bound on a measurement segment and a post-processing part, in blocks),
     "bottom_up_max_entries": 20000000 (the bottom-up pass's memory bound: the deepest level it reads has at most
     this many units × rows; deeper levels are read one segment at a time)}
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dasflow.errors import InputError, IntegrityError
from dasflow.io.delimited import read_text_table
from dasflow.io.files import input_prefix, read_parquet_records
from dasflow.io.store import ObjectStore, StoreError
from dasflow.privacy import accounting
from dasflow.products.base import Product
from dasflow.products.plugin import DemoEntry, InputChecks, InputDeclaration, ProductPlugin, config_json
from dasflow.products.topdown import checks
from dasflow.products.topdown.invariants import (
    BLOCK_FACTS_FILE,
    INVARIANTS_FILE,
    check_state_invariants,
    read_block_facts,
)
from dasflow.products.topdown.measure import SEGMENT_BLOCKS
from dasflow.products.topdown.model import EstimatorOptions
from dasflow.products.topdown.partitioned import PartitionedTopDown
from dasflow.products.topdown.product import TopDown, TopDownConfig
from dasflow.products.topdown.relation import RELATION
from dasflow.products.topdown.reporting import topdown_consistency, topdown_truth
from dasflow.products.topdown.spine import GEOGRAPHY_COLUMNS, preset, spine_bytes, spine_from_bytes
from dasflow.products.topdown.strategy import (
    PL94_GEOLEVEL_SHARES,
    Schema,
    detailed_only_strategy,
    make_strategy,
)

PERSON_GEO = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK")
#: a state folder of the per-state input layout (``{prefix}{SS}/part-*.parquet``)
STATE_FOLDER = re.compile(r"[0-9]{2}")
KNOWN_KEYS = {"preset", "fanout_cutoff", "budget", "privacy_defn", "beta", "strategy", "total_invariant",
              "invariants", "structural_zeros", "segment_blocks", "bottom_up_max_entries"}



def parse_topdown_config(raw: Any, source: str = "topdown config") -> TopDownConfig:
    """The JSON config above → a validated ``TopDownConfig`` (exact shares and budget)."""
    if not isinstance(raw, Mapping):
        raise InputError("a TopDown config is a JSON object", file=source)
    unknown = sorted(set(raw) - KNOWN_KEYS)
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)}", file=source, column=unknown[0])
    defn = str(raw.get("privacy_defn", "zcdp"))
    budget = accounting.parse_budget(raw.get("budget"), "budget")
    if budget is None or budget <= 0:
        raise InputError("budget must be a finite positive number", file=source, column="budget")
    beta = raw.get("beta", [str(b) for b in PL94_GEOLEVEL_SHARES])
    cutoff = raw.get("fanout_cutoff")
    if isinstance(cutoff, bool) or not isinstance(cutoff, int):
        raise InputError("fanout_cutoff must be an integer", file=source, column="fanout_cutoff")
    spine = preset(str(raw.get("preset", "pl94_persons")), [str(b) for b in beta], cutoff,
                   privacy_rule="zcdp" if defn == "zcdp" else "puredp")
    kind = raw.get("strategy", "pl94")
    if kind not in ("pl94", "detailed"):
        raise InputError("strategy must be 'pl94' or 'detailed'", file=source, column="strategy")
    per_level = detailed_only_strategy(Schema()) if kind == "detailed" else None
    strategy = make_strategy(spine.levels, list(spine.beta), str(budget), per_level=per_level, privacy_defn=defn)
    inv = raw.get("invariants")
    if inv is not None and (not isinstance(inv, list) or not all(isinstance(k, str) for k in inv)):
        raise InputError('invariants must be a list such as ["total", "state"]', file=source, column="invariants")
    zeros = raw.get("structural_zeros")
    if zeros is not None and not isinstance(zeros, bool):
        raise InputError("structural_zeros must be true or false", file=source, column="structural_zeros")
    total_inv = raw.get("total_invariant", True)
    if not isinstance(total_inv, bool):
        raise InputError("total_invariant must be true or false", file=source, column="total_invariant")
    seg = raw.get("segment_blocks", SEGMENT_BLOCKS)
    if isinstance(seg, bool) or not isinstance(seg, int) or seg < 1:
        raise InputError("segment_blocks must be a positive integer", file=source, column="segment_blocks")
    options = EstimatorOptions()
    entries = raw.get("bottom_up_max_entries", options.bottom_up_max_entries)
    if isinstance(entries, bool) or not isinstance(entries, int) or entries < 1:
        raise InputError("bottom_up_max_entries must be a positive integer", file=source,
                         column="bottom_up_max_entries")
    options.bottom_up_max_entries = entries
    return TopDownConfig(spine=spine, strategy=strategy, total_invariant=total_inv,
                         invariants=None if inv is None else tuple(inv), structural_zeros=zeros,
                         segment_blocks=seg, options=options)


#: the stored spine among TopDown's derived public objects (``ProductPlugin.derived_public``)
SPINE_FILE = "spine.npz"


class TopDownPlugin(ProductPlugin[TopDownConfig]):
    title = 'TopDown'
    """One TopDown object per loaded config in a process: ``measure`` uses the spine its ``plan`` built (the
    pipeline plans every product before measuring it)."""

    name = "topdown"
    validation_cost = 0.91  # validate CPU µs per person at 331 M persons (BENCHMARKS.md, fifth national run)
    #: change one record; → add/remove ρ × 1/2, ε × 1/2 (dasflow.products.topdown.relation)
    relation = RELATION
    synth_format = "topdown"
    zero_filled = True
    input_declarations = (
        InputDeclaration("topdown", "confidential/topdown/", confidential=True),
        InputDeclaration("topdown_public", "public/topdown/", confidential=False),
    )
    #: the synthetic census's TopDown persons and its public files (GRF-C, block facts, total/state invariants)
    demo = DemoEntry(inputs={"topdown": "confidential/synth/topdown/persons/", "topdown_public": "public/topdown/"},
                     config_file="topdown-config.json",
                     public_files={f"topdown/public/{name}": f"public/topdown/{name}"
                                   for name in ("GRF-C.txt", "block_facts.csv", "invariants.json")})

    def __init__(self) -> None:
        self._products: dict[int, tuple[Any, TopDown]] = {}

    def product(self, config: TopDownConfig) -> TopDown:
        held = self._products.get(id(config))
        if held is None or held[0] is not config:
            held = (config, TopDown(config))
            self._products[id(config)] = held
        return held[1]

    def load_config(self, text: str, universe: str) -> TopDownConfig:
        raw = config_json(text, "topdown")
        return parse_topdown_config(raw)

    def public_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: TopDownConfig) -> dict[str, Any]:
        prefix = input_prefix(inputs, "topdown_public", "public/topdown/")
        grfc = read_text_table(store.get(prefix + "GRF-C.txt"))  # pd.read_csv(…, sep="|", dtype=str)
        blocks = grfc[[c for c in grfc.columns if c in GEOGRAPHY_COLUMNS]]
        try:
            invariants = json.loads(store.get(prefix + "invariants.json"))
        except (StoreError, ValueError) as exc:
            raise InputError(f"public invariants: {exc}", file=prefix + "invariants.json") from None
        if not isinstance(invariants, dict):
            raise InputError("invariants.json must hold a JSON object", file=prefix + "invariants.json")
        out: dict[str, Any] = {"blocks": blocks, "blocks_source": prefix + "GRF-C.txt", "invariants": invariants}
        facts_key = prefix + BLOCK_FACTS_FILE
        if store.exists(facts_key):
            out["block_facts"] = read_block_facts(store.get(facts_key), facts_key)
            out["block_facts_source"] = facts_key
        elif config.uses_structural_zeros:
            raise InputError("structural zeros are configured but the public block facts are missing",
                             file=facts_key)
        return out

    def derived_public(self, public: Mapping[str, Any], config: TopDownConfig) -> dict[str, bytes]:
        """The optimised spine (a function of the public block geography and the config only), stored once per
        release so that no later process builds it again (≈ 100 CPU-s and 6 GB at national size)."""
        return {SPINE_FILE: spine_bytes(self.product(config).spine(public))}

    def load_derived(self, public: Mapping[str, Any], derived: Mapping[str, bytes],
                     config: TopDownConfig) -> dict[str, Any]:
        """The stored spine in place of a rebuild. Privacy: the bytes are the ones the plan was made from
        (SHA-256 frozen with the plan, checked by the caller), and ``spine_from_bytes`` re-checks the invariant
        every noise allocation rests on (every block's γ path sums to Σβ exactly) before returning it."""
        if SPINE_FILE not in derived:
            return dict(public)
        return {**public, "spine": spine_from_bytes(derived[SPINE_FILE], SPINE_FILE)}

    def confidential_inputs(self, store: ObjectStore, inputs: Mapping[str, str],
                                 config: TopDownConfig) -> dict[str, Any]:
        prefix = input_prefix(inputs, "topdown", "confidential/topdown/")
        names = list(config.strategy.schema.names)
        frame = read_parquet_records(store, prefix, [*PERSON_GEO, *names], "person files")
        return {"persons": _persons(frame, names), "persons_source": prefix}

    # ------------------------------------------------------------------------ preprocessing partitions
    def partitions(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                   config: TopDownConfig) -> list[str] | None:
        """The input's state folders (``{SS}/part-*.parquet``, the synthetic census's ``topdown`` layout), or
        None when every person file lies directly under the prefix (one national pass).

        Exactness: ``prepare`` tabulates each person into its block's cell and sums up the spine; a state's
        folder holds exactly the persons of its blocks (:meth:`partition_inputs` refuses any other), so each
        level's histogram is the sum of the states' histograms — disjoint units below the state level, sums of
        per-state rows at and above it (:meth:`combine_prepared`). Same function of the data, same
        sensitivities."""
        prefix = input_prefix(inputs, "topdown", "confidential/topdown/")
        folders = _state_folders(store, prefix)
        return None if folders is None else sorted(folders)

    def partition_inputs(self, store: ObjectStore, inputs: Mapping[str, str], config: TopDownConfig,
                         partition: str) -> dict[str, Any]:
        """One state folder's persons; ``InputError`` naming the file, row and column for a person whose
        TABBLKST is not the folder's state (its block would be tabulated in another state's partition)."""
        prefix = input_prefix(inputs, "topdown", "confidential/topdown/")
        folders = _state_folders(store, prefix) or {}
        names = list(config.strategy.schema.names)
        tables = []
        for key in folders.get(partition, []):
            table = pq.read_table(io.BytesIO(store.get(key)))
            missing = [c for c in (*PERSON_GEO, *names) if c not in table.column_names]
            if missing:
                raise InputError(f"missing column(s) {', '.join(missing)}", file=key, column=missing[0])
            state = pc.utf8_lpad(table.column("TABBLKST").cast(pa.string()), 2, "0")
            wrong = np.flatnonzero(pc.fill_null(pc.not_equal(state, partition), True).to_numpy(zero_copy_only=False))
            if wrong.size:
                raise InputError(f"person's TABBLKST is not the state {partition} of its folder", file=key,
                                 row=int(wrong[0]) + 1, column="TABBLKST")
            tables.append(table.select([*PERSON_GEO, *names]))
        if not tables:
            raise InputError(f"no person files in state folder {partition}", file=f"{prefix}{partition}/")
        return {"persons": _persons(pa.concat_tables(tables), names), "persons_source": f"{prefix}{partition}/"}

    def combine_prepared(self, name: str, parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
        """One level's histogram (UNIT, CELL, COUNT; sorted by unit and cell, counts ≥ 1) of the nation from the
        states' histograms: rows of the same (UNIT, CELL) summed exactly — below the state level the states'
        units are disjoint and the rows are the states' rows in order; at and above it the few national and
        state rows are sums of per-state partial counts. Equal to ``prepare`` on all persons."""
        if not parts:
            raise IntegrityError(f"prepared {name!r}: no partition holds it")
        if any(list(p.columns) != ["UNIT", "CELL", "COUNT"] for p in parts):
            raise IntegrityError(f"prepared {name!r}: a partition is not a UNIT, CELL, COUNT histogram")
        unit, cell, count = (np.concatenate([p[c].to_numpy(np.int64) for p in parts]) for c in ("UNIT", "CELL",
                                                                                                 "COUNT"))
        order = np.lexsort((cell, unit))
        unit, cell, count = unit[order], cell[order], count[order]
        first = np.ones(unit.size, dtype=bool)
        first[1:] = (unit[1:] != unit[:-1]) | (cell[1:] != cell[:-1])
        at = np.flatnonzero(first)
        total = np.add.reduceat(count, at) if at.size else count
        return pd.DataFrame({"UNIT": unit[at], "CELL": cell[at], "COUNT": total.astype(np.int64)})

    def validate(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                      config: TopDownConfig) -> dict[str, Any]:
        """Blocks in the public geography, attribute codes in the schema, the population invariant — before any
        noise (the product's own tabulation raises ``InputError`` with file, row and column)."""
        product = TopDown(config)
        product.prepare(confidential, public)   # blocks, codes, and no person in a structural-zero cell
        persons = confidential["persons"]
        inv = public["invariants"]
        kinds = config.invariant_kinds
        if "total" in kinds:
            total = inv.get("total")
            if total is None:
                raise InputError("the total invariant is configured but 'total' is missing", file=INVARIANTS_FILE,
                                 column="total")
            if total != len(persons):
                raise InputError(f"public population invariant {total} differs from the {len(persons)} person "
                                 "records", file=INVARIANTS_FILE, column="total")
        cons = product.constraints(public)   # states = the geography's, Σ states = total, facts complete
        if cons is not None and cons.has_states and cons.state_totals is not None:
            check_state_invariants(persons["GEOID"].to_numpy(), cons.state_labels, cons.state_totals)
        return {"persons": len(persons), "blocks": len(public["blocks"]),
                "invariants": list(kinds), "structural_zeros": bool(cons is not None and cons.has_zeros)}

    def file_name(self, table: str, universe: str) -> str:
        return f"{table}.csv"

    def preflight(self, store: ObjectStore, inputs: Mapping[str, str], *, public: bool) -> None:
        checks.preflight(store, inputs, public=public)

    def input_checks(self, confidential: Mapping[str, Any], public: Mapping[str, Any],
                     config: TopDownConfig) -> InputChecks:
        return checks.input_checks(confidential, public, config)

    def stream_checks(self, store: ObjectStore, inputs: Mapping[str, str], public: Mapping[str, Any],
                      config: TopDownConfig, chunk_rows: int) -> InputChecks:
        """The same checks with the person Parquet files read in batches (:func:`checks.stream_checks`)."""
        return checks.stream_checks(store, inputs, public, config, chunk_rows)

    def truth(self, store: ObjectStore, inputs: Mapping[str, str], config: TopDownConfig,
              universe: str, public: Mapping[str, Any] | None = None) -> dict[str, pd.DataFrame]:
        """The published tables of the true block histogram (:func:`reporting.topdown_truth`)."""
        product = self.product(config)
        public = public if public is not None else self.public_inputs(store, inputs, config)
        conf = self.confidential_inputs(store, inputs, config)
        return {self.file_name(t, universe): f for t, f in topdown_truth(product, conf, public).items()}

    def consistency(self, files: Mapping[str, pd.DataFrame], public: Mapping[str, Any],
                    config: TopDownConfig) -> list[dict[str, Any]]:
        """Each standard geolevel against the sum of its children (released values only)."""
        return topdown_consistency(files)

    def scaled_config(self, config: TopDownConfig, factor: Fraction) -> TopDownConfig:
        """TopDown draws its noise from its strategy (budget ρ·β·α per key and the spine's γ), not from the
        planned key: a budget scale is the strategy's budget × factor (its own plan, through the accountant).
        The spine does not depend on the budget."""
        return dataclasses.replace(config, strategy=dataclasses.replace(config.strategy,
                                                                        budget=config.strategy.budget * factor))

    def partitioned(self, product: Product[TopDownConfig]) -> PartitionedTopDown:
        """Post-processing in parts (root, then per state / partition unit and level): the Dask scale-out."""
        assert isinstance(product, TopDown)
        return PartitionedTopDown(product)


def _persons(frame: pa.Table, names: Sequence[str]) -> pd.DataFrame:
    """Person records as ``prepare`` reads them: the block GEOID (:func:`.checks.person_geoid`: the codes
    zero-filled to 2, 3, 6 and 4 digits and joined, as Arrow strings) and the schema attributes."""
    geoid = checks.person_geoid(frame)
    return pd.DataFrame({"GEOID": pd.Series(pd.arrays.ArrowStringArray(geoid), copy=False),
                         **{n: frame.column(n).to_numpy() for n in names}})


def _state_folders(store: ObjectStore, prefix: str) -> dict[str, list[str]] | None:
    """The person files under ``prefix`` by state folder (``{SS}/…parquet``, keys in order), or None when they
    all lie directly under it; ``InputError`` for a mixed layout or a folder that is not a 2-digit state."""
    keys = sorted(k for k in store.list(prefix) if k.endswith(".parquet"))
    flat = [k for k in keys if "/" not in k[len(prefix):]]
    if not keys or len(flat) == len(keys):
        return None
    if flat:
        raise InputError("person files both directly under the prefix and in state folders: one layout only",
                         file=flat[0])
    folders: dict[str, list[str]] = {}
    for key in keys:
        folder = key[len(prefix):].split("/", 1)[0]
        if not STATE_FOLDER.fullmatch(folder):
            raise InputError(f"person files lie in folder {folder!r}, not a 2-digit state FIPS folder", file=key)
        folders.setdefault(folder, []).append(key)
    return folders


PLUGIN = TopDownPlugin()
