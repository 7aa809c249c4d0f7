"""Issue item 4: every product's input format is written and reads back (pandas / pyarrow) consistently with
the canonical data; the manifest describes the files exactly."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from dasflow import synth

from .conftest import PERSONS, STATES

TOY = Path(__file__).resolve().parents[1] / "data" / "safetab_p_toy"  # copy of shared/data/safetab-p/toy
Frames = tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]
DS = tuple[Path, synth.Manifest]


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)


def _header(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        return f.readline().rstrip("\n").split("|")


def test_manifest_counts_and_hashes(dataset: DS, frames: Frames) -> None:
    """Counts per state and geolevel, parameters, seed, version; every listed file exists with its
    hash/rows."""
    out, m = dataset
    persons, units, _ = frames
    on_disk = json.loads((out / "manifest.json").read_text())
    assert on_disk == m.data
    assert m.data["generator_version"] == synth.GENERATOR_VERSION
    assert m.data["parameters"]["persons"] == PERSONS and m.data["parameters"]["states"] == list(STATES)
    assert m.data["totals"]["persons"] == PERSONS == len(persons)
    for st in STATES:
        sc = m.state_counts(st)
        assert sc["persons"] == int((persons["TABBLKST"] == st).sum())
        u = units[units["TABBLKST"] == st]
        assert sc["gq_units"] == int((u["RTYPE"] == 4).sum())
        assert set(sc["geography"]) >= {
            "counties",
            "tracts",
            "block_groups",
            "blocks",
            "places",
            "aiannh_areas",
        }
    assert m.state_counts("72")["geography"]["counties"] == 78
    for f in m.files:
        p = out / f["path"]
        assert p.stat().st_size == f["bytes"]
        assert hashlib.sha256(p.read_bytes()).hexdigest() == f["sha256"]
    assert not list(out.glob(".synth-staging-*"))


def test_parquet_partitioned_by_state(dataset: DS, frames: Frames) -> None:
    out, _ = dataset
    persons, _, _ = frames
    for st in STATES:
        t = pq.read_table(out / "parquet" / "persons" / st)
        assert t.num_rows == int((persons["TABBLKST"] == st).sum())
        assert set(t.column("TABBLKST").to_pylist()) == {st}
    grfc = pq.read_table(out / "parquet" / "grfc").to_pandas()
    assert len(grfc) == sum(sc["geography"]["blocks"] for sc in dataset[1].data["states"].values())


def test_phsafe_files(dataset: DS, frames: Frames) -> None:
    """persons.csv / units.csv / geo.csv: exact column order of phsafe.md §1.5, padded codes, same content."""
    out, _ = dataset
    persons, units, geo = frames
    d = out / "phsafe"
    assert _header(d / "persons.csv") == ["RTYPE", "MAFID", "QAGE", "CENHISP", "CENRACE", "RELSHIP"]
    assert _header(d / "units.csv") == [
        "RTYPE",
        "MAFID",
        "FINAL_POP",
        "NPF",
        "HHSPAN",
        "HHRACE",
        "TEN",
        "HHT",
        "HHT2",
        "CPLT",
    ]
    assert _header(d / "geo.csv") == [
        "RTYPE",
        "MAFID",
        "TABBLKST",
        "TABBLKCOU",
        "TABTRACTCE",
        "TABBLK",
        "TABBLKGRPCE",
        "REGIONCE",
        "DIVISIONCE",
        "PLACEFP",
        "AIANNHCE",
    ]
    p = _read(d / "persons.csv")
    u = _read(d / "units.csv")
    g = _read(d / "geo.csv")
    assert len(p) == len(persons) and len(u) == len(units) and len(g) == len(geo)
    assert p["RTYPE"].isin(["3", "5"]).all() and u["RTYPE"].isin(["2", "4"]).all()
    assert (p["CENRACE"].str.len() == 2).all() and (p["RELSHIP"].str.len() == 2).all()
    assert (u["HHRACE"].str.len() == 2).all() and (u["HHT2"].str.len() == 2).all()
    assert u["TEN"].isin(list("01234")).all()
    for col, w in (
        ("TABBLKST", 2),
        ("TABBLKCOU", 3),
        ("TABTRACTCE", 6),
        ("TABBLK", 4),
        ("PLACEFP", 5),
        ("AIANNHCE", 4),
        ("TABBLKGRPCE", 1),
    ):
        assert (g[col].str.len() == w).all(), col
    pu = units.set_index("MAFID")
    uu = u.assign(MAFID=u["MAFID"].astype(np.int64)).set_index("MAFID").loc[pu.index]
    for col in ("FINAL_POP", "NPF", "HHSPAN", "HHRACE", "TEN", "HHT", "HHT2", "CPLT"):
        assert (uu[col].astype(int).to_numpy() == pu[col].to_numpy()).all(), col
    assert (p["MAFID"].astype(np.int64).to_numpy() == persons["MAFID"].to_numpy()).all()
    assert (p["QAGE"].astype(int).to_numpy() == persons["QAGE"].to_numpy()).all()
    gg = geo.set_index("MAFID")
    g2 = g.assign(MAFID=g["MAFID"].astype(np.int64)).set_index("MAFID").loc[gg.index]
    assert (g2["TABTRACTCE"].astype(int).to_numpy() == gg["TABTRACTCE"].to_numpy()).all()
    assert (g2["PLACEFP"].astype(int).to_numpy() == gg["PLACEFP"].to_numpy()).all()


def test_safetab_p_files(dataset: DS, frames: Frames) -> None:
    """person-records.txt and GRF-C.txt in the layout of the SafeTab-P toy inputs; every person's block is in
    GRF-C; QRACE codes are 4 digits then Null."""
    out, _ = dataset
    persons, _, _ = frames
    d = out / "safetab_p"
    assert _header(d / "person-records.txt") == _header(TOY / "person-records.txt")
    assert _header(d / "GRF-C.txt")[:6] == _header(TOY / "GRF-C.txt")
    assert _header(d / "GRF-C.txt")[6:] == ["TABBLKGRPCE", "COUSUBFP"]
    pr = _read(d / "person-records.txt")
    grf = _read(d / "GRF-C.txt")
    assert len(pr) == len(persons)
    assert (pr["QAGE"].str.len() == 3).all() and pr["QSEX"].isin(["1", "2"]).all()
    assert pr["HOUSEHOLDER"].isin(["True", "False"]).all()
    assert (pr["HOUSEHOLDER"] == "True").sum() == int(persons["HOUSEHOLDER"].sum())
    q = pr[[f"QRACE{j}" for j in range(1, 9)]]
    assert (q["QRACE1"] != "Null").all()
    assert q.apply(lambda s: s.str.fullmatch(r"\d{4}|Null")).all().all()
    assert (pr["QSPAN"].str.len() == 4).all()
    key = ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"]
    assert not grf.duplicated(key).any()
    blocks = set(map(tuple, grf[key].to_numpy()))
    assert set(map(tuple, pr[key].drop_duplicates().to_numpy())) <= blocks
    assert (grf["PLACEFP"] == "99999").any() and (grf["PLACEFP"] != "99999").any()
    assert (grf["AIANNHCE"] == "9999").any()


def test_topdown_and_groupsize(dataset: DS, frames: Frames) -> None:
    """TopDown persons carry the PL 94-171 attributes by block; group-size units carry every unit's size."""
    out, _ = dataset
    persons, units, geo = frames
    td = pq.read_table(out / "topdown" / "persons").to_pandas()
    assert len(td) == len(persons)
    assert td["HHGQ"].between(0, 7).all() and td["VOTINGAGE"].isin([0, 1]).all()
    assert td["HISPANIC"].isin([0, 1]).all() and td["CENRACE"].between(0, 62).all()
    assert int((td["HHGQ"] > 0).sum()) == int((persons["RTYPE"] == 5).sum())
    assert int(td["VOTINGAGE"].sum()) == int((persons["QAGE"] >= 18).sum())
    tu = pq.read_table(out / "topdown" / "units").to_pandas()
    assert len(tu) == len(units) and int(tu["OCCUPIED"].sum()) == int((units["FINAL_POP"] > 0).sum())
    gs = pq.read_table(out / "groupsize" / "units").to_pandas()
    assert len(gs) == len(units) and int(gs["SIZE"].sum()) == len(persons)
    m = gs.set_index("MAFID").loc[geo["MAFID"]]
    assert (m["TABTRACTCE"].to_numpy() == geo["TABTRACTCE"].to_numpy()).all()


def test_topdown_public_inputs(dataset: DS, frames: Frames) -> None:
    """The public files a TopDown release reads: the GRF-C (as SafeTab-P's), block facts counted from every unit
    (vacant housing units included) and the total and state population invariants."""
    from dasflow.products.topdown.invariants import build_block_facts, geoids_of

    out, _ = dataset
    persons, _, _ = frames
    public = out / "topdown" / "public"
    grfc = _read(public / "GRF-C.txt")
    assert grfc.equals(_read(out / "safetab_p" / "GRF-C.txt"))
    facts = _read(public / "block_facts.csv")
    assert _header(public / "block_facts.csv") == ["GEOID", "HU", *(f"GQ{t}" for t in range(1, 8))]
    units = pq.read_table(out / "topdown" / "units").to_pandas()
    expected = build_block_facts(units, geoids_of(grfc, "GRF-C.txt"))
    assert facts.equals(expected.astype(str))
    assert int(facts["HU"].astype(int).sum()) == int((units["HHGQ"] == 0).sum())
    inv = json.loads((public / "invariants.json").read_text())
    by_state = persons["TABBLKST"].value_counts()
    assert inv == {"total": len(persons), "state": {s: int(by_state[s]) for s in sorted(by_state.index)}}


def test_zfill_is_the_zero_padded_text_of_each_value() -> None:
    """The census text columns' lookup (tables of power-of-two sizes, cached across states) gives
    ``f"{v:0{width}d}"`` per value (``null_label`` for 0), for values up to and beyond the table range."""
    gen = np.random.default_rng(3)
    for width, top, null_label in ((1, 10, None), (2, 63, None), (3, 1025, None), (4, 9999, "Null"),
                                   (5, 99_999, None), (6, 131_072, None), (6, 900_000, None), (4, 1, None)):
        values = np.append(gen.integers(0, top, 5000), [0, top - 1])
        got = synth.tables.zfill(values, width, null_label).to_pylist()
        want = [null_label if null_label is not None and v == 0 else f"{v:0{width}d}" for v in values.tolist()]
        assert got == want
