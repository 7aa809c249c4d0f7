"""Structural requirements of the synthetic CEF (issue items 2-3): referential integrity, householders,
relationship / household-type coherence, CENRACE vs detailed race codes, FINAL_POP, GQ persons."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dasflow.synth.reference import NOT_HISPANIC_QSPAN, cenrace_table, race_codes

Frames = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]


def test_referential_integrity(frames: Frames) -> None:
    """Every person's MAFID is a unit; geo covers every unit exactly once; MAFIDs in the CEF domain."""
    persons, units, geo = frames
    assert units["MAFID"].is_unique
    assert geo["MAFID"].is_unique
    assert set(persons["MAFID"]) <= set(units["MAFID"])
    assert set(geo["MAFID"]) == set(units["MAFID"])
    assert units["MAFID"].between(100_000_001, 899_999_999).all()
    g = geo.set_index("MAFID").loc[units["MAFID"]]
    assert (g["RTYPE"].to_numpy() == units["RTYPE"].to_numpy()).all()
    u = units.set_index("MAFID")
    # persons' state = their unit's state
    assert (u.loc[persons["MAFID"], "TABBLKST"].to_numpy() == persons["TABBLKST"].to_numpy()).all()


def test_one_householder_per_occupied_unit(frames: Frames) -> None:
    persons, units, _ = frames
    hh = persons[persons["RELSHIP"] == 20]
    assert hh["HOUSEHOLDER"].all()
    assert not persons.loc[persons["RELSHIP"] != 20, "HOUSEHOLDER"].any()
    counts = hh.groupby("MAFID").size()
    occupied = units[(units["RTYPE"] == 2) & (units["FINAL_POP"] > 0)]["MAFID"]
    assert counts.max() == 1
    assert set(counts.index) == set(occupied)


def test_final_pop_and_gq(frames: Frames) -> None:
    """FINAL_POP = persons in the unit; GQ persons (RTYPE 5, RELSHIP 37/38) only in GQ units (RTYPE 4); GQ
    facilities are never empty; RELSHIP 37 iff an institutional GQ type (HHGQ 1-4)."""
    persons, units, _ = frames
    n = persons.groupby("MAFID").size()
    fp = units.set_index("MAFID")["FINAL_POP"]
    assert (n.reindex(fp.index, fill_value=0) == fp).all()
    u = units.set_index("MAFID")
    p_rtype_unit = u.loc[persons["MAFID"], "RTYPE"].to_numpy()
    gq_person = persons["RELSHIP"].isin([37, 38]).to_numpy()
    assert ((persons["RTYPE"].to_numpy() == 5) == gq_person).all()
    assert (p_rtype_unit[gq_person] == 4).all()
    assert (p_rtype_unit[~gq_person] == 2).all()
    gq = units[units["RTYPE"] == 4]
    assert (gq["FINAL_POP"] >= 1).all()
    assert gq["HHGQ"].between(1, 7).all() and (units.loc[units["RTYPE"] == 2, "HHGQ"] == 0).all()
    hhgq = u.loc[persons["MAFID"], "HHGQ"].to_numpy()
    assert ((persons["RELSHIP"].to_numpy() == 37) == (gq_person & (hhgq <= 4))).all()
    assert (gq["GQTYPE"] // 100).isin([1, 2, 3, 4, 5, 6, 7, 8, 9]).all()


def _household_truth(persons: pd.DataFrame) -> pd.DataFrame:
    """HHT/HHT2/CPLT/NPF recomputed from persons with the Census definitions (independent of the
    generator)."""
    p = persons[persons["RTYPE"] == 3]
    rel = p["RELSHIP"]
    g = p.assign(
        relative=rel.isin([21, 23, 25, 26, 27, 28, 29, 30, 31, 32, 33]),
        spouse=rel.isin([21, 23]),
        partner=rel.isin([22, 24]),
        own_kid=rel.isin([25, 26, 27]) & (p["QAGE"] < 18),
        male_hh=(rel == 20) & (p["QSEX"] == 1),
    ).groupby("MAFID")
    t = pd.DataFrame(
        {
            "size": g.size(),
            "nrel": g["relative"].sum(),
            "spouse": g["spouse"].any(),
            "partner": g["partner"].any(),
            "own_kid": g["own_kid"].any(),
            "male": g["male_hh"].any(),
            "c21": g["RELSHIP"].apply(lambda s: (s == 21).any()),
            "c23": g["RELSHIP"].apply(lambda s: (s == 23).any()),
            "c22": g["RELSHIP"].apply(lambda s: (s == 22).any()),
            "c24": g["RELSHIP"].apply(lambda s: (s == 24).any()),
        }
    )
    alone = t["size"] == 1
    fam = t["nrel"] > 0
    m = t["male"]
    t["HHT"] = np.select([alone & m, alone, t["spouse"], fam & m, fam, m], [4, 6, 1, 2, 3, 5], 7)
    t["HHT2"] = np.select(
        [
            t["spouse"] & t["own_kid"],
            t["spouse"],
            t["partner"] & t["own_kid"],
            t["partner"],
            ~m & alone,
            ~m & t["own_kid"],
            ~m & fam,
            ~m,
            alone,
            t["own_kid"],
            fam,
        ],
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
        12,
    )
    t["CPLT"] = np.select([t["c21"], t["c23"], t["c22"], t["c24"]], [1, 2, 3, 4], 5)
    t["NPF"] = np.where(fam, t["nrel"] + 1, 0)
    return t


def test_household_type_coherence(frames: Frames) -> None:
    """HHT, HHT2, CPLT, NPF agree with the unit's persons; at most one spouse/partner; NIU codes for vacant/GQ;
    TEN 1-4 for occupied units (code 4 occurs), 0 otherwise; HHRACE/HHSPAN = the householder's."""
    persons, units, _ = frames
    small = persons[persons["TABBLKST"] == "11"]
    truth = _household_truth(small)
    u = units.set_index("MAFID").loc[truth.index]
    for col in ("HHT", "HHT2", "CPLT", "NPF"):
        assert (u[col].to_numpy() == truth[col].to_numpy()).all(), col
    per = small[small["RELSHIP"].isin([21, 22, 23, 24])].groupby("MAFID").size()
    assert per.max() == 1
    occ = (units["RTYPE"] == 2) & (units["FINAL_POP"] > 0)
    niu = units[~occ]
    for col in ("TEN", "HHT", "HHT2", "CPLT", "NPF", "HHRACE", "HHSPAN"):
        assert (niu[col] == 0).all(), col
    assert units.loc[occ, "TEN"].between(1, 4).all()
    assert (units.loc[occ, "TEN"] == 4).any()
    assert units.loc[occ, "HHSPAN"].isin([1, 2]).all() and units.loc[occ, "HHRACE"].between(1, 63).all()
    assert not units["NPF"].isin([1]).any() and units["NPF"].max() <= 97
    hh = persons[persons["RELSHIP"] == 20].set_index("MAFID")
    uo = units[occ].set_index("MAFID")
    assert (uo["HHRACE"] == hh.loc[uo.index, "CENRACE"]).all()
    assert (uo["HHSPAN"] == hh.loc[uo.index, "CENHISP"]).all()
    # spouse/partner sex: 21/22 opposite sex, 23/24 same sex
    hsex = hh["QSEX"]
    part = persons[persons["RELSHIP"].isin([21, 22, 23, 24])]
    same = part["QSEX"].to_numpy() == hsex.loc[part["MAFID"]].to_numpy()
    assert (same == part["RELSHIP"].isin([23, 24]).to_numpy()).all()


def test_cenrace_matches_detailed_codes(frames: Frames) -> None:
    """CENRACE's major races = the major races of QRACE1..8; codes are real 2020 codes; nulls only after the
    last code; CENHISP 2 iff QSPAN is a Hispanic-origin (2xxx) code, 9950 otherwise."""
    persons, _, _ = frames
    rc = race_codes()
    major = np.zeros(10_000, dtype=np.int64)
    for i, pool in enumerate(rc.by_major):
        major[pool] = 1 << i
    major[rc.hispanic_origin] = 1 << 5
    q = np.stack([persons[f"QRACE{j}"].fillna(0).to_numpy().astype(np.int64) for j in range(1, 9)])
    assert (q[0] > 0).all()
    present = q > 0
    assert not (present[1:] & ~present[:-1]).any(), "a code after a Null"
    valid = np.zeros(10_000, dtype=bool)
    valid[np.concatenate((*rc.by_major, rc.hispanic_origin))] = True
    assert valid[q[present]].all()
    mask = np.bitwise_or.reduce(np.where(present, major[q], 0), axis=0)
    mask_to_code, _ = cenrace_table()
    assert (mask_to_code[mask] == persons["CENRACE"].to_numpy()).all()
    qspan = persons["QSPAN"].to_numpy()
    hisp = persons["CENHISP"].to_numpy() == 2
    assert ((qspan >= 2000) & (qspan <= 2999) == hisp).all()
    assert (qspan[~hisp] == NOT_HISPANIC_QSPAN).all()


def test_domains(frames: Frames) -> None:
    """Value domains of phsafe.md §1.5."""
    persons, units, geo = frames
    assert persons["QAGE"].between(0, 115).all()
    assert persons["QSEX"].isin([1, 2]).all()
    assert persons["RELSHIP"].between(20, 38).all()
    assert persons["CENRACE"].between(1, 63).all()
    assert units["FINAL_POP"].between(0, 99_999).all()
    assert units["HHT2"].between(0, 12).all() and units["CPLT"].between(0, 5).all()
    assert geo["TABBLK"].between(1000, 9999).all()
    assert ((geo["TABBLK"] // 1000) == geo["TABBLKGRPCE"]).all()
