"""Issue item 1: real state and county FIPS codes, synthetic tracts / block groups / blocks with realistic
fan-outs (full scale about 84 K tracts, 240 K block groups, 8 M blocks), heavy-tailed sizes, places, county
subdivisions and AIANNH areas (some crossing state lines)."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from dasflow import synth
from dasflow.synth.geography import aiannh_areas, build_state_geography, chunk_tract_ranges
from dasflow.synth.reference import cenrace_table, counties, race_codes, states

Frames = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def test_reference_lists() -> None:
    """52 state equivalents; 3,143 county equivalents in the 50 states + DC and 78 in PR (2020 vintage)."""
    st = states()
    assert len(st) == 52 and "72" in st and "11" in st and "03" not in st
    assert sum(s.pop2020 for k, s in st.items() if k != "72") == 331_449_281
    c = counties()
    assert set(c) == set(st)
    assert sum(len(v[0]) for k, v in c.items() if k != "72") == 3143
    assert len(c["72"][0]) == 78
    assert len(c["48"][0]) == 254 and len(c["11"][0]) == 1 and 63 in c["02"][0] and 261 not in c["02"][0]
    rc = race_codes()
    assert sum(p.size for p in rc.by_major) + rc.hispanic_origin.size == 1754
    mask_to_code, code_to_mask = cenrace_table()
    assert code_to_mask[1] == 1 and code_to_mask[6] == 32 and code_to_mask[7] == 3 and code_to_mask[63] == 63
    assert sorted(mask_to_code[1:]) == list(range(1, 64))


def test_every_county_has_geography() -> None:
    """At a small scale every real county still gets >= 1 tract and >= 1 block (GRF-C covers all counties)."""
    split = synth.apportion(60_000, synth.parse_states(None))
    n_counties = 0
    for st, n in split.items():
        geo = build_state_geography(st, n, 5)
        assert set(np.unique(geo.county_fips[geo.tract_county])) == set(geo.county_fips)
        assert geo.n_blocks >= geo.tract_code.size >= geo.county_fips.size
        n_counties += geo.county_fips.size
    assert n_counties == 3143 + 78


@pytest.mark.slow
def test_full_scale_fan_outs() -> None:
    """Full US scale (331 M persons, geography only): ~84 K tracts, ~240 K block groups, ~8 M blocks; heavy-
    tailed blocks with ~30 % empty; every TABBLK unique within its tract and led by its block-group digit."""
    tracts = bgs = blocks = 0
    for st, n in synth.apportion(331_449_281, [s for s in states() if s != "72"]).items():
        geo = build_state_geography(st, n, 1)
        c = geo.counts()
        tracts += c["tracts"]
        bgs += c["block_groups"]
        blocks += c["blocks"]
        if st == "06":
            key = geo.block_tract.astype(np.int64) * 10_000 + geo.block_code
            assert np.unique(key).size == geo.n_blocks
            assert ((geo.block_code // 1000) == geo.block_group).all()
            w = np.diff(np.concatenate(([0.0], geo.block_key - geo.block_tract)))
            w = np.where(w < 0, geo.block_key - geo.block_tract, w)  # first block of each tract
            assert 0.2 < (w == 0).mean() < 0.4
            pos = w[w > 0]
            assert np.quantile(pos, 0.99) > 10 * np.median(pos)  # heavy tail
    assert 0.9 * 84_000 < tracts < 1.1 * 84_000
    assert 0.85 * 240_000 < bgs < 1.15 * 240_000
    assert 0.85 * 8_000_000 < blocks < 1.15 * 8_000_000


def test_places_cousubs_aiannh(frames: Frames) -> None:
    """PLACEFP 99999 = none, several real-looking places; COUSUB on every unit; AIANNHCE 9999 = none."""
    _, _, geo = frames
    ri = geo[geo["TABBLKST"] == "44"]
    assert (ri["PLACEFP"] == 99999).any() and ri.loc[ri["PLACEFP"] != 99999, "PLACEFP"].nunique() >= 2
    assert ri["COUSUBFP"].between(1, 99_999).all()
    assert (geo["AIANNHCE"] == 9999).mean() > 0.9
    assert (geo.loc[geo["TABBLKST"] == "72", "AIANNHCE"] == 9999).all()


def test_aiannh_areas_cross_state_lines() -> None:
    """The national AIANNH table has areas in two or three states (same code in each), depends on the seed
    only, and at full scale the states' blocks do use shared codes."""
    t = aiannh_areas(1)
    assert t == aiannh_areas(1) and t != aiannh_areas(2)
    shared = set(t["04"]) & set(t["35"]) & set(t["49"])
    assert shared
    assert set(t["38"]) & set(t["46"])
    all_codes = [c for v in t.values() for c in v]
    assert all(0 < c < 9999 for c in all_codes)
    used = {}
    for st in ("04", "35", "49"):
        geo = build_state_geography(st, states()[st].pop2020, 1)
        used[st] = set(np.unique(geo.block_aiannh[geo.block_aiannh != 9999]).tolist())
    crossing = (used["04"] & used["35"]) | (used["04"] & used["49"]) | (used["35"] & used["49"])
    assert crossing


def test_tract_populations_bounded_for_streaming() -> None:
    """Chunks are runs of whole tracts under the chunk bound: a state never holds more than one chunk."""
    geo = build_state_geography("06", 39_538_223, 1)
    tp = geo.tract_hh_persons + geo.tract_gq_persons
    assert tp.max() < 100_000
    ranges = chunk_tract_ranges(geo, 2_000_000)
    assert ranges[0][0] == 0 and ranges[-1][1] == tp.size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    sizes = [int(tp[a:b].sum()) for a, b in ranges]
    assert max(sizes) <= 2_000_000 and sum(sizes) == 39_538_223
