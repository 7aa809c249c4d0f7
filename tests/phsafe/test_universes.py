"""Universes, iteration mapping and cell maps on hand-built fixtures, one per edge (R4, R5, R6, R17)."""

from __future__ import annotations

import pandas as pd

from dasflow.products.phsafe import parse_config, run_non_private
from dasflow.products.phsafe.tables import data_cell_column
from tests.phsafe.builders import Person, Unit, columns, config_with

CFG = parse_config(config_with(states=["01", "02"]))


def truth(units: list[Unit], truncate: bool = False) -> dict[str, pd.DataFrame]:
    p, u, g = columns(units)
    return run_non_private(p, u, g, CFG, truncate=truncate)


def count(frames: dict[str, pd.DataFrame], table: str, cell: int, it: str = "*", region: str = "1") -> int:
    f = frames[table]
    sel = (f["REGION_ID"] == region) & (f[data_cell_column(table)] == cell)
    if "ITERATION_CODE" in f.columns:
        sel &= f["ITERATION_CODE"] == it
    assert int(sel.sum()) == 1, (table, cell, it, region)
    return int(f.loc[sel, "COUNT"].iloc[0])


def cells(frames: dict[str, pd.DataFrame], table: str, it: str = "*", region: str = "1") -> dict[int, int]:
    f = frames[table]
    sel = f["REGION_ID"] == region
    if "ITERATION_CODE" in f.columns:
        sel &= f["ITERATION_CODE"] == it
    return {int(c): int(n) for c, n in zip(f.loc[sel, data_cell_column(table)], f.loc[sel, "COUNT"],
                                           strict=True) if n}


def test_r6_age_17_18_splits_ph1_ph4_and_bounds_ph3_ph6() -> None:
    fr = truth([Unit([Person(45), Person(17, rel=25), Person(18, rel=25)], hht2=1)])
    assert cells(fr, "PH1_num") == {2: 1, 3: 2}
    assert cells(fr, "PH4") == {2: 1, 3: 2}
    assert cells(fr, "PH3") == {4: 1}  # only the 17-year-old own child, married-couple family
    assert cells(fr, "PH6") == {6: 1}  # married, age band 12-17


def test_r6_ph6_age_bands_3_4_5_6_11_12() -> None:
    kids = [Person(a, rel=25) for a in (3, 4, 5, 6, 11, 12)]
    fr = truth([Unit([Person(40), *kids], hht2=1)])
    assert cells(fr, "PH6") == {3: 1, 4: 2, 5: 2, 6: 1}
    fr = truth([Unit([Person(40), *kids], hht=3, hht2=6, cplt=5)])  # female householder family
    assert cells(fr, "PH6") == {18: 1, 19: 2, 20: 2, 21: 1}
    fr = truth([Unit([Person(40), Person(4, rel=27)], hht=2, hht2=10, cplt=5)])
    assert cells(fr, "PH6") == {14: 1}
    fr = truth([Unit([Person(40), Person(30, rel=22), Person(0, rel=26)], hht=2, hht2=3, cplt=3)])
    assert cells(fr, "PH6") == {8: 1}


def test_r6_tenure_4_is_renter() -> None:
    fr = truth([Unit([Person(50), Person(20, rel=34)], ten=4, hht=5, hht2=12, cplt=5),
                Unit([Person(50)], ten=3, hht=4, hht2=9, cplt=5),
                Unit([Person(50)], ten=1, hht=6, hht2=5, cplt=5),
                Unit([Person(50), Person(49, rel=21)], ten=2)])
    assert cells(fr, "PH7") == {2: 1, 3: 2, 4: 3}
    assert cells(fr, "PH8_denom") == {2: 2, 3: 2}
    assert cells(fr, "PH8_num") == {2: 3, 3: 3}


def test_r6_hht2_05_vs_06_and_ph2_couple_types() -> None:
    fr = truth([Unit([Person(70)], hht=6, hht2=5, cplt=5),                      # female alone -> 12
                Unit([Person(35), Person(5, rel=25)], hht=3, hht2=6, cplt=5),  # female with kids -> 13
                Unit([Person(35), Person(30, rel=21)], hht2=2, cplt=1),        # opposite-sex married -> 3
                Unit([Person(35), Person(30, rel=23)], hht2=2, cplt=2),        # same-sex married -> 4
                Unit([Person(35), Person(30, rel=22)], hht=5, hht2=4, cplt=3),  # opposite-sex cohabiting -> 6
                Unit([Person(35), Person(30, rel=24)], hht=5, hht2=4, cplt=4),  # same-sex cohabiting -> 7
                Unit([Person(60)], hht=4, hht2=9, cplt=5),                      # male alone -> 9
                Unit([Person(60), Person(61, rel=28)], hht=2, hht2=11, cplt=5)])  # male with others -> 10
    assert cells(fr, "PH2") == {12: 1, 13: 2, 3: 2, 4: 2, 6: 2, 7: 2, 9: 1, 10: 2}


def test_r6_ph3_relationship_cells() -> None:
    kids_married = [Person(10, rel=r) for r in (20, 21, 22, 23, 24, 34, 35, 36)]
    fr = truth([Unit([Person(40), *kids_married], hht2=1),
                Unit([Person(40), Person(1, rel=25), Person(2, rel=30), Person(3, rel=28), Person(4, rel=33),
                      Person(5, rel=29), Person(6, rel=31), Person(7, rel=32)], hht2=1),
                Unit([Person(40), Person(1, rel=26)], hht=5, hht2=3, cplt=3),
                Unit([Person(40), Person(1, rel=27)], hht=2, hht2=10, cplt=5),
                Unit([Person(40), Person(1, rel=25)], hht=3, hht2=6, cplt=5)])
    assert cells(fr, "PH3") == {2: 8, 4: 1, 9: 1, 10: 5, 5: 1, 6: 1, 7: 1}


def test_r6_ph4_family_universe() -> None:
    members = [Person(40), *(Person(30, rel=r) for r in (21, 22, 23, 24, 25, 30, 33, 34, 35, 36))]
    fr = truth([Unit(members, hht=1, hht2=2, cplt=1),
                Unit([Person(40), Person(39, rel=28)], hht=5, hht2=12, cplt=5)])  # nonfamily: excluded
    assert cells(fr, "PH4") == {3: 6}  # householder, 21, 23, 25, 30, 33
    assert cells(fr, "PH5_num") == {3: 6}
    assert cells(fr, "PH5_denom") == {1: 1}
    assert cells(fr, "PH1_denom") == {1: 2}


def test_r4_gq_vacant_and_structural_zeros_are_excluded() -> None:
    fr = truth([Unit([Person(40)]),
                Unit([Person(80, rel=37, rtype=5), Person(81, rel=38, rtype=5)], rtype=4, ten=0, hht=0,
                     hht2=0, cplt=0),
                Unit([Person(30)], ten=0, hht=0, hht2=0, cplt=0)])  # a person in a vacant unit
    assert cells(fr, "PH1_num") == {3: 1}
    assert cells(fr, "PH1_denom") == {1: 1}
    assert cells(fr, "PH7") == {2: 1}


def test_r4_state_filter_drops_other_states_and_usa_aggregates_filtered() -> None:
    fr = truth([Unit([Person(40)], state="01"), Unit([Person(40), Person(9, rel=25)], state="02"),
                Unit([Person(40)], state="06")])
    assert count(fr, "PH1_num", 3) == 2 and count(fr, "PH1_num", 2) == 1
    assert count(fr, "PH1_num", 3, region="01") == 1 and count(fr, "PH1_num", 2, region="02") == 1
    assert set(fr["PH1_num"]["REGION_ID"]) == {"1", "01", "02"}  # domain from config, not data


def test_r5_iterations_householder_vs_person() -> None:
    # householder Asian alone non-Hispanic; members of other races
    fr = truth([Unit([Person(40, race=4, hisp=1), Person(10, race=1, hisp=2, rel=25),
                      Person(8, race=15, hisp=1, rel=25)], hht2=1)])
    assert cells(fr, "PH7", it="D") == {2: 3}
    for it in "ABCEFG":
        assert cells(fr, "PH7", it=it) == {}
    assert cells(fr, "PH7", it="H") == {} and cells(fr, "PH7", it="I") == {}  # non-exhaustive H-I
    assert cells(fr, "PH7", it="*") == {2: 3}
    # PH3 iterates by the person: the 10-year-old is A and H, the 8-year-old is G and neither H nor I
    assert cells(fr, "PH3", it="A") == {4: 1} and cells(fr, "PH3", it="G") == {4: 1}
    assert cells(fr, "PH3", it="H") == {4: 1} and cells(fr, "PH3", it="I") == {}
    assert cells(fr, "PH3", it="D") == {}


def test_r5_hi_mapping() -> None:
    fr = truth([Unit([Person(40, race=1, hisp=1)]), Unit([Person(40, race=1, hisp=2)]),
                Unit([Person(40, race=2, hisp=1)]), Unit([Person(40, race=63, hisp=2)])])
    assert cells(fr, "PH1_denom", it="I") == {1: 1}
    assert cells(fr, "PH1_denom", it="H") == {1: 2}
    assert cells(fr, "PH1_denom", it="A") == {1: 2}
    assert cells(fr, "PH1_denom", it="B") == {1: 1} and cells(fr, "PH1_denom", it="G") == {1: 1}
    assert cells(fr, "PH1_denom") == {1: 4}


def test_r17_ground_truth_has_no_truncation_but_truncated_variant_caps() -> None:
    big = Unit([Person(40), *(Person(20 + i, rel=25) for i in range(14))], hht2=2)
    assert count(truth([big]), "PH7", 2) == 15
    assert count(truth([big], truncate=True), "PH7", 2) == 10  # tau = 10
    kids = Unit([Person(40), *(Person(i, rel=25) for i in range(9))], hht2=1)
    assert sum(cells(truth([kids], truncate=True), "PH6").values()) == 6  # tau = 6 on own children < 18
    assert sum(cells(truth([kids]), "PH6").values()) == 9
