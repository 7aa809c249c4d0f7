"""Issue 11 item 1: the GX suites of every input — PHSafe (persons, units, geo), SafeTab-P (person records,
GRF-C, the four iteration files), group sizes, TopDown — accept the valid inputs and report per-state counts,
and the first failure names file, row and column (phases 1–3)."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from dasflow.registry import get_plugin
from dasflow.validation import run_product_suite
from tests.validation.helpers import CONFIG_FILES, INPUTS, corpus_store

F = Fraction


def _inputs(tmp: Path, product: str) -> tuple[Any, Any, Any]:
    from tests.validation.helpers import _config_text

    store = corpus_store(tmp / "store")
    a = get_plugin(product)
    cfg = a.load_config(_config_text(CONFIG_FILES[product]), "US")
    return a.confidential_inputs(store, INPUTS, cfg), a.public_inputs(store, INPUTS, cfg), cfg


@pytest.mark.parametrize("product", ["phsafe", "safetab-p", "groupsize"])
def test_valid_inputs_pass_every_suite(tmp_path: Path, product: str) -> None:
    conf, pub, cfg = _inputs(tmp_path, product)
    r = run_product_suite(get_plugin(product), conf, pub, cfg)
    assert r.success, r.error
    assert r.summary["expectations"]["failed"] == 0
    suites = {row.suite for row in r.rows}
    expected = {"phsafe": {"phsafe.persons", "phsafe.units", "phsafe.geo", "phsafe.cross_file"},
                "safetab-p": {"safetab_p.persons", "safetab_p.grfc", "safetab_p.race-and-ethnicity-codes",
                              "safetab_p.race-characteristic-iterations",
                              "safetab_p.ethnicity-characteristic-iterations",
                              "safetab_p.race-and-ethnicity-code-to-iteration", "safetab-p.cross_file"},
                "groupsize": {"groupsize.households", "groupsize.cross_file"}}[product]
    assert suites == expected
    per_state = r.summary.get("persons_per_state") or r.summary.get("households_per_state")
    assert per_state == {"10": sum(per_state.values())} and sum(per_state.values()) > 0
    assert all(f["violations"] == 0 for f in r.summary["cross_file"])
    assert "PASSED" in r.html


def test_phase3_failures_are_counted_and_located(tmp_path: Path) -> None:
    """Two orphan persons: the facts count both, the error points at the first (row, column)."""
    conf, pub, cfg = _inputs(tmp_path, "phsafe")
    persons = dict(conf["persons"])
    mafid = persons["MAFID"].copy()
    mafid[[4, 9]] = 899_999_999
    persons["MAFID"] = mafid
    r = run_product_suite(get_plugin("phsafe"), {**conf, "persons": persons}, pub, cfg)
    assert not r.success and r.error is not None
    assert (r.error.file, r.error.row, r.error.column) == ("persons.csv", 6, "MAFID")
    fact = next(f for f in r.summary["cross_file"] if f["rule"] == "person MAFID in units")
    assert (fact["violations"], fact["first_row"]) == (2, 6)
    assert r.summary["persons_per_state"]["??"] == 2  # orphans have no state partition
    assert "FAILED" in r.html and "person MAFID in units" in r.html


def test_gx_domain_failure_is_located_in_the_full_column(tmp_path: Path) -> None:
    """A value that only GX's domain suite rejects (a household SIZE of 0 that bypassed the plugin's filter)
    is located at its first row in the full data."""
    conf, pub, cfg = _inputs(tmp_path, "groupsize")
    hh = conf["households"].copy()
    hh.loc[6, "STATE"] = "99"
    r = run_product_suite(get_plugin("groupsize"), {**conf, "households": hh}, pub, cfg)
    assert not r.success and r.error is not None
    assert (r.error.row, r.error.column) == (8, "COUNTY")  # the product's own check: (99, county) not in tree
    failed = {(row.suite, row.column) for row in r.rows if not row.success}
    assert ("groupsize.households", "STATE") in failed  # and GX's domain suite saw the bad FIPS too


def _topdown_setup() -> tuple[Any, pd.DataFrame, pd.DataFrame]:
    from dasflow.products.topdown.product import TopDownConfig
    from dasflow.products.topdown.spine import preset
    from dasflow.products.topdown.strategy import LevelStrategy, QueryGroup, Schema, make_strategy

    gen = np.random.default_rng(2)
    geoids = [f"01{c:03d}{t:06d}1{b:03d}" for c in (1, 3) for t in (100, 101) for b in range(4)]
    blocks = pd.DataFrame({"GEOID": geoids, "AIANNHCE": "9999", "PLACEFP": "99999", "COUSUBFP": "10000",
                           "GQ_TYPES": "0000000"})
    schema = Schema((("R", 3), ("H", 2)))
    beta = [F(1, 6)] * 6
    sc = preset("pl94_persons", beta, 3)
    level = LevelStrategy((QueryGroup("total", (), F(1, 2)), QueryGroup("detailed", ("R", "H"), F(1, 2))))
    cfg = TopDownConfig(spine=sc, strategy=make_strategy(sc.levels, beta, F(1, 2), schema=schema, per_level=level))
    persons = pd.DataFrame({"GEOID": gen.choice(geoids, 500), "R": gen.integers(0, 3, 500),
                            "H": gen.integers(0, 2, 500)})
    return cfg, blocks, persons


def test_topdown_persons_suite() -> None:
    cfg, blocks, persons = _topdown_setup()
    topdown = get_plugin("topdown")
    r = run_product_suite(topdown, {"persons": persons, "persons_source": "cef.csv"}, {"blocks": blocks}, cfg)
    assert r.success, r.error
    assert r.summary["persons_per_state"] == {"01": 500}
    bad = persons.copy()
    bad.loc[7, "GEOID"] = "019999999999999"
    r = run_product_suite(topdown, {"persons": bad, "persons_source": "cef.csv"}, {"blocks": blocks}, cfg)
    assert r.error is not None and (r.error.file, r.error.row, r.error.column) == ("cef.csv", 9, "GEOID")
    bad = persons.copy()
    bad["H"] = np.where(np.arange(len(bad)) == 3, 5, bad["H"])
    r = run_product_suite(topdown, {"persons": bad, "persons_source": "cef.csv"}, {"blocks": blocks}, cfg)
    assert r.error is not None and (r.error.row, r.error.column) == (5, "H")
    assert ("topdown.persons", "H") in {(row.suite, row.column) for row in r.rows if not row.success}


PHSAFE_CASES = ["phsafe_duplicate_mafid", "phsafe_orphan_person_mafid", "phsafe_geo_mismatch", "phsafe_bad_fips",
                "phsafe_occupied_unit_without_race"]


@pytest.mark.parametrize("case", [None, *PHSAFE_CASES])
def test_phsafe_facts_replicate_check_cross_file(tmp_path: Path, case: str | None) -> None:
    """The PHSafe fact rules are a rule-for-rule replica of the product's ``check_cross_file`` (which then runs
    only to word a failure): on the valid base and on every cross-file corpus case, the first failing fact is
    exactly the (file, row, column) the product's check names, and no fact fails where it passes."""
    from dasflow.errors import InputError
    from dasflow.products.phsafe.inputs import Inputs, check_cross_file
    from tests.validation.helpers import _config_text

    store = corpus_store(tmp_path / "store", case)
    a = get_plugin("phsafe")
    cfg = a.load_config(_config_text(CONFIG_FILES["phsafe"]), "US")
    conf, pub = a.confidential_inputs(store, INPUTS, cfg), a.public_inputs(store, INPUTS, cfg)
    facts = a.input_checks(conf, pub, cfg).facts
    failing = [f for f in facts if int(str(f["violations"]))]
    files = {"persons": "persons.csv", "units": "units.csv", "geo": "geo.csv"}
    try:
        check_cross_file(Inputs(conf["persons"], conf["units"], pub["geo"], files), cfg.state_filter)
    except InputError as exc:
        assert failing, f"{case}: product rejects ({exc}) but no fact failed"
        first = failing[0]
        assert (first["file"], first["first_row"], first["column"]) == (exc.file, exc.row, exc.column)
    else:
        assert not failing, f"{case}: facts {failing} fail where the product's check passes"
