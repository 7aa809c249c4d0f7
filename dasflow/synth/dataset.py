"""Orchestration: validate the request, stream state by state and chunk by chunk into the writers, publish
atomically (staging directory, then renames, ``manifest.json`` last).

Determinism: state ``s`` is a function of (seed, s, persons in s) only. ``persons`` is the total over the selected
states, apportioned by 2020 population (largest remainder); pass the same per-state size (``generate_state``) to
reproduce a state's data bit for bit whatever else is generated.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from dasflow.errors import InputError
from dasflow.synth import params as prm
from dasflow.synth.geography import StateGeography, build_state_geography, chunk_tract_ranges
from dasflow.synth.population import Chunk, StateContext, generate_chunk
from dasflow.synth.race import county_hispanic_rates, race_tables
from dasflow.synth.reference import states
from dasflow.synth.seeding import stream
from dasflow.synth.tables import geo_table, persons_table, units_table
from dasflow.synth.writers import FORMAT_ROOTS, WRITERS, make_writers

FORMATS: tuple[str, ...] = tuple(WRITERS)
#: what ``dasflow synth --format`` means
CLI_FORMATS: dict[str, tuple[str, ...]] = {"parquet": ("parquet",), "census": ("phsafe", "safetab_p")}
MAFID_MIN = 100_000_001
MAFID_MAX = 899_999_999
#: generous upper bound of units per person (households ~0.39, vacant ~0.04, GQ facilities ~0.0005)
UNITS_PER_PERSON_BOUND = 0.6


# ---- validation ------------------------------------------------------------------------------------------


def parse_states(states_arg: str | Sequence[str] | None) -> list[str]:
    """State FIPS codes in FIPS order; None = all 52 (50 states, DC, PR)."""
    known = states()
    if states_arg is None:
        return list(known)
    items = [s.strip() for s in states_arg.split(",")] if isinstance(states_arg, str) else [str(s) for s in states_arg]
    items = [s.zfill(2) if s.isdigit() and len(s) == 1 else s for s in items if s != ""]
    if not items:
        raise InputError("no state given (expected comma-separated 2-digit FIPS codes, e.g. 06,72)", column="--states")
    bad = [s for s in items if s not in known]
    if bad:
        raise InputError(
            f"unknown state FIPS code(s) {', '.join(bad)}; valid: 01-56 (50 states + DC 11) and 72 (PR)",
            column="--states",
        )
    if len(set(items)) != len(items):
        raise InputError("duplicate state FIPS code(s)", column="--states")
    return sorted(items)


def apportion(persons: int, state_list: Sequence[str]) -> dict[str, int]:
    """Split ``persons`` over the states by 2020 population, largest remainder (ties by FIPS order)."""
    pops = np.array([states()[s].pop2020 for s in state_list], dtype=np.float64)
    quota = persons * pops / pops.sum()
    base = np.floor(quota).astype(np.int64)
    rest = persons - int(base.sum())
    order = np.argsort(-(quota - base), kind="stable")
    base[order[:rest]] += 1
    return {s: int(n) for s, n in zip(state_list, base, strict=True)}


def mafid_range(state: str) -> tuple[int, int]:
    """(base, capacity): the state's MAFIDs are base+1 .. base+capacity, disjoint across states and inside
    the CEF domain 100000001..899999999; capacity proportional to the 2020 population share."""
    st = states()
    total = sum(s.pop2020 for s in st.values())
    span = MAFID_MAX - MAFID_MIN + 1
    before = sum(s.pop2020 for s in st.values() if s.index < st[state].index)
    lo = MAFID_MIN - 1 + (span * before) // total
    hi = MAFID_MIN - 1 + (span * (before + st[state].pop2020)) // total
    return lo, hi - lo


def validate_request(persons: int, seed: int, state_list: Sequence[str], formats: Sequence[str]) -> dict[str, int]:
    """Fail before anything is written: bad sizes, unknown formats, MAFID space exhausted."""
    if isinstance(persons, bool) or not isinstance(persons, int | np.integer):
        raise InputError(f"persons must be an integer, got {persons!r}", column="--persons")
    if persons <= 0:
        raise InputError(f"persons must be positive, got {persons}", column="--persons")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}", column="--seed")
    bad = [f for f in formats if f not in WRITERS]
    if bad or not formats:
        raise InputError(f"unknown output format(s) {bad or formats!r}; known: {', '.join(FORMATS)}", column="--format")
    split = apportion(int(persons), state_list)
    for s, n in split.items():
        _, cap = mafid_range(s)
        if n * UNITS_PER_PERSON_BOUND > cap:
            raise InputError(
                f"{n:,} persons in state {s} would exceed its MAFID range ({cap:,} units; the CEF "
                f"MAFID domain is 100000001-899999999); use fewer persons",
                column="--persons",
            )
    return split


def estimate_bytes(persons: int, formats: Sequence[str]) -> int:
    """Upper estimate of the bytes written (measured bytes/person with headroom)."""
    per = sum(prm.BYTES_PER_PERSON[f] for f in formats)
    return int(persons * per * prm.DISK_HEADROOM) + 50_000_000


def _existing_ancestor(p: Path) -> Path:
    p = p.absolute()
    while not p.exists():
        p = p.parent
    return p


def check_disk(out_dir: Path, persons: int, formats: Sequence[str]) -> None:
    need = estimate_bytes(persons, formats)
    free = shutil.disk_usage(_existing_ancestor(out_dir)).free
    if need > free:
        raise InputError(
            f"not enough disk space for {persons:,} persons in {', '.join(formats)}: need about "
            f"{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free",
            file=str(out_dir),
        )


def check_out_dir(out_dir: Path, formats: Sequence[str]) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError("output path exists and is not a directory", file=str(out_dir))
    if (out_dir / "manifest.json").exists():
        raise InputError(
            "output directory already holds a synthetic dataset (manifest.json); choose another",
            file=str(out_dir),
        )
    clash = [FORMAT_ROOTS[f] for f in formats if (out_dir / FORMAT_ROOTS[f]).exists()]
    if clash:
        raise InputError(
            f"output directory already has {', '.join(clash)} but no manifest.json (an interrupted run?); "
            "remove them or choose an empty directory",
            file=str(out_dir),
        )


# ---- generation ------------------------------------------------------------------------------------------


def state_context(state: str, persons: int, seed: int) -> StateContext:
    """Geography and per-county tables of one state."""
    geo = build_state_geography(state, persons, seed)
    g = stream(seed, state, "race")
    k = geo.county_fips.size
    race = race_tables(g, state, k)
    hisp = county_hispanic_rates(g, states()[state].hispanic_share, k)
    return StateContext(geo, race, hisp, mafid_range(state)[0])


def iter_state_chunks(
    state: str, persons: int, seed: int, chunk_persons: int = prm.CHUNK_PERSONS
) -> Iterator[tuple[StateContext, Chunk]]:
    """Stream a state's chunks (bounded memory: one chunk of about ``chunk_persons`` persons at a time)."""
    ctx = state_context(state, persons, seed)
    offset = 0
    for t0, t1 in chunk_tract_ranges(ctx.geo, chunk_persons):
        c = generate_chunk(ctx, t0, t1, seed, offset)
        offset += c.n_units
        yield ctx, c


@dataclass
class StateData:
    """A whole state in memory (for tests and small runs)."""

    geo: StateGeography
    chunks: list[Chunk]

    def persons(self) -> pd.DataFrame:
        return _frame([persons_table(c) for c in self.chunks], self.geo.state)

    def units(self) -> pd.DataFrame:
        return _frame([units_table(c) for c in self.chunks], self.geo.state)

    def geo_units(self) -> pd.DataFrame:
        return _frame([geo_table(c, self.geo) for c in self.chunks], None)


def _frame(parts: list[pa.Table], state: str | None) -> pd.DataFrame:
    df = pa.concat_tables(parts).to_pandas() if parts else pd.DataFrame()
    if state is not None:
        df.insert(0, "TABBLKST", state)
    return df


def generate_state(state: str, persons: int, seed: int, chunk_persons: int = prm.CHUNK_PERSONS) -> StateData:
    """One state with exactly ``persons`` persons, in memory."""
    (st,) = parse_states([state])
    if persons < 0:
        raise InputError(f"persons must be >= 0, got {persons}", column="persons")
    ctx = state_context(st, persons, seed)
    chunks: list[Chunk] = []
    offset = 0
    for t0, t1 in chunk_tract_ranges(ctx.geo, chunk_persons):
        c = generate_chunk(ctx, t0, t1, seed, offset)
        offset += c.n_units
        chunks.append(c)
    return StateData(ctx.geo, chunks)


def generate_frames(
    persons: int, seed: int, states: str | Sequence[str] | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(persons_df, units_df, geo_df) in the canonical integer-coded schema (``tables.py``), all in memory.
    Meant for small tests (a few hundred thousand persons)."""
    state_list = parse_states(states)
    split = validate_request(persons, seed, state_list, ("parquet",))
    data = [generate_state(s, n, seed) for s, n in split.items()]
    return (
        pd.concat([d.persons() for d in data], ignore_index=True),
        pd.concat([d.units() for d in data], ignore_index=True),
        pd.concat([d.geo_units() for d in data], ignore_index=True),
    )


@dataclass
class Manifest:
    """What a generated dataset holds; ``manifest.json`` is written last, so its presence means complete."""

    path: Path
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> list[dict[str, Any]]:
        return list(self.data["files"])

    def state_counts(self, state: str) -> dict[str, Any]:
        return dict(self.data["states"][state])

    @classmethod
    def load(cls, out_dir: str | os.PathLike[str]) -> Manifest:
        p = Path(out_dir) / "manifest.json"
        return cls(p, json.loads(p.read_text(encoding="utf-8")))


def _chunk_counts(c: Chunk) -> dict[str, int]:
    hu = c.unit_rtype == 2
    return {
        "persons": c.n_persons,
        "household_persons": int((c.rtype == 3).sum()),
        "gq_persons": int((c.rtype == 5).sum()),
        "occupied_units": int((hu & (c.unit_final_pop > 0)).sum()),
        "vacant_units": int((hu & (c.unit_final_pop == 0)).sum()),
        "gq_units": int((~hu).sum()),
    }


def generate(
    out_dir: str | os.PathLike[str],
    persons: int,
    seed: int,
    states: str | Sequence[str] | None = None,
    formats: Iterable[str] = ("parquet",),
    chunk_persons: int = prm.CHUNK_PERSONS,
) -> Manifest:
    """Generate a synthetic census of ``persons`` persons over ``states`` (default: all 52) into ``out_dir``.

    Everything is validated before the first byte is written (``InputError`` otherwise). Files are written to
    a staging directory inside ``out_dir``, moved into place, and ``manifest.json`` is written last (atomic
    rename), so an interrupted run never leaves a dataset that looks complete."""
    fmts = tuple(dict.fromkeys(formats))
    state_list = parse_states(states)
    split = validate_request(persons, seed, state_list, fmts)
    if chunk_persons < 1000:
        raise InputError(f"chunk_persons must be >= 1000, got {chunk_persons}", column="chunk_persons")
    out = Path(out_dir)
    check_out_dir(out, fmts)
    check_disk(out, int(persons), fmts)
    out.mkdir(parents=True, exist_ok=True)
    staging = out / f".synth-staging-{uuid.uuid4().hex[:12]}"
    try:
        writers = make_writers(staging, fmts)
        per_state: dict[str, dict[str, Any]] = {}
        for st, n in split.items():
            counts = {
                k: 0
                for k in (
                    "persons",
                    "household_persons",
                    "gq_persons",
                    "occupied_units",
                    "vacant_units",
                    "gq_units",
                )
            }
            chunk_i = 0
            geo: StateGeography | None = None
            for ctx, c in iter_state_chunks(st, n, seed, chunk_persons):
                if geo is None:
                    geo = ctx.geo
                    for w in writers:
                        w.begin_state(geo)
                for w in writers:
                    w.write_chunk(c, geo, chunk_i)
                for k, v in _chunk_counts(c).items():
                    counts[k] += v
                chunk_i += 1
            if geo is None:  # a state with no tracts cannot happen (>= 1 tract per county), kept for safety
                geo = state_context(st, n, seed).geo
                for w in writers:
                    w.begin_state(geo)
            per_state[st] = {**counts, "chunks": chunk_i, "geography": geo.counts()}
        files = [r for w in writers for r in w.close()]
        # publish: move each format's tree into place, then the manifest
        for f in fmts:
            src = staging / FORMAT_ROOTS[f]
            if src.exists():
                os.replace(src, out / FORMAT_ROOTS[f])
        totals: dict[str, Any] = {}
        for sc in per_state.values():
            for k, v in sc.items():
                if isinstance(v, int):
                    totals[k] = totals.get(k, 0) + v
                elif isinstance(v, dict):
                    sub = totals.setdefault("geography", {})
                    for kk, vv in v.items():
                        sub[kk] = sub.get(kk, 0) + vv
        data = {
            "generator": "dasflow.synth",
            "generator_version": prm.GENERATOR_VERSION,
            "parameters": {
                "persons": int(persons),
                "seed": int(seed),
                "states": state_list,
                "formats": list(fmts),
                "chunk_persons": int(chunk_persons),
            },
            "reference_data": {
                "counties": "2020 county equivalents (Census FIPS)",
                "race_codes": "2020 Census race/ethnicity codes",
                "state_shares": "2020 census",
            },
            "totals": totals,
            "states": per_state,
            "files": [r.__dict__ for r in files],
        }
        tmp = out / ".manifest.json.tmp"
        tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        os.replace(tmp, out / "manifest.json")
        return Manifest(out / "manifest.json", data)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
