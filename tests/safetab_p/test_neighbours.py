"""ST14 / ST20 by neighbour enumeration: adding or removing one person changes at most s population-group
counts per (region type, level), each by exactly 1, and within each changed group exactly one Sex × Age
cell."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dasflow.products.safetab_p.iterations import stability_bound
from dasflow.products.safetab_p.product import SafeTabP
from dasflow.products.safetab_p.tabulate import merged
from tests.safetab_p.helpers import config, person, persons_table, public, real_iterations, toy_config_dict

BLOCKS = [("010010000010001", "22800", "0001"), ("010010000020001", "22800", "9999"),
          ("010020000010001", "99999", "0002"), ("020010000010001", "33300", "0002")]


def _random_people(rng: np.random.Generator, index, n: int) -> list[list[str]]:
    codes = index.codes
    rows = []
    for _ in range(n):
        k = int(rng.choice([1, 1, 2, 3, 8]))
        races = [str(c) for c in rng.choice(codes, size=k, replace=False)]
        qspan = str(rng.choice(codes))
        block = BLOCKS[int(rng.integers(len(BLOCKS)))][0]
        rows.append(person(block, races, qspan, age=int(rng.integers(0, 116)), sex=int(rng.integers(1, 3))))
    return rows


def _diff(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    a, b = merged(a), merged(b)
    m = a.merge(b, on=["GROUP", "CELL"], how="outer", suffixes=("_a", "_b")).fillna(0)
    m["D"] = m["COUNT_a"] - m["COUNT_b"]
    return m[m["D"] != 0]


@pytest.mark.parametrize("seed", range(4))
def test_st14_add_remove_one_person(seed: int):
    index = real_iterations()
    raw = toy_config_dict("zcdp")
    for k in list(raw):
        if k.startswith("privacy_budget_p_level") and not k.split("_")[-1].startswith("pr"):
            raw[k] = 1
    cfg = config(raw)
    pub = public(cfg, index, BLOCKS)
    rng = np.random.default_rng(seed)
    rows = _random_people(rng, index, 30)
    product = SafeTabP()
    base = product.prepare({"persons": persons_table(rows), "source": "p"}, pub)
    specs = product.plan(cfg, pub)
    s_of = {s.key.rsplit("/", 1)[0]: s.detail["stability"] for s in specs}
    worst = 0
    for i in range(0, 30, 3):  # remove person i; the neighbour with person i added back is the same pair
        nb = product.prepare({"persons": persons_table(rows[:i] + rows[i + 1:]), "source": "p"}, pub)
        for key, frame in base.items():
            if not key.startswith("counts/"):
                continue
            _, universe, rt, lv = key.split("/")
            d = _diff(frame, nb[key])
            assert (d["D"] == 1).all()                         # exactly +1, never more
            assert d["GROUP"].is_unique                         # one cell per group
            s = s_of[f"safetab-p/{universe}/{rt}/{lv}"]
            assert s == stability_bound(index.levels[int(lv)], cfg.max_race_codes)
            assert len(d) <= s
            worst = max(worst, len(d))
    assert worst >= 2
