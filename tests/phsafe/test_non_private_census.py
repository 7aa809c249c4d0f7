"""``dasflow phsafe non-private`` in the Census's non-private format (issue 23): the Census's own end-to-end case
byte for byte; an independent transliteration of the Census rules (pandas merges and per-rule masks, not the
module's code) on synthetic US and PR inputs; the format rules one by one on hand-built households (non-empty
rows only, total/marginal cells counted from the records, the household count in all three PH1/PH5 denominator
cells, PH8_num = Σ FINAL_POP); and consistency with the private-layout ground truth on consistent data."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dasflow import synth
from dasflow.cli import main
from dasflow.products.phsafe import parse_config, run_non_private
from dasflow.products.phsafe.config import PHSafeConfig
from dasflow.products.phsafe.inputs import read_inputs
from dasflow.products.phsafe.nonprivate import census_non_private
from dasflow.products.phsafe.tables import OUTPUT_TABLES, data_cell_column
from tests.phsafe.builders import DATA, PR_CONFIG, US_CONFIG, Person, Unit, columns, config_with

E2E = DATA / "census_nonprivate_test1"
ITS = ["*", "A", "B", "C", "D", "E", "F", "G", "H", "I"]


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="|", dtype=str, keep_default_na=False)


def test_census_end_to_end_case_byte_for_byte(tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["phsafe", "non-private", str(E2E / "config.json"), str(E2E), str(out)]) == 0
    for table in OUTPUT_TABLES:
        expected = (E2E / "expected" / f"{table}.csv").read_text().rstrip("\n") + "\n"
        assert (out / f"{table}.csv").read_text() == expected, table


# ---- an independent oracle: the Census rules written as pandas joins and first-match rule lists -------------

def _first_match(df: pd.DataFrame, rules: list[tuple[pd.Series, list[int]]], default: list[int]) -> pd.DataFrame:
    """Rows (record index, CELL): each record gets the cell list of the first rule it satisfies."""
    taken = pd.Series(False, index=df.index)
    parts = []
    for cond, cells in [*rules, (pd.Series(True, index=df.index), default)]:
        hit = cond & ~taken
        taken |= hit
        for c in cells:
            parts.append(pd.DataFrame({"rec": df.index[hit], "CELL": c}))
    return pd.concat(parts, ignore_index=True)


def _iterations(df: pd.DataFrame, race: str, hisp: str) -> pd.DataFrame:
    r, h = df[race], df[hisp]
    letter = pd.Series("G", index=df.index)
    for code, it in zip(range(1, 7), "ABCDEF", strict=True):
        letter[r == code] = it
    parts = [pd.DataFrame({"rec": df.index, "ITERATION_CODE": "*"}),
             pd.DataFrame({"rec": df.index, "ITERATION_CODE": letter.to_numpy()}),
             pd.DataFrame({"rec": df.index[h == 2], "ITERATION_CODE": "H"}),
             pd.DataFrame({"rec": df.index[(r == 1) & (h == 1)], "ITERATION_CODE": "I"})]
    return pd.concat(parts, ignore_index=True)


def _oracle(p: dict[str, np.ndarray], u: dict[str, np.ndarray], g: dict[str, np.ndarray],
            states: list[str]) -> dict[str, pd.DataFrame]:
    P, U, G = (pd.DataFrame({k: np.asarray(v).astype(np.int64) for k, v in d.items()}) for d in (p, u, g))
    G = G[G.TABBLKST.isin([int(s) for s in states]) & ~G.RTYPE.isin([4, 5])]
    geo = pd.concat([pd.DataFrame({"MAFID": G.MAFID, "REGION_TYPE": "USA", "REGION_ID": "1"}),
                     pd.DataFrame({"MAFID": G.MAFID, "REGION_TYPE": "STATE",
                                   "REGION_ID": G.TABBLKST.map(lambda s: f"{s:02d}")})])
    ug = U.rename(columns={"RTYPE": "RTYPE_UNIT"}).merge(geo, on="MAFID").reset_index(drop=True)
    pg = P.rename(columns={"RTYPE": "RTYPE_PERSON"}).merge(
        U.rename(columns={"RTYPE": "RTYPE_UNIT"}), on="MAFID").merge(geo, on="MAFID").reset_index(drop=True)
    out: dict[str, pd.DataFrame] = {}

    def tab(name: str, df: pd.DataFrame, cells: pd.DataFrame, its: pd.DataFrame | None,
            weight: str | None = None) -> None:
        cell_col = data_cell_column(name)
        rows = cells.merge(its, on="rec") if its is not None else cells
        rows = rows.join(df[["REGION_ID", "REGION_TYPE", *([weight] if weight else [])]], on="rec")
        keys = ["REGION_ID", "REGION_TYPE", *(["ITERATION_CODE"] if its is not None else []), "CELL"]
        agg = rows.groupby(keys)[weight].sum() if weight else rows.groupby(keys).size()
        res = agg.rename("COUNT").reset_index().rename(columns={"CELL": cell_col})
        res[cell_col] = res[cell_col].astype(str)
        res["COUNT"] = res["COUNT"].astype(str)
        out[name] = res.sort_values([c for c in res.columns if c != "COUNT"]).reset_index(drop=True)

    def age(df: pd.DataFrame) -> pd.DataFrame:
        return _first_match(df, [(df.QAGE < 18, [2, 1])], [3, 1])

    t = pg[(pg.RTYPE_UNIT == 2) & (pg.HHT != 0)].reset_index(drop=True)
    tab("PH1_num", t, age(t), _iterations(t, "HHRACE", "HHSPAN"))
    t = ug[(ug.RTYPE_UNIT == 2) & (ug.HHT != 0)].reset_index(drop=True)
    tab("PH1_denom", t, _first_match(t, [], [1, 2, 3]), _iterations(t, "HHRACE", "HHSPAN"))
    t = pg[pg.RTYPE_PERSON == 3].reset_index(drop=True)
    m, c = t.HHT2.isin([1, 2]), t.HHT2.isin([3, 4])
    tab("PH2", t, _first_match(t, [(m & (t.CPLT == 1), [3, 2, 1]), (m & (t.CPLT == 2), [4, 2, 1]), (m, [2, 1]),
                                   (c & (t.CPLT == 3), [6, 5, 1]), (c & (t.CPLT == 4), [7, 5, 1]), (c, [5, 1]),
                                   (t.HHT2 == 9, [9, 8, 1]), (t.HHT2.isin([10, 11, 12]), [10, 8, 1]),
                                   (t.HHT2 == 5, [12, 11, 1]), (t.HHT2.isin([6, 7, 8]), [13, 11, 1])], [1]), None)
    t = pg[(pg.RTYPE_PERSON == 3) & (pg.QAGE < 18)].reset_index(drop=True)
    ch = t.RELSHIP.isin([25, 26, 27])
    tab("PH3", t, _first_match(t, [(t.RELSHIP.isin([20, 21, 22, 23, 24, 34, 35, 36]), [2, 1]),
                                   (ch & (t.HHT2 == 1), [4, 3, 1]), (ch & (t.HHT2 == 3), [5, 3, 1]),
                                   (ch & (t.HHT2 == 10), [6, 3, 1]), (ch & (t.HHT2 == 6), [7, 3, 1]), (ch, [3, 1]),
                                   (t.RELSHIP == 30, [9, 8, 1]),
                                   (t.RELSHIP.isin([28, 29, 30, 31, 32, 33]), [10, 8, 1])],
                               [1]), _iterations(t, "CENRACE", "CENHISP"))
    t = pg[pg.HHT.isin([1, 2, 3]) & pg.RELSHIP.isin([20, 21, 23, *range(25, 34)])].reset_index(drop=True)
    tab("PH4", t, age(t), _iterations(t, "HHRACE", "HHSPAN"))
    tab("PH5_num", t, age(t), _iterations(t, "HHRACE", "HHSPAN"))
    t = ug[ug.HHT.isin([1, 2, 3])].reset_index(drop=True)
    tab("PH5_denom", t, _first_match(t, [], [1, 2, 3]), _iterations(t, "HHRACE", "HHSPAN"))
    t = pg[pg.RELSHIP.isin([25, 26, 27]) & (pg.QAGE < 18)].reset_index(drop=True)
    rules = []
    for hht2, mid in ((1, 2), (3, 7), (10, 12), (6, 17)):
        for k, (lo, hi) in enumerate(((0, 3), (4, 5), (6, 11), (12, 17))):
            rules.append((t.HHT2.eq(hht2) & t.QAGE.between(lo, hi), [mid + 1 + k, mid, 1]))
    tab("PH6", t, _first_match(t, rules, [1]), None)
    t = pg[pg.RTYPE_PERSON == 3].reset_index(drop=True)
    tab("PH7", t, _first_match(t, [(t.TEN == 1, [2, 1]), (t.TEN == 2, [3, 1]), (t.TEN.isin([3, 4]), [4, 1])], []),
        _iterations(t, "HHRACE", "HHSPAN"))
    t = ug[(ug.RTYPE_UNIT == 2) & (ug.HHT != 0)].reset_index(drop=True)
    ph8 = _first_match(t, [(t.TEN.isin([1, 2]), [2, 1]), (t.TEN.isin([3, 4]), [3, 1])], [])
    tab("PH8_num", t, ph8, _iterations(t, "HHRACE", "HHSPAN"), weight="FINAL_POP")
    tab("PH8_denom", t, ph8, _iterations(t, "HHRACE", "HHSPAN"))
    return out


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.astype(str)
    return out.sort_values([c for c in out.columns if c != "COUNT"]).reset_index(drop=True)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("np")
    synth.generate(root, persons=6_000, seed=23, states=["11", "44", "72"], formats=("phsafe",))
    return root / "phsafe"


def _cfg(path: Path, states: list[str]) -> PHSafeConfig:
    raw = json.loads(path.read_text())
    raw["state_filter"] = states
    return parse_config(raw)


@pytest.mark.parametrize(("config", "states"), [(US_CONFIG, ["11", "44"]), (PR_CONFIG, ["72"])])
def test_synthetic_equals_an_independent_transliteration(synthetic: Path, config: Path, states: list[str]) -> None:
    inputs = read_inputs(synthetic)
    u = dict(inputs.units)
    rng = np.random.default_rng(5)  # FINAL_POP disagreeing with the person file on some households
    u["FINAL_POP"] = np.asarray(u["FINAL_POP"]) + (rng.random(len(u["FINAL_POP"])) < 0.1) * 3
    got = census_non_private(inputs.persons, u, inputs.geo, _cfg(config, states))
    want = _oracle(dict(inputs.persons), u, dict(inputs.geo), states)
    assert list(got) == list(OUTPUT_TABLES)
    for table in OUTPUT_TABLES:
        assert len(got[table]) > 0, table
        pd.testing.assert_frame_equal(_as_text(got[table]), want[table], check_dtype=False, obj=table)
        assert set(got[table].REGION_ID) == {"1", *states}  # PR runs keep the USA rows (Census preprocess_geo)
        assert (got[table].COUNT > 0).all()


def test_consistent_synthetic_matches_the_private_layout_truth(synthetic: Path) -> None:
    """On consistent data (FINAL_POP = persons, every record with a leaf) the Census leaf rows are the non-zero
    rows of the private-layout ground truth, cell 1 is the sum of the leaves, PH8_num's cells are PH7's."""
    inputs = read_inputs(synthetic)
    cfg = _cfg(US_CONFIG, ["11", "44"])
    census = census_non_private(inputs.persons, inputs.units, inputs.geo, cfg)
    truth = run_non_private(inputs.persons, inputs.units, inputs.geo, cfg)
    for table in ("PH1_num", "PH4", "PH7"):
        cell = data_cell_column(table)
        keys = ["REGION_ID", "REGION_TYPE", "ITERATION_CODE"]
        c, t = census[table], truth[table]
        leaves = c[c[cell] != 1].merge(t[t.COUNT > 0], on=[*keys, cell], how="outer", suffixes=("", "_t"))
        assert leaves.COUNT.eq(leaves.COUNT_t).all(), table
        tot = c[c[cell] == 1].set_index(keys).COUNT.sort_index()
        assert tot.eq(c[c[cell] != 1].groupby(keys).COUNT.sum().sort_index()).all(), table
    ph7, ph8 = census["PH7"].copy(), census["PH8_num"]
    ph7["PH8_NUM_DATA_CELL"] = ph7.PH7_DATA_CELL.map({1: 1, 2: 2, 3: 2, 4: 3})
    per = ph7.groupby(["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "PH8_NUM_DATA_CELL"]).COUNT.sum()
    # PH7 counts cell 1 once per person, and cells 2, 3 both map to owner 2: compare owner/renter/total
    per = per.where(per.index.get_level_values(3) != 1,
                    ph7[ph7.PH7_DATA_CELL == 1].set_index(
                        ["REGION_ID", "REGION_TYPE", "ITERATION_CODE", "PH8_NUM_DATA_CELL"]).COUNT)
    assert ph8.set_index(list(per.index.names)).COUNT.sort_index().eq(per.sort_index()).all()


def _frames(units: list[Unit], states: tuple[str, ...] = ("01", "02")) -> dict[str, pd.DataFrame]:
    p, u, g = columns(units)
    return census_non_private(p, u, g, parse_config(config_with(states=list(states))))


def test_format_rules_on_hand_built_households() -> None:
    units = [Unit([Person(40), Person(38, rel=21), Person(10, rel=25)], state="01"),  # married, CPLT 1
             Unit([Person(70, race=2, hisp=2)], state="02", ten=3, hht=4, hht2=9, cplt=5),  # male alone
             Unit([Person(50, race=7), Person(48, rel=21)], state="01", hht2=2, cplt=5)]  # married, CPLT 5
    f = _frames(units)
    ph2 = f["PH2"].set_index(["REGION_ID", "PH2_DATA_CELL"]).COUNT
    assert list(f["PH2"].columns) == ["REGION_ID", "REGION_TYPE", "PH2_DATA_CELL", "COUNT"]
    # married CPLT 5: in the marginal 2 and the total 1, in no leaf (3 = the CPLT-1 household's 3 persons)
    assert ph2[("01", 1)] == 5 and ph2[("01", 2)] == 5 and ph2[("01", 3)] == 3 and ("01", 4) not in ph2.index
    assert ph2[("02", 9)] == 1 and ph2[("02", 8)] == 1 and ph2[("1", 1)] == 6
    assert (f["PH2"].COUNT > 0).all() and len(f["PH2"]) == 3 + 3 + 5  # state 01: 1,2,3; 02: 1,8,9; USA: 1,2,3,8,9
    d = f["PH1_denom"]
    usa = d[(d.REGION_ID == "1") & (d.ITERATION_CODE == "*")]
    assert usa.PH1_DENOM_DATA_CELL.tolist() == [1, 2, 3] and usa.COUNT.tolist() == [3, 3, 3]
    assert set(d.ITERATION_CODE) == {"*", "A", "B", "G", "H", "I"}  # only non-empty iterations
    ph7 = f["PH7"]
    usa7 = ph7[(ph7.REGION_ID == "1") & (ph7.ITERATION_CODE == "*")].set_index("PH7_DATA_CELL").COUNT
    assert usa7.to_dict() == {1: 6, 2: 5, 4: 1}  # no zero row for cell 3


def test_ph8_num_sums_final_pop() -> None:
    units = [Unit([Person(40), Person(38, rel=21)], state="01", ten=2),
             Unit([Person(30)], state="01", ten=3, hht=4, hht2=9, cplt=5)]
    p, u, g = columns(units)
    u["FINAL_POP"] = np.array([5, 0], dtype=np.int32)  # disagrees with the person file (2 and 1 persons)
    f = census_non_private(p, u, g, parse_config(config_with(states=["01"])))
    num = f["PH8_num"]
    star = num[(num.REGION_ID == "01") & (num.ITERATION_CODE == "*")].set_index("PH8_NUM_DATA_CELL").COUNT
    assert star.to_dict() == {1: 5, 2: 5, 3: 0}  # renter group exists (one household) with Σ FINAL_POP = 0
    den = f["PH8_denom"]
    assert den[(den.REGION_ID == "01") & (den.ITERATION_CODE == "*")].COUNT.tolist() == [2, 1, 1]


def test_pr_run_and_duplicate_unit_mafid() -> None:
    """PR: STATE 72 and USA rows. A unit MAFID listed twice (possible without --validate) joins twice, as a
    relational join does."""
    units = [Unit([Person(40), Person(5, rel=25)], state="72", hht2=1, cplt=1),
             Unit([Person(33)], state="72", ten=3, hht=4, hht2=9, cplt=5)]
    p, u, g = columns(units, mafids=[100000001, 100000002])
    u = {k: np.concatenate([v, v[1:]]) for k, v in u.items()}  # unit 100000002 twice
    f = census_non_private(p, u, g, parse_config(json.loads(PR_CONFIG.read_text())))
    assert {(r, t) for r, t in zip(f["PH1_num"].REGION_ID, f["PH1_num"].REGION_TYPE, strict=True)} == {
        ("72", "STATE"), ("1", "USA")}
    ph8 = f["PH8_denom"]
    assert ph8[(ph8.REGION_ID == "72") & (ph8.ITERATION_CODE == "*")].COUNT.tolist() == [3, 1, 2]
    ph6 = f["PH6"].set_index(["REGION_ID", "PH6_DATA_CELL"]).COUNT
    assert ph6[("72", 4)] == 1 and ph6[("72", 2)] == 1 and ph6[("72", 1)] == 1  # age 5: 4-5 bin, married
