"""Shared fixtures: one seeded synthetic dataset in every format, generated once per test session."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dasflow import synth

#: Rhode Island (5 counties), DC (1 county equivalent), Puerto Rico (78 municipios)
STATES = ("11", "44", "72")
PERSONS = 240_000
SEED = 20260423


@pytest.fixture(scope="session")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, synth.Manifest]:
    out = tmp_path_factory.mktemp("synth") / "ds"
    m = synth.generate(out, PERSONS, SEED, states=STATES, formats=synth.FORMATS, chunk_persons=60_000)
    return out, m


@pytest.fixture(scope="session")
def frames(dataset: tuple[Path, synth.Manifest]) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(persons, units, geo) read back from the Parquet datasets."""
    out, _ = dataset
    persons = pd.read_parquet(out / "parquet" / "persons")
    units = pd.read_parquet(out / "parquet" / "units")
    geo = pd.read_parquet(out / "parquet" / "geo")
    return persons, units, geo
