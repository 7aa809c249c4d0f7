"""Synthetic CEF-like census at any scale (DESIGN.md §5): persons, housing units, group quarters and a synthetic
tabulation geography on the real state and county FIPS codes, with writers for every product's input format.

Public API::

    from dasflow import synth
    m = synth.generate(out_dir, persons=1_000_000, seed=7, states=["06", "72"],
                       formats=("parquet", "phsafe", "safetab_p", "topdown", "groupsize"))   # -> Manifest
    persons_df, units_df, geo_df = synth.generate_frames(20_000, seed=7, states="11,44")      # in memory
    sd = synth.generate_state("44", 50_000, seed=7)   # StateData: .geo, .chunks, .persons(), .units(), .geo_units()
    for ctx, chunk in synth.iter_state_chunks("06", 5_000_000, seed=7): ...                   # streaming

Synthetic data is not privacy noise: numpy generators seeded by SHA-256(seed, state, ...) (``seeding.py``).
See ``docs/synth.md`` for the model, its targets and the file layouts.
"""

from dasflow.synth.dataset import (
    CLI_FORMATS,
    FORMATS,
    Manifest,
    StateData,
    apportion,
    estimate_bytes,
    generate,
    generate_frames,
    generate_state,
    iter_state_chunks,
    mafid_range,
    parse_states,
    state_context,
)
from dasflow.synth.geography import NO_AIANNH, NO_PLACE, StateGeography
from dasflow.synth.params import GENERATOR_VERSION
from dasflow.synth.population import Chunk

__all__ = [
    "CLI_FORMATS",
    "FORMATS",
    "GENERATOR_VERSION",
    "NO_AIANNH",
    "NO_PLACE",
    "Chunk",
    "Manifest",
    "StateData",
    "StateGeography",
    "apportion",
    "estimate_bytes",
    "generate",
    "generate_frames",
    "generate_state",
    "iter_state_chunks",
    "mafid_range",
    "parse_states",
    "state_context",
]
